"""The verdict rule, branch by branch, on constructed data (mgpu_lib.book.verdict)."""
import math
from types import SimpleNamespace

import pytest

from mgpu_lib.book.verdict import APART, Z, by_seed, compare, decide, paired, unpaired

NAMES = ("A", "B")


def test_a_ahead_when_every_seed_agrees_and_the_mean_clears_two_se():
    v = paired({0: 0.80, 1: 0.82, 2: 0.81}, {0: 0.70, 1: 0.71, 2: 0.72}, NAMES, scale=100)
    assert v.words == "A ahead" and v.winner == "A"
    assert v.n == 3 and v.paired
    assert v.mean == pytest.approx(10.0)
    assert abs(v.mean) > Z * v.se


def test_b_ahead_is_the_mirror_image():
    v = paired({0: 0.70, 1: 0.71, 2: 0.72}, {0: 0.80, 1: 0.82, 2: 0.81}, NAMES, scale=100)
    assert v.words == "B ahead" and v.winner == "B"
    assert v.mean == pytest.approx(-10.0)


def test_the_issue_warmup_differences_cannot_be_told_apart():
    # issue 20 item 5: paired differences +0.11, +0.39, -0.10 (t about 1)
    v = paired({0: 0.11, 1: 0.39, 2: -0.10}, {0: 0.0, 1: 0.0, 2: 0.0}, NAMES)
    assert v.words == APART and v.winner is None
    assert abs(v.mean) <= Z * v.se


def test_the_boundary_two_se_exactly_is_not_enough():
    assert decide(2.0, 1.0, NAMES, n=5) == APART
    assert decide(2.0001, 1.0, NAMES, n=5) == "A ahead"
    assert decide(-2.0001, 1.0, NAMES, n=5) == "B ahead"


def test_one_seed_never_decides_however_large_the_gap():
    v = paired({0: 0.9}, {0: 0.1}, NAMES)
    assert v.words == f"one seed: {APART}" and v.n == 1
    assert math.isnan(v.se)
    assert "no standard error" in str(v)


def test_no_shared_seed_says_so():
    assert paired({0: 0.9}, {1: 0.1}, NAMES).words == f"no seeds: {APART}"


def test_pairs_only_the_seeds_both_sides_hold():
    v = paired({0: 1.0, 1: 2.0, 2: 3.0}, {1: 1.0, 2: 2.0}, NAMES)
    assert v.n == 2 and v.mean == pytest.approx(1.0) and v.se == 0.0
    assert v.words == "A ahead"


def test_pairing_removes_the_shared_seed_term():
    # each seed moves both sides alike: unpaired cannot tell, paired can
    a = {s: base + 0.01 for s, base in enumerate([0.60, 0.80, 0.70, 0.90])}
    b = {s: base for s, base in enumerate([0.60, 0.80, 0.70, 0.90])}
    b[3] += 0.001
    assert paired(a, b, NAMES).words == "A ahead"
    assert unpaired(list(a.values()), list(b.values()), NAMES).words == APART


def test_unpaired_uses_welch_standard_error():
    v = unpaired([1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0], NAMES)
    assert not v.paired and v.n == 3
    assert v.se == pytest.approx(math.sqrt(1.0 / 3))
    assert v.words == "A ahead"    # 2.0 > 2 * 0.577


def test_compare_pairs_when_the_seeds_match_and_not_otherwise():
    assert compare({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5}, NAMES).paired
    assert not compare({0: 1.0, 1: 2.0}, {2: 0.0, 3: 0.5}, NAMES).paired


def test_lower_is_better_turns_the_faster_side_into_the_one_ahead():
    fast = {0: 1.0, 1: 1.1, 2: 0.9}
    slow = {0: 2.0, 1: 2.1, 2: 1.9}
    v = paired(fast, slow, ("fast", "slow"), lower_is_better=True)
    assert v.words == "fast ahead" and v.mean < 0


def test_words_and_text_name_both_sides_the_numbers_and_the_unit():
    v = paired({0: 0.80, 1: 0.82}, {0: 0.70, 1: 0.71}, ("batch 256", "batch 512"),
               scale=100, unit="points")
    text = str(v)
    assert text.startswith("batch 256 ahead: +10.50 ± 0.50 points")
    assert "batch 256 minus batch 512, 2 seeds, paired" in text


def test_non_finite_values_are_refused():
    with pytest.raises(ValueError):
        paired({0: float("nan"), 1: 0.1}, {0: 0.2, 1: 0.1}, NAMES)


def test_by_seed_keeps_finished_records_only():
    recs = [SimpleNamespace(seed=0, status="ok", final_test_acc=0.8),
            SimpleNamespace(seed=1, status="diverged", final_test_acc=0.1)]
    assert by_seed(recs) == {0: 0.8}


def test_glue_stores_plain_python_values_and_verdict_sentences(monkeypatch):
    import numpy as np
    from mgpu_lib.book import verdict
    stored = {}
    monkeypatch.setattr(verdict, "_myst_glue",
                        lambda name, value, display: stored.update({name: (value, display)}))
    v = paired({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5}, NAMES)
    verdict.glue("v", v)
    verdict.glue("x", np.float64(0.25))
    assert stored["v"] == (str(v), False)
    assert stored["x"] == (0.25, False) and type(stored["x"][0]) is float


def test_glue_without_myst_nb_does_nothing(monkeypatch):
    from mgpu_lib.book import verdict
    monkeypatch.setattr(verdict, "_myst_glue", None)
    verdict.glue("x", 1.0)


def test_a_side_without_a_finished_seed_says_so_and_shows_no_nan():
    v = paired({}, {0: 0.8, 1: 0.82}, ("lr 50", "lr 0.1"), scale=100, unit="points")
    assert v.winner is None and v.n == 0
    assert "lr 50: no finished seed" in str(v) and "nan" not in str(v).lower()
    u = unpaired([0.8, 0.81], [], ("A", "B"))
    assert "B: no finished seed" in str(u) and "nan" not in str(u).lower()
