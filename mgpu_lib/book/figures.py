"""Schematic figures (no measurements): a ring all-reduce step by step. (The DataParallel step
is drawn on its own page, chapters/03_dataparallel.)"""
from __future__ import annotations

from ..perf.scaling import ring_allreduce_steps


def draw_ring_allreduce(n: int = 4, *, title: str = ""):
    """Each panel is one step of a ring all-reduce over `n` ranks (rows) and `n` gradient
    chunks (columns); a cell says how many ranks' gradients that copy of the chunk sums, and
    the cells that just arrived are outlined. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    steps = ring_allreduce_steps(n)
    cols = (len(steps) + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(1.7 * cols + 0.6, 4.6))
    previous = steps[0][1]
    for ax, (label, counts) in zip(axes.flat, steps):
        ax.imshow(counts, cmap="Blues", vmin=0, vmax=n + 1)
        for r in range(n):
            for c in range(n):
                ax.text(c, r, counts[r][c], ha="center", va="center", fontsize=10,
                        color="white" if counts[r][c] == n else "black")
                if counts[r][c] != previous[r][c]:
                    ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=2,
                                           ec="C3"))
        previous = counts
        ax.grid(False)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=8)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=8)
        ax.tick_params(length=0, labelleft=ax in axes[:, 0])
        ax.set_title(label.replace(" ", "\n", 1), fontsize=9)
    for ax in axes.flat[len(steps):]:
        ax.axis("off")
    fig.suptitle(title or f"Ring all-reduce over {n} ranks (red: just received)", fontsize=10)
    fig.tight_layout()
    return fig
