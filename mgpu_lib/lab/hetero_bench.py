"""Exercise 2's measurements around `hetero.HeteroDataParallel`: each device's speed, what the
sync costs, each split of a batch timed beside its prediction
(`perf.split_time.predict_hetero_step`).

On a machine without a GPU, `default_setup()` stands two CPU replicas in for two devices: each
gets half the cores, and the second idles after its real work as long as a device `slowdown`
times slower would still be computing. Everything it measures is labelled SIMULATED.
"""
from __future__ import annotations

import contextlib
import copy
import os
import statistics
from dataclasses import dataclass
from itertools import repeat
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..devices import describe_devices, num_gpus, timed
from ..hetero import HeteroDataParallel, forward_backward
from ..perf.split_time import predict_hetero_step
from .bench import images_per_second
from .files import cpu_name


def measure_throughput(net: nn.Module, device, batch_size: int, *, steps: int = 5,
                       warmup: int = 2, slowdown: float = 1.0) -> float:
    """Images per second for forward plus backward on `device`, after `warmup` steps; on a
    copy, so `net` (its weights and BatchNorm statistics) is left untouched."""
    net = copy.deepcopy(net).to(device).train()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch_size, 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (batch_size,), generator=g).to(device)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        net.zero_grad(set_to_none=True)
        forward_backward(net, x, y, loss_fn, slowdown=slowdown)

    for _ in range(warmup):
        step(x, y)
    return images_per_second(repeat((x, y)), steps, device, step)


@contextlib.contextmanager
def torch_threads(n: Optional[int]):
    """Run the body with `n` intra-op CPU threads (None: leave as is), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class HeteroSetup:
    """Which devices to pair, how to label them, and (when SIMULATED) how to fake a slow one."""
    devices: tuple[str, ...]
    names: tuple[str, ...]
    slowdowns: tuple[float, ...]
    threads: Optional[int]     # CPU threads while it runs (None: unchanged)
    simulated: bool
    label: str                 # printed beside every figure


def default_setup(slowdown: float = 3.0) -> HeteroSetup:
    """`cuda:0` + `cpu` where a GPU exists; else two SIMULATED CPU replicas, one throttled."""
    if num_gpus():
        return HeteroSetup(("cuda:0", "cpu"), ("GPU", "CPU"), (1.0, 1.0), None, False,
                           describe_devices(["cuda:0", "cpu"]))
    half = max(1, (os.cpu_count() or 2) // 2)
    label = (f"SIMULATED: 2 replicas on {cpu_name()}, {half} thread(s) each; "
             f"replica B throttled {slowdown:g}x")
    return HeteroSetup(("cpu", "cpu"), ("A (fast, SIMULATED)", "B (slow, SIMULATED)"),
                       (1.0, float(slowdown)), half, True, label)


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
    for r in hdp.replicas:
        for p in r.parameters():
            p.grad = torch.ones_like(p)

    def sync():
        hdp.reduce_grads(list(range(len(hdp.devices))))
        hdp.broadcast()

    seconds = median_seconds(sync, hdp.devices, steps)
    for r in hdp.replicas:
        r.zero_grad(set_to_none=True)
    return seconds


def split_curve(hdp: HeteroDataParallel, x, y, optimizer, loss_fn, speeds: Sequence[float],
                sync_s: float, shares: Sequence[int], *, steps: int = 3) -> list[dict]:
    """One row per share of the batch `x` given to the second device: seconds per step predicted
    (`predict_hetero_step`) and measured (the median of `steps` steps after a warm-up)."""
    b = len(x)
    return [dict(share=k, predicted_s=predict_hetero_step(speeds, [b - k, k], sync_s),
                 measured_s=median_seconds(lambda: hdp.step(x, y, optimizer, loss_fn,
                                                            [b - k, k]), hdp.devices, steps))
            for k in shares]


