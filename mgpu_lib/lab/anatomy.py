"""What `nn.DataParallel` does inside one step, taken apart and measured.

`DataParallel.forward` is scatter, replicate, parallel_apply and gather; backward then sums the
replicas' gradients into device 0's parameters. Timing the pieces needs CUDA devices.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn.parallel import gather, parallel_apply, replicate, scatter

from ..devices import timed


PHASES = ("scatter", "replicate", "forward", "gather", "backward + reduce")


def dp_breakdown(net: nn.Module, devices: Sequence[torch.device], batch_size: int,
                 steps: int = 5) -> dict[str, float]:
    """Mean seconds per step of each DataParallel phase, for `net` already on `devices[0]`
    (CUDA devices: on the CPU DataParallel is a pass-through, with no phases to time)."""
    devices = [torch.device(d) for d in devices]
    x = torch.randn(batch_size, 1, 28, 28, device=devices[0])
    y = torch.randint(0, 10, (batch_size,), device=devices[0])
    totals: dict[str, float] = {}
    for step in range(steps + 1):                     # step 0 warms up, and is not counted
        clocks = [timed(devices) for _ in PHASES]
        with clocks[0]:
            shards = scatter(x, devices)
        with clocks[1]:
            replicas = replicate(net, devices)
        with clocks[2]:
            outs = parallel_apply(replicas, [(s,) for s in shards], devices=devices)
        with clocks[3]:
            out = gather(outs, devices[0])
        with clocks[4]:
            nn.functional.cross_entropy(out, y).backward()
        net.zero_grad(set_to_none=True)
        if step:
            for phase, clock in zip(PHASES, clocks):
                totals[phase] = totals.get(phase, 0.0) + clock.seconds / steps
    return totals


