"""Schematic figures (no measurements): what nn.DataParallel does in one training step, a
ring all-reduce step by step, and a CPU+GPU split as a timeline."""
from __future__ import annotations

import textwrap
from typing import Sequence

from ..perf.scaling import ring_allreduce_steps

PHASES = [
    ("scatter\ninputs", "split the batch,\ncopy shards"),
    ("replicate\nmodel", "copy weights\nevery step"),
    ("forward", "one thread\nper device"),
    ("gather\noutputs", "copy outputs\nto GPU 0"),
    ("loss", "GPU 0 only"),
    ("backward", "grads flow back\nto replicas"),
    ("reduce\ngradients", "sum into\nGPU 0"),
    ("optimizer\nstep", "GPU 0 only"),
]


def draw_dataparallel_step(n_devices: int = 4, ax=None):
    """One DataParallel step as a grid: phases left to right, devices top to bottom.

    Work that happens only on device 0 is drawn on its row alone; arrows mark copies to and from
    device 0. Returns the matplotlib axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 1.6 + 0.8 * n_devices))
    only_dev0 = {"loss", "optimizer\nstep"}
    copies = {"scatter\ninputs", "replicate\nmodel", "gather\noutputs", "reduce\ngradients"}
    colors = {"copy": "#f4a261", "compute": "#2a9d8f", "dev0": "#e76f51"}
    for col, (phase, note) in enumerate(PHASES):
        ax.text(col + 0.5, n_devices + 0.35, phase, ha="center", va="bottom", fontsize=9,
                weight="bold")
        ax.text(col + 0.5, -0.25, note, ha="center", va="top", fontsize=8, color="0.3")
        for dev in range(n_devices):
            row = n_devices - 1 - dev
            if phase in only_dev0 and dev > 0:
                continue
            kind = "dev0" if phase in only_dev0 else "copy" if phase in copies else "compute"
            ax.add_patch(FancyBboxPatch((col + 0.1, row + 0.15), 0.8, 0.7,
                                        boxstyle="round,pad=0.02", color=colors[kind], alpha=0.85))
            if phase in copies and dev > 0:
                towards_dev0 = phase in {"gather\noutputs", "reduce\ngradients"}
                start, end = (row + 0.5, n_devices - 0.5)
                if towards_dev0:
                    start, end = end, start
                ax.add_patch(FancyArrowPatch((col + 0.2, end), (col + 0.2, start),
                                             arrowstyle="-|>", mutation_scale=8, color="0.2",
                                             lw=0.8))
    for dev in range(n_devices):
        ax.text(-0.1, n_devices - 1 - dev + 0.5, f"GPU {dev}", ha="right", va="center",
                fontsize=9)
    ax.set_xlim(-0.9, len(PHASES))
    ax.set_ylim(-1.1, n_devices + 0.9)
    ax.axis("off")
    ax.set_title("nn.DataParallel, one training step\norange: copies through GPU 0; green: "
                 "parallel compute; red: GPU 0 alone", fontsize=10)
    return ax


def draw_split(speeds: Sequence[float], splits: dict, sync_s: float, *,
               names: Sequence[str], title: str = ""):
    """A timeline per split: each device's shard as a bar (its length is samples / speed),
    then the sync. Idle time is the gap before the sync. Returns the figure."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(splits), 1, figsize=(6.5, 1.3 + 1.1 * len(splits)),
                             sharex=True, squeeze=False)
    for ax, (label, sizes) in zip(axes[:, 0], splits.items()):
        ends = [n / s if n else 0.0 for n, s in zip(sizes, speeds)]
        busy = sum(n > 0 for n in sizes)
        end = max(ends)
        for k, (n, t) in enumerate(zip(sizes, ends)):
            ax.barh(k, 1e3 * t, color=f"C{k}")
            ax.text(1e3 * t, k, f" {n} samples", va="center", fontsize=8)
            if busy > 1:
                ax.barh(k, 1e3 * sync_s, left=1e3 * end, color="gray", hatch="//", alpha=0.5)
        ax.set_yticks(range(len(sizes)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{label}: {1e3 * (end + (sync_s if busy > 1 else 0)):.1f} ms per step",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms per step: bar = compute, gray hatched = sync")
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 70)), fontsize=9)
    fig.tight_layout()
    return fig


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
