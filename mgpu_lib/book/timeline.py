"""Figures of a traced DDP run: the timeline of each rank, the overlap that was measured beside
the one the step-time model assumes, and one bucket against several.

They draw from stored events (`events.TraceRun`, e.g. `events.load_events(path)`), never from a
model or a process group, so a page can redraw a recorded run anywhere.
"""
from __future__ import annotations

from typing import Optional

from ..lab.events import RankTrace, TraceRun, backward_spans, overlap_rows
from ..perf.scaling import Overheads
from .style import legend_below, title as set_title

COLORS = {"forward": "0.75", "backward": "C0", "allreduce": "C1", "broadcast": "C4",
          "optimizer": "C2", "dataparallel": "C3", "reduce": "C1"}
LABELS = {"forward": "forward", "backward": "backward ops", "allreduce": "all-reduce (a bucket)",
          "broadcast": "broadcast (BatchNorm buffers)", "optimizer": "optimizer step",
          "dataparallel": "scatter / replicate / apply / gather", "reduce": "reduce (gradients)"}
COMM = ("allreduce", "broadcast", "reduce")     # drawn on a lane below the rank's compute


def _lanes(ax, trace: RankTrace, step: int, y: float, seen: set) -> None:
    """Two lanes for one rank: computation at `y`, communication just below it; times from
    the rank's first event in `step` (events count from the rank's first recorded step)."""
    t0 = min((e.start for kind in COLORS for e in trace.of(kind, step)), default=0.0)
    for kind in COLORS:
        bars = [((e.start - t0) * 1e3, e.duration * 1e3) for e in trace.of(kind, step)]
        if not bars:
            continue
        lane = y - 0.45 if kind in COMM else y
        ax.broken_barh(bars, (lane - 0.18, 0.36), facecolors=COLORS[kind], edgecolor="white",
                       linewidth=0.3, label=None if kind in seen else LABELS[kind])
        seen.add(kind)
    spans = backward_spans(trace, step)
    if spans:        # where the last backward op ends: an all-reduce left of it overlapped
        ax.plot([spans[-1][1] * 1e3] * 2, [y + 0.3, y - 0.7], color="k", linestyle="--",
                linewidth=0.9, label=None if "end" in seen else "last backward op ends")
        seen.add("end")


def draw_timeline(run: TraceRun, variant: str, *, step: int = 0, ax=None, title: str = ""):
    """One recorded step of `variant`, each rank on two lanes (compute, communication)."""
    import matplotlib.pyplot as plt
    ranks = [r for r in run.ranks if r.variant == variant]
    if not ranks:
        raise ValueError(f"no variant {variant!r} in this run; it has {run.variants}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 0.6 + 0.9 * len(ranks)))
    seen: set = set()
    for i, trace in enumerate(ranks):
        _lanes(ax, trace, step, -i * 1.2, seen)
    ax.set_yticks([-i * 1.2 + d for i in range(len(ranks)) for d in (0, -0.45)])
    ax.set_yticklabels([f"rank {r.rank} {lane}" for r in ranks for lane in ("compute", "comm")])
    ax.set_xlabel("ms since the step began")
    ax.grid(axis="y", visible=False)
    set_title(ax, title or variant)
    return ax


def draw_timelines(run: TraceRun, *, step: int = 0):
    """Every variant's timeline, one panel each, on one time axis: the bucket comparison."""
    import matplotlib.pyplot as plt
    n = len(run.variants)
    fig, axes = plt.subplots(n, 1, figsize=(6.0, 0.4 + (0.6 + 0.9 * run.nprocs) * n),
                             sharex=True, squeeze=False)
    for ax, variant in zip(axes[:, 0], run.variants):
        draw_timeline(run, variant, step=step, ax=ax)
        ax.set_xlabel("")
    axes[-1, 0].set_xlabel("ms since the step began")
    handles = {}
    for ax in axes[:, 0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    legend_below(axes[-1, 0], list(handles.values()), list(handles), ncol=3)
    fig.tight_layout()
    return fig


def draw_overlap(run: TraceRun, *, overlap: Optional[float] = None, ax=None,
                 title: str = ""):
    """Share of the all-reduce time hidden behind backward: measured, and as the step-time
    model assumes it (it hides up to `overlap` x the backward time)."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6.0, 3.0))
    overlap = Overheads().overlap if overlap is None else overlap
    rows = overlap_rows(run, overlap)
    ys = range(len(rows))
    measured = ax.barh([y - 0.2 for y in ys], [r[6] for r in rows], height=0.38, color="C1",
                       label="measured in the trace")
    model = ax.barh([y + 0.2 for y in ys], [r[7] for r in rows], height=0.38, color="0.6",
                    label=f"step-time model ({overlap:g} x backward can hide it)")
    for bars in (measured, model):      # a 0% bar is invisible; its label is not
        ax.bar_label(bars, fmt="%d%%", padding=2, fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 112)
    ax.set_xlabel("% of all-reduce time hidden behind backward")
    legend_below(ax, ncol=1)
    set_title(ax, title)
    return ax

