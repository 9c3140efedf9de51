"""Plots: a live training plot for notebooks, and figures for sweeps and scaling results.

Plots read results (`TrainResult`, records); nothing is ever read back out of a plot. They all
use the book's style (`style.py`): legends below the data, whole-number ticks for epochs and
devices, short titles that say what is plotted (hardware and profile go into the caption, once).
"""
from __future__ import annotations

import textwrap
from typing import Optional, Sequence

from .store import mean_std_se, summarize
from .style import integer_ticks, legend_below, mark_synthetic, title as set_title


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class LivePlot:
    """Test accuracy per epoch, redrawn in place in a notebook (D2L's Animator, minus its state).

    Pass its `update` as `train(..., on_epoch=...)`. Outside a notebook it does nothing.
    """

    def __init__(self, title: Optional[str] = None):
        self.title = title
        self.enabled = _in_notebook()
        self.handle = None
        self.fig = None

    def update(self, result) -> None:
        if not self.enabled:
            return
        import matplotlib.pyplot as plt
        from IPython.display import display
        if self.fig is None:
            self.fig, self.ax = plt.subplots(figsize=(5, 3.2))
            plt.close(self.fig)   # we display it ourselves; keep pyplot from showing it twice
        ax = self.ax
        ax.clear()
        epochs = range(1, len(result.test_acc) + 1)
        ax.plot(epochs, result.test_acc, "o-", label="test acc")
        ax.plot(epochs, result.train_acc, "s--", alpha=0.6, label="train acc")
        ax.set_xlim(0.8, result.config["num_epochs"] + 0.2)
        integer_ticks(ax.xaxis)
        ax.set_xlabel("epoch")
        ax.set_ylabel("accuracy")
        legend_below(ax)
        set_title(ax, self.title or f"profile {result.config['profile']}, "
                                    f"{result.num_devices} device(s)")
        mark_synthetic(ax, [result])
        self.fig.tight_layout()
        if self.handle is None:
            self.handle = display(self.fig, display_id=True)
        else:
            self.handle.update(self.fig)


def plot_curves(results: Sequence, labels: Sequence[str], *, metric: str = "test_acc",
                title: str = "", ax=None):
    """One line per result: `metric` per epoch. Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    for r, label in zip(results, labels):
        values = getattr(r, metric)
        ax.plot(range(1, len(values) + 1), values, "o-", label=label)
    integer_ticks(ax.xaxis)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric.replace("_", " "))
    legend_below(ax)
    set_title(ax, title)
    mark_synthetic(ax, results)
    return ax


def plot_mean_std(xs: Sequence, groups: Sequence[Sequence[float]], *, label: str,
                  ax=None, fmt: str = "o-", color: Optional[str] = None):
    """Mean and sample standard deviation of each group of values, as points with error bars."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    means, stds, _ = zip(*(mean_std_se(g) for g in groups))
    ax.errorbar(xs, means, yerr=_clipped(means, stds), fmt=fmt, capsize=4, label=label,
                color=color)
    integer_ticks(ax.xaxis)
    return ax


def _clipped(means: Sequence[float], stds: Sequence[float], lo: float = 0.0, hi: float = 1.0):
    """Error bars of mean +- std that stay inside [lo, hi] (an accuracy is never below 0)."""
    stds = [0.0 if s != s else s for s in stds]            # nan (one seed): no bar
    return [[min(s, m - lo) for m, s in zip(means, stds)],
            [min(s, hi - m) for m, s in zip(means, stds)]]


def plot_split_curve(counts: Sequence[int], predicted: Sequence[float],
                     measured: Sequence[float], best: int, *, total: int, name: str = "CPU",
                     title: str = "", ax=None):
    """Predicted and measured seconds per step against the slower device's share of the batch,
    with the predicted optimum marked. Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    share = [100 * c / total for c in counts]
    ax.plot(share, [1e3 * t for t in predicted], "-", label="predicted: slowest shard + sync")
    ax.plot(share, [1e3 * t for t in measured], "o", label="measured")
    ax.axvline(100 * best / total, color="gray", ls="--",
               label=f"predicted optimum: {best} of {total}")
    ax.set_xlabel(f"{name}'s share of the batch (%)")
    ax.set_ylabel("ms per step")
    ax.set_ylim(bottom=0)
    legend_below(ax, ncol=1)
    set_title(ax, title)
    return ax


def plot_pipelines(results: Sequence, compute_ips: float, *, title: str = "", ax=None):
    """Images/s each input pipeline delivers alone and while feeding training, against the
    compute-only rate. Returns the axes."""
    import numpy as np
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    y = np.arange(len(results))
    ax.barh(y - 0.2, [r.load_ips for r in results], 0.4, label="input pipeline alone")
    ax.barh(y + 0.2, [r.train_ips for r in results], 0.4, label="training fed by it")
    ax.axvline(compute_ips, color="k", ls="--", label="training on one fixed batch")
    ax.set_yticks(y, [r.name.replace(" + ", "\n+ ") for r in results], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("images per second (log scale)")
    legend_below(ax, ncol=1)
    set_title(ax, title)
    return ax


# --- Sweeps (Exercise 1): accuracy and time on twin axes, mean +- std over seeds -------------

def plot_sweep(records: Sequence, x: str, *, ax=None, title: str = "", logx: Optional[bool] = None):
    """Final test accuracy (left axis) and seconds per epoch (right axis) against `x`, each as
    mean +- sample std over seeds. Diverged seeds are marked with a red x at the bottom.
    Returns (ax, twin_ax)."""
    import matplotlib.pyplot as plt
    rows = summarize(records, x)
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    xs = [r["x"] for r in rows]
    ok = [r for r in rows if r["ok"]]
    means = [r["acc_mean"] for r in ok]
    ax.errorbar([r["x"] for r in ok], means, yerr=_clipped(means, [r["acc_std"] for r in ok]),
                fmt="o-", capsize=4, color="C0", label="test acc")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel("final test accuracy", color="C0")
    twin = ax.twinx()
    twin.errorbar([r["x"] for r in ok], [r["sec_mean"] for r in ok],
                  yerr=[r["sec_std"] for r in ok], fmt="s--", capsize=4, color="C1",
                  label="sec/epoch")
    twin.set_ylabel("seconds per epoch", color="C1")
    for i, r in enumerate(r for r in rows if r["diverged"]):
        # a band across the plot, labelled, so it cannot be read as a value on either axis
        ax.axvline(r["x"], color="red", ls=":", lw=1.5, label="diverged seeds" if i == 0 else None)
        ax.annotate(f"{r['diverged']} of {r['n']}\ndiverged", (r["x"], 0.5),
                    xycoords=("data", "axes fraction"), ha="right", va="center",
                    fontsize=8, color="red", xytext=(-3, 0), textcoords="offset points")
    if logx if logx is not None else (min(xs) > 0 and max(xs) / min(xs) > 8):
        ax.set_xscale("log")
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.minorticks_off()
    twin.grid(False)
    twin.spines["right"].set_visible(True)
    lines = ax.get_legend_handles_labels()
    lines2 = twin.get_legend_handles_labels()
    legend_below(ax, lines[0] + lines2[0], lines[1] + lines2[1], ncol=3)
    set_title(ax, title)
    mark_synthetic(ax, records)
    return ax, twin


def plot_learning_curves(records: Sequence, x: str, *, metric: str = "test_acc", ax=None,
                         title: str = ""):
    """One curve per value of `x`: `metric` per epoch, mean over seeds with a +-std band."""
    import numpy as np
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.4))
    groups: dict = {}
    for r in records:
        if r.status == "ok":
            groups.setdefault(r.get(x), []).append(r.metrics[metric])
    for value in sorted(groups):
        k = min(len(c) for c in groups[value])
        arr = np.array([c[:k] for c in groups[value]])
        mean, std = arr.mean(axis=0), arr.std(axis=0, ddof=1) if len(arr) > 1 else 0 * arr[0]
        epochs = np.arange(1, k + 1)
        ax.plot(epochs, mean, "o-", ms=3, label=f"{x.replace('_', ' ')} {value:g}")
        ax.fill_between(epochs, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), alpha=0.2)
    integer_ticks(ax.xaxis)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric.replace("_", " "))
    legend_below(ax, ncol=3)
    set_title(ax, title)
    mark_synthetic(ax, records)
    return ax


# --- Scaling (Exercise 1): the step-time model's predictions --------------------------------

def plot_scaling(rows: Sequence[dict], *, title: str = "", axes=None):
    """Left: seconds per epoch against devices, DP and DDP. Right: scaling efficiency.
    `rows` come from `scaling.scaling_table`. Returns the two axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(7.5, 3.4))
    ns = [r["n"] for r in rows]
    for s, style in (("dp", "s--"), ("ddp", "o-")):
        axes[0].plot(ns, [r[f"{s}_s"] for r in rows], style, label=s.upper())
        axes[1].plot(ns, [r[f"{s}_eff"] for r in rows], style, label=s.upper())
    axes[0].set_ylabel("seconds per epoch (log)")
    axes[0].set_yscale("log")
    axes[0].yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # several labels, not one
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[0].yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    axes[1].set_ylabel("scaling efficiency")
    axes[1].set_ylim(0, 1.05)
    for ax in axes:
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("devices")
    legend_below(axes[1])
    if title:
        axes[0].figure.suptitle("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    axes[0].figure.tight_layout()
    return axes


def plot_step_breakdown(steps: dict, *, ax=None, title: str = ""):
    """Stacked bars of one step's parts: {label: scaling.StepTime}, in milliseconds."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    labels = list(steps)
    bottom = [0.0] * len(labels)
    for part, color in (("compute", "C0"), ("communication", "C3"), ("overhead", "C7")):
        ms = [getattr(steps[k], part) * 1e3 for k in labels]
        ax.bar(labels, ms, bottom=bottom, color=color, label=part)
        bottom = [b + m for b, m in zip(bottom, ms)]
    ax.set_ylabel("milliseconds per step")
    ax.tick_params(axis="x", labelsize=8)
    legend_below(ax, ncol=3)
    set_title(ax, title)
    return ax


# --- DDP (chapter 4): a ring all-reduce, step by step ------------------------------------------

def plot_seed_curves(records: Sequence, batch_size: int, lr: float, *, title: str = "",
                     ax=None):
    """Test accuracy per epoch of every seed stored for one (batch size, lr) point."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.2))
    chosen = [r for r in records if r.status == "ok" and not r.options
              and r.config["batch_size"] == batch_size and r.config["lr"] == lr]
    if not chosen:
        ax.text(0.5, 0.5, f"no stored run with batch {batch_size} and lr {lr:g}",
                ha="center", va="center", transform=ax.transAxes)
    for r in sorted(chosen, key=lambda r: r.seed):
        acc = r.metrics["test_acc"]
        ax.plot(range(1, len(acc) + 1), acc, "o-", ms=3, label=f"seed {r.seed}")
    integer_ticks(ax.xaxis)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    legend_below(ax, ncol=4)
    set_title(ax, title or f"batch {batch_size}, lr {lr:g}: one line per seed")
    mark_synthetic(ax, chosen)
    return ax


def sweep_explorer(records: Sequence, *, title: str = ""):
    """An ipywidgets explorer over `plot_seed_curves`: pick a batch size and an lr among the
    plain runs in `records` that finished."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    runs = [r for r in records if r.status == "ok" and not r.options]

    def show(batch_size, lr):
        plot_seed_curves(runs, batch_size, lr, title=title)
        plt.show()

    return widgets.interactive(show, batch_size=sorted({r.config["batch_size"] for r in runs}),
                               lr=sorted({r.config["lr"] for r in runs}))


def plot_throughput(labels: Sequence[str], images_per_second: Sequence[float],
                    train_flops_per_image: float, *, peak_tflops: Optional[float] = None,
                    title: str = "", ax=None):
    """Roofline-style bars: each loop's achieved TFLOP/s (images/s x FLOPs per trained image),
    against the device's peak where it is known. Labels carry the images/s."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, max(2.6, 0.6 + 0.8 * len(labels))))
    tflops = [ips * train_flops_per_image / 1e12 for ips in images_per_second]
    y = range(len(labels))
    ax.barh(y, tflops, color="tab:blue")
    ax.set_yticks(list(y), [f"{name}\n{ips:,.0f} images/s"
                            for name, ips in zip(labels, images_per_second)], fontsize=8)
    ax.set_ylim(len(labels) - 0.4, -0.6)  # first label on top, room for two-line labels
    if peak_tflops:
        ax.axvline(peak_tflops, color="tab:red", ls="--", label=f"peak {peak_tflops:g} TFLOP/s")
        legend_below(ax, ncol=1)
    else:
        ax.text(0.99, 0.02, "no datasheet peak known for this device", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="0.4")
    for i, t in enumerate(tflops):
        share = f" ({100 * t / peak_tflops:.1f}% of peak)" if peak_tflops else ""
        ax.text(t, i, f" {t:.3g}{share}", va="center", fontsize=8)
    ax.set_xlabel("achieved TFLOP/s (training)")
    ax.set_xlim(0, max(tflops + [peak_tflops or 0]) * 1.35)
    set_title(ax, title)
    ax.figure.tight_layout()
    return ax.figure


def plot_accuracy_pairs(records: Sequence, *, title: str = "", ax=None):
    """Final test accuracy of the reference and the fast loop for each recorded seed, joined by
    a line, with each loop's mean dashed. `records` are `accuracy.pairs` dicts."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    records = sorted(records, key=lambda r: r.get("seed", 0))
    seeds = [r.get("seed", i) for i, r in enumerate(records)]
    ref = [r["reference"]["test_acc"][-1] for r in records]
    fast = [r["fast"]["test_acc"][-1] for r in records]
    for s, a, b in zip(seeds, ref, fast):
        ax.plot([s - 0.15, s + 0.15], [a, b], color="0.6", lw=1)
    for xs, ys, name, color in ((-0.15, ref, "the chapter's loop", "tab:gray"),
                                (0.15, fast, "fast loop", "tab:blue")):
        ax.plot([s + xs for s in seeds], ys, "o", ms=4, color=color, label=name)
        ax.axhline(sum(ys) / len(ys), color=color, ls="--", lw=1)
    integer_ticks(ax.xaxis)
    ax.set_xlabel("seed (same initial weights and image order for both loops)")
    ax.set_ylabel("final test accuracy")
    legend_below(ax)
    set_title(ax, title)
    return ax.figure


def plot_accuracy_study(summary: Sequence[dict], *, title: str = ""):
    """One `plot_accuracy_pairs` panel per fast variant of `accuracy.summarize_accuracy`,
    stacked so each keeps the column's full width. Returns the figure."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(summary), 1, figsize=(6.5, 2.9 * len(summary)), sharex=True,
                             sharey=True, squeeze=False)
    for ax, s in zip(axes[:, 0], summary):
        plot_accuracy_pairs(s["records"], ax=ax, title=f"{s['fast']}: {s['seeds']} seeds")
        if ax is not axes[-1, 0]:
            ax.set_xlabel("")
            ax.get_legend().remove()
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 80)), fontsize=9)
    fig.tight_layout()
    return fig
