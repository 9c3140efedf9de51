"""A live training plot for notebooks, redrawn as each epoch ends, in the book's style."""
from __future__ import annotations

from typing import Optional

from .style import integer_ticks, legend_below, mark_synthetic, title as set_title


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None   # no shell, or a terminal: None


class LivePlot:
    """Test accuracy per epoch, redrawn in place in a notebook (D2L's Animator, minus its state).

    Pass its `update` as `train(..., on_epoch=...)`. Outside a notebook it does nothing.
    """

    def __init__(self, title: Optional[str] = None):
        self.title = title
        self.enabled = _in_notebook()
        self.handle = self.fig = None

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
