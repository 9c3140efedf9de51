"""One figure style for the whole book, set in one place: `book_style()` from every page's
setup cell, and helpers that keep every plot alike. Hardware and profile go into the caption,
never into a title."""
from __future__ import annotations

import textwrap
from typing import Optional, Sequence

# On a 400 px phone's 352 px column a 5-inch, 100 dpi figure shrinks to 0.704, so MIN_FONT_PT
# renders at 9.3 px, about the smallest a reader can read (tests/test_notebooks.py checks both).
WIDTH_IN, MIN_FONT_PT = 5.0, 9.5
RC = {
    "figure.figsize": (WIDTH_IN, 3.1), "figure.dpi": 100, "savefig.bbox": "tight",
    "font.size": 10.5, "axes.titlesize": 10.5, "axes.labelsize": 10.5,
    "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT,
    "legend.fontsize": MIN_FONT_PT, "legend.frameon": False,
    "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "axes.formatter.useoffset": False,
}
TITLE_CHARS = 60                      # wrap titles so they never run past the figure


def book_style() -> None:
    """Apply the book's rcParams; in a notebook, draw figures at twice the resolution."""
    import matplotlib as mpl
    mpl.rcParams.update(RC)
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        set_matplotlib_formats("retina")
    except ImportError:               # not in a notebook: nothing to set
        pass


def title(ax, text: str) -> None:
    """A title wrapped to a few short lines: what is plotted, not the hardware (the caption's)."""
    ax.set_title("\n".join(textwrap.wrap(text, TITLE_CHARS)))


def legend_below(ax, handles: Optional[Sequence] = None, labels: Optional[Sequence] = None,
                 ncol: int = 2) -> None:
    """A legend under the axes, off the data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol)


def integer_ticks(axis) -> None:
    """Ticks at whole numbers only (epochs, devices, seeds): no 1.5 epochs."""
    from matplotlib.ticker import MaxNLocator
    axis.set_major_locator(MaxNLocator(integer=True))


SYNTHETIC = "synthetic data: no Fashion-MNIST copy was found"


def synthetic(records: Sequence) -> bool:
    """Whether any run among `records` trained on synthetic data (they carry `data_source`)."""
    return any(getattr(r, "data_source", None) == "synthetic" for r in records)


def mark_synthetic(ax, records: Sequence) -> None:
    """Say on the figure itself when it was drawn from synthetic data, so no reader takes it
    for Fashion-MNIST (the smoke profile falls back to it where no copy is found)."""
    if synthetic(records):
        ax.text(0.5, 0.5, SYNTHETIC, transform=ax.transAxes, ha="center", va="center",
                color="tab:red", alpha=0.6, wrap=True)
