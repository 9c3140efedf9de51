"""The events of a profiler trace of DDP steps (`trace.trace_ddp` writes one per rank), and
what they measure: how much of the all-reduce time ran while backward was still computing.
"""
from __future__ import annotations

import json
import re
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Optional

from ..perf.scaling import Overheads

# What each event is, from its name in the trace (gloo's and NCCL's names for the collectives).
KIND_OF = [("allreduce", re.compile(r"^(gloo|nccl):all_reduce$")),
           ("broadcast", re.compile(r"^(gloo|nccl):broadcast$")),
           ("forward", re.compile(r"^forward$")),
           ("optimizer", re.compile(r"^optimizer$")),
           # DataParallel's phases (marked by `trace.trace_dataparallel`); its reduce is the
           # backward of the weights' broadcast (`ReduceAddCoalesced`)
           ("dataparallel", re.compile(r"^(scatter|replicate|parallel_apply|gather)$")),
           ("reduce", re.compile(r"evaluate_function: BroadcastBackward")),
           # a backward op; AccumulateGrad only stores a gradient (and fires DDP's hook)
           ("backward", re.compile(r"^autograd::engine::evaluate_function: (?!torch::autograd::"
                                   r"AccumulateGrad)"))]
STEP = re.compile(r"^ProfilerStep#\d+$")
HOST = ("forward", "optimizer", "dataparallel", "reduce")   # host-side even on a GPU


@dataclass(frozen=True)
class Event:
    """One bar on the timeline; times in seconds from the rank's first recorded step."""
    name: str
    kind: str            # forward, backward, allreduce, broadcast, optimizer
    start: float
    duration: float
    step: int            # recorded step, from 0
    micro: int = 0       # micro-batch within the step (gradient accumulation)

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class RankTrace:
    """One rank's recorded steps of one variant, and where its Chrome trace is."""
    variant: str
    rank: int
    events: list
    num_buckets: int
    bucket_cap_mb: Optional[float] = None
    accumulate: int = 1
    path: str = ""

    def of(self, kind: str, step: Optional[int] = None) -> list:
        return [e for e in self.events if e.kind == kind and step in (None, e.step)]

    @property
    def steps(self) -> int:
        return 1 + max((e.step for e in self.events), default=-1)


@dataclass
class TraceRun:
    """Every rank of every variant, with the run's hardware and settings."""
    hardware: str
    profile: str
    nprocs: int
    backend: str
    width: int
    batch_size: int
    seconds: float
    ranks: list = field(default_factory=list)

    def get(self, variant: str, rank: int = 0) -> RankTrace:
        return next(r for r in self.ranks if r.variant == variant and r.rank == rank)

    @property
    def variants(self) -> list:
        return list(dict.fromkeys(r.variant for r in self.ranks))

# ---- reading a trace ----------------------------------------------------------------------------

def _items(raw: list):
    """(when, kind, name, start, duration) of the events to keep: without a GPU every event the
    host ran (gloo: everything). On a GPU the host only launches work: backward ops are the
    kernels launched inside a `backward` mark, all-reduces NCCL's kernels; each belongs to the
    step that launched it."""
    gpu = any(e.get("cat") == "kernel" for e in raw)
    launched = {e["args"]["correlation"]: e["ts"] for e in raw
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    passes = [(e["ts"], e["ts"] + e["dur"]) for e in raw
              if e["name"] == "backward" and e.get("cat") == "user_annotation"]
    for e in raw:
        cat, when = e.get("cat"), launched.get(e.get("args", {}).get("correlation"), e["ts"])
        kind = None if cat == "gpu_user_annotation" else next(
            (k for k, pattern in KIND_OF if pattern.search(e["name"])), None)
        if gpu and cat == "kernel" and re.search(r"nccl.*AllReduce", e["name"], re.I):
            yield when, "allreduce", e["name"], e["ts"], e["dur"]
        elif gpu and cat == "kernel" and any(a <= when < b for a, b in passes):
            yield when, "backward", e["name"], e["ts"], e["dur"]
        elif kind and (not gpu or cat in ("user_annotation", "cpu_op") and kind in HOST):
            yield when, kind, e["name"].rsplit(": ", 1)[-1], e["ts"], e["dur"]


def read_trace(path, variant: str = "", rank: int = 0) -> RankTrace:
    """The `Event`s of a Chrome trace written by `trace_ddp` (or any profiler trace with
    `ProfilerStep#N` marks); the bucket count comes from its `otherData.mgpu` entry."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    raw = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw if STEP.match(e["name"])
                   and e.get("cat") != "gpu_user_annotation")     # the GPU's copy of the mark
    items = sorted(_items(raw), key=lambda i: i[0])
    forwards = [i[0] for i in items if i[1] == "forward"]
    t0, events = steps[0][0], []
    for when, kind, name, ts, dur in items:
        step = next((i for i, (a, b) in enumerate(steps) if a <= when < b), None)
        if step is not None:
            micro = max(0, sum(steps[step][0] <= f <= when for f in forwards) - 1)
            events.append(Event(name, kind, round((ts - t0) / 1e6, 7), round(dur / 1e6, 7),
                                step, micro))
    meta = doc.get("otherData", {}).get("mgpu", {})
    return RankTrace(meta.get("variant", variant), int(meta.get("rank", rank)), events,
                     int(meta.get("num_buckets", 0)), meta.get("bucket_cap_mb"),
                     int(meta.get("accumulate", 1)), str(path))


# ---- what the trace measured ----------------------------------------------------------------------

def backward_spans(trace: RankTrace, step: int) -> list:
    """(start, end) of each backward pass's computation in `step`: first op to last op."""
    spans = {}
    for e in trace.of("backward", step):
        a, b = spans.get(e.micro, (e.start, e.end))
        spans[e.micro] = (min(a, e.start), max(b, e.end))
    return [spans[m] for m in sorted(spans)]


@dataclass(frozen=True)
class Overlap:
    """Per step, averaged over the recorded steps of one rank."""
    backward_s: float        # the last backward pass's computation (the one that all-reduces)
    allreduce_s: float       # time all-reduces ran
    hidden_s: float          # ... of it while a backward pass was still computing
    allreduces: float        # all-reduces per step
    started_early: float     # ... that started before the step's last backward op ended

    @property
    def fraction(self) -> float:
        """Share of the all-reduce time hidden behind backward (measured)."""
        return self.hidden_s / self.allreduce_s if self.allreduce_s else 0.0

    def assumed_fraction(self, overlap: Optional[float] = None) -> float:
        """The same share as the step-time model puts it: it hides up to `overlap` x the
        backward time (default `scaling.Overheads.overlap`)."""
        overlap = Overheads().overlap if overlap is None else overlap
        return min(1.0, overlap * self.backward_s / self.allreduce_s) if self.allreduce_s else 0.0


def measure_overlap(trace: RankTrace) -> Overlap:
    """How much of each step's all-reduce time ran while backward was computing."""
    rows = []
    for step in range(trace.steps):
        spans = backward_spans(trace, step)
        comm = trace.of("allreduce", step)
        hidden = sum(max(0.0, min(e.end, b) - max(e.start, a)) for e in comm for a, b in spans)
        last = spans[-1] if spans else (0.0, 0.0)
        rows.append((last[1] - last[0], sum(e.duration for e in comm), hidden, len(comm),
                     sum(e.start < last[1] for e in comm)))
    return Overlap(*(sum(c) / len(rows) for c in zip(*rows))) if rows else Overlap(0, 0, 0, 0, 0)


def mean_overlap(run: TraceRun, variant: str) -> Overlap:
    """`measure_overlap` averaged over the ranks of one variant."""
    rows = [measure_overlap(r) for r in run.ranks if r.variant == variant]
    return Overlap(*(sum(c) / len(rows) for c in zip(*map(astuple, rows))))


def overlap_rows(run: TraceRun) -> list:
    """Per variant, means over ranks and steps: buckets, all-reduces per step, backward ms,
    all-reduce ms, hidden ms, measured share hidden (%), the model's share hidden (%)."""
    rows = []
    for variant in run.variants:
        o = mean_overlap(run, variant)
        buckets = max(r.num_buckets for r in run.ranks if r.variant == variant)
        rows.append((variant, buckets, round(o.allreduces, 1), round(o.backward_s * 1e3, 1),
                     round(o.allreduce_s * 1e3, 1), round(o.hidden_s * 1e3, 1),
                     round(100 * o.fraction), round(100 * o.assumed_fraction())))
    return rows
