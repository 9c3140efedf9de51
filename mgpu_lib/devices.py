"""Which devices exist, which ones a run uses, and how to name them beside a figure.

Nothing is resolved at import time: every function looks at the hardware when it is called.
"""
from __future__ import annotations

import os
import platform
from typing import Optional, Sequence

import torch


class DeviceError(ValueError):
    """More devices were asked for than this machine has."""


def num_gpus() -> int:
    """Number of visible CUDA GPUs (0 on a machine without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def try_gpu(i: int = 0) -> torch.device:
    """GPU `i` if it exists, else the CPU (as in D2L)."""
    if num_gpus() >= i + 1:
        return torch.device(f"cuda:{i}")
    if i == 0 and _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def try_all_gpus() -> list[torch.device]:
    """All GPUs, or `[mps]`, or `[cpu]`: never empty, unlike D2L's version."""
    n = num_gpus()
    if n:
        return [torch.device(f"cuda:{i}") for i in range(n)]
    if _mps_available():
        return [torch.device("mps")]
    return [torch.device("cpu")]


def resolve_devices(n: Optional[int] = None) -> list[torch.device]:
    """The first `n` accelerators (`None`: all of them; the CPU where there is none).

    Raises:
        DeviceError: `n` is below 1, or more GPUs are asked for than exist.
    """
    available = try_all_gpus()
    if n is None:
        return available
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise DeviceError(f"number of devices must be a positive integer, got {n!r}")
    if n > len(available):
        raise DeviceError(
            f"{n} devices requested but this machine has {_describe_available()}; "
            f"use --devices {len(available)} or fewer")
    return available[:n]


def _describe_available() -> str:
    n = num_gpus()
    if n:
        return f"{n} CUDA GPU{'s' if n > 1 else ''} ({torch.cuda.get_device_name(0)})"
    if _mps_available():
        return "1 Apple MPS device and no CUDA GPU"
    return "no GPU (only the CPU)"


def cpu_name() -> str:
    """The CPU's model name, read from /proc/cpuinfo where it exists."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_devices(devices: Optional[Sequence[torch.device]] = None) -> str:
    """A short hardware string printed beside every figure, e.g. '2 x NVIDIA H200' or
    'CPU: AMD EPYC 7B13, 2 threads (torch uses 2)'."""
    devices = list(devices) if devices is not None else try_all_gpus()
    cuda = [d for d in devices if torch.device(d).type == "cuda"]
    parts = []
    if cuda:
        names = [torch.cuda.get_device_name(torch.device(d)) for d in cuda]
        for name in dict.fromkeys(names):
            parts.append(f"{names.count(name)} x {name}")
    if any(torch.device(d).type == "mps" for d in devices):
        parts.append("Apple MPS")
    if any(torch.device(d).type == "cpu" for d in devices):
        parts.append(f"CPU: {cpu_name()}, {os.cpu_count()} threads "
                     f"(torch uses {torch.get_num_threads()})")
    return " + ".join(parts)


def parameter_devices(net: torch.nn.Module) -> list[str]:
    """The devices holding `net`'s parameters and buffers, e.g. ['cpu'] or ['cuda:0']."""
    tensors = list(net.parameters()) + list(net.buffers())
    return sorted({str(t.device) for t in tensors})
