"""Schematic figures (no measurements): what nn.DataParallel does in one training step."""
from __future__ import annotations

PHASES = [
    ("scatter\ninputs", "split the batch,\ncopy shards"),
    ("replicate\nmodel", "copy weights\nevery step"),
    ("forward", "one thread\nper device"),
    ("gather\noutputs", "copy outputs\nto GPU 0"),
    ("loss +\nbackward", "grads flow back\nto replicas"),
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
        _, ax = plt.subplots(figsize=(8.5, 1.6 + 0.8 * n_devices))
    only_dev0 = {"optimizer\nstep"}
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
