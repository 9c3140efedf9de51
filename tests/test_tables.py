"""mgpu_lib.book.tables: three significant figures, "diverged" for a point with no mean, constant
columns into the caption, and the caption after the table (the book numbers it from there)."""
import math

from mgpu_lib.book.tables import Table, fmt, mean_std


def test_three_significant_figures_and_counts():
    assert [fmt(v) for v in (1249.0, 935.2, 89.8, 100.0, 87.0, 0.81234, 0.05, 60000.0)] == \
        ["1,250", "935", "89.8", "100", "87", "0.812", "0.05", "60,000"]
    assert fmt(11175818) == "11,175,818" and fmt(True) == "True" and fmt("x") == "x"
    assert fmt(math.nan) == "n/a"


def test_mean_std_reads_diverged_not_nan():
    assert mean_std(math.nan, math.nan) == "diverged"
    assert mean_std(0.8123, 0.0513) == "0.812 ± 0.051"
    assert mean_std(3.41, math.nan) == "3.41"          # one seed: no spread to show
    assert mean_std(0.77, 0.05) == "0.770 ± 0.050"    # one precision down the column
    assert mean_std(50.0, 1.0) == "50.0 ± 1.0" and mean_std(1249.0, 3.0) == "1,250 ± 3"


def test_constant_column_moves_into_the_caption():
    t = Table(["lr", "acc", "device"], [(0.1, 0.8, "cpu"), (0.2, 0.7, "cpu")], caption="sweep")
    assert t.headers == ["lr", "acc"] and t.caption == "sweep; device: cpu"
    kept = Table(["lr", "device"], [(0.1, "cpu"), (0.2, "cpu")])  # never the only values left
    assert kept.headers == ["lr", "device"]
    assert Table(["a", "b"], [(1, 2), (3, 2)], keep_constant=True).headers == ["a", "b"]


def test_markdown_puts_the_caption_after_the_table_in_italics():
    md = Table(["lr", "acc"], [(0.1, 0.81234)], caption="final accuracy")._repr_markdown_()
    assert md.splitlines() == ["| lr | acc |", "|---|---|", "| 0.1 | 0.812 |", "",
                               "*final accuracy*"]


def test_a_table_from_synthetic_runs_says_so_in_its_caption():
    from types import SimpleNamespace
    from mgpu_lib.book.style import SYNTHETIC
    real, fake = SimpleNamespace(data_source="local"), SimpleNamespace(data_source="synthetic")
    assert SYNTHETIC not in Table(["a"], [[1]], caption="c", records=[real]).caption
    assert Table(["a"], [[1]], caption="c", records=[real, fake]).caption == f"c; {SYNTHETIC}"


def test_a_figure_from_synthetic_runs_says_so_on_the_axes():
    import matplotlib
    matplotlib.use("Agg")
    from types import SimpleNamespace
    import matplotlib.pyplot as plt
    from mgpu_lib.book.style import SYNTHETIC, mark_synthetic
    run = lambda src: SimpleNamespace(test_acc=[0.5, 0.6], data_source=src)

    def texts(runs):
        _, ax = plt.subplots()
        mark_synthetic(ax, runs)
        return [t.get_text() for t in ax.texts]
    assert SYNTHETIC not in texts([run("local")])
    assert SYNTHETIC in texts([run("local"), run("synthetic")])
    plt.close("all")
