"""Exercise 2's measurements around `hetero.HeteroDataParallel`: what the sync costs, and each
split of a batch timed beside its prediction (`perf.split_time.predict_hetero_step`)."""
from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch

from ..devices import timed
from ..hetero import HeteroDataParallel
from ..perf.split_time import predict_hetero_step


def median_seconds(fn: Callable[[], object], devices, steps: int) -> float:
    """Median seconds of `fn()` over `steps` timed calls, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(steps):
        with timed(devices) as t:
            fn()
        times.append(t.seconds)
    return statistics.median(times)


def measure_sync(hdp: HeteroDataParallel, *, steps: int = 5) -> float:
    """Seconds per step for the sync alone: gradients to the main device, weights back. The
    weights stay as they were (no optimizer step); every replica's gradients end cleared."""
    everyone = list(range(len(hdp.devices)))
    for r in hdp.replicas:
        for p in r.parameters():
            p.grad = torch.ones_like(p)

    def sync():
        hdp.reduce_grads(everyone)
        hdp.broadcast()

    seconds = median_seconds(sync, hdp.devices, steps)
    for r in hdp.replicas:
        r.zero_grad(set_to_none=True)
    return seconds


def split_curve(hdp: HeteroDataParallel, x, y, optimizer, loss_fn, speeds: Sequence[float],
                sync_s: float, shares: Sequence[int], *, steps: int = 3) -> list[dict]:
    """One row per share of the batch `x` given to the second device: seconds per step predicted
    (`perf.split_time.predict_hetero_step`) and measured (the median of `steps` steps after a warm-up)."""
    b = len(x)
    return [dict(share=k, predicted_s=predict_hetero_step(speeds, [b - k, k], sync_s),
                 measured_s=median_seconds(lambda: hdp.step(x, y, optimizer, loss_fn,
                                                            [b - k, k]), hdp.devices, steps))
            for k in shares]
