"""Plots: a live training plot for notebooks, and figures for sweeps and scaling results.

Plots read results (`TrainResult`, records); nothing is ever read back out of a plot.
"""
from __future__ import annotations

from typing import Optional, Sequence


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class LivePlot:
    """Test accuracy per epoch, redrawn in place in a notebook (D2L's Animator, minus its state).

    Outside a notebook it does nothing. `close()` leaves the final figure in the cell output.
    """

    def __init__(self, num_epochs: int, title: str = "", ylabel: str = "test acc"):
        self.num_epochs, self.title, self.ylabel = num_epochs, title, ylabel
        self.enabled = _in_notebook()
        self.handle = None
        self.fig = None

    def update(self, result) -> None:
        if not self.enabled:
            return
        import matplotlib.pyplot as plt
        from IPython.display import display
        if self.fig is None:
            self.fig, self.ax = plt.subplots(figsize=(4.5, 3))
            plt.close(self.fig)   # we display it ourselves; keep pyplot from showing it twice
        ax = self.ax
        ax.clear()
        epochs = range(1, len(result.test_acc) + 1)
        ax.plot(epochs, result.test_acc, "o-", label="test acc")
        ax.plot(epochs, result.train_acc, "s--", alpha=0.6, label="train acc")
        ax.set_xlim(0.8, self.num_epochs + 0.2)
        ax.set_xlabel("epoch")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title(self.title, fontsize=8)
        self.fig.tight_layout()
        if self.handle is None:
            self.handle = display(self.fig, display_id=True)
        else:
            self.handle.update(self.fig)

    def close(self) -> None:
        self.fig = None


def plot_curves(results: Sequence, labels: Sequence[str], *, metric: str = "test_acc",
                title: str = "", ax=None):
    """One line per result: `metric` per epoch. Returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    for r, label in zip(results, labels):
        values = getattr(r, metric)
        ax.plot(range(1, len(values) + 1), values, "o-", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_mean_std(xs: Sequence, groups: Sequence[Sequence[float]], *, label: str,
                  ax=None, fmt: str = "o-", color: Optional[str] = None):
    """Mean and standard deviation of each group of values, as points with error bars."""
    import numpy as np
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.2))
    means = [float(np.mean(g)) for g in groups]
    stds = [float(np.std(g)) for g in groups]
    ax.errorbar(xs, means, yerr=stds, fmt=fmt, capsize=4, label=label, color=color)
    return ax
