"""Which devices exist, which ones a run uses, how to time them, and how to name them (each
function looks at the hardware when called, never at import)."""
from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence

import torch


class DeviceError(ValueError):
    """More devices were asked for than this machine has."""


def num_gpus() -> int:
    """Number of visible CUDA GPUs (0 on a machine without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def try_all_gpus() -> list[torch.device]:
    """All GPUs, or `[mps]`, or `[cpu]`: never empty (d2l-en 1.x's returns `[]` without a GPU,
    whatever its docstring says)."""
    if n := num_gpus():
        return [torch.device(f"cuda:{i}") for i in range(n)]
    return [torch.device("mps" if _mps_available() else "cpu")]


def try_gpu(i: int = 0) -> torch.device:
    """GPU `i` if it exists, else the CPU (as in D2L; an Apple GPU counts as GPU 0)."""
    available = try_all_gpus()
    return available[i] if i < len(available) else torch.device("cpu")


def _mps_available() -> bool:
    return torch.backends.mps.is_available()


def resolve_devices(n: Optional[int] = None) -> list[torch.device]:
    """The first `n` accelerators (`None`: all of them; the CPU where there is none); a
    `DeviceError` if more are asked for than exist (`TrainConfig` checks that `n` >= 1)."""
    available = try_all_gpus()
    if n is None:
        return available
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


def autocast_dtype(device) -> Optional[str]:
    """The reduced precision `device` runs fast: "bf16" on CUDA from compute capability 8.0,
    "fp16" on 7.0 and 7.5 (V100, T4: fp16 tensor cores, no bf16), else None (fp32). Not
    `torch.cuda.is_bf16_supported()`: it says True where bf16 is emulated, slower on a T4."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    capability = torch.cuda.get_device_capability(device)
    return "bf16" if capability >= (8, 0) else "fp16" if capability >= (7, 0) else None


def precision_records() -> list:
    """The GPU precision records the package ships (`recorded/precision.json`, written by
    `tools/gpu_check.py`'s bench): one row a GPU model and width, with the training images/s it
    measured for each precision ("tf32", "bf16", "fp16", ...) and its source."""
    from importlib import resources
    path = resources.files("mgpu_lib").joinpath("recorded/precision.json")
    return json.loads(path.read_text(encoding="utf-8"))


def measured_precision(device, width: int) -> Optional[str]:
    """"bf16" or "fp16" where a shipped record of `device`'s GPU model at this `width` measured
    that precision faster than fp32 (TF32); else None. At 28-pixel images the step is
    launch-bound: one H200 ran bf16 autocast at 0.74x TF32 (issue 51), so peak FLOP/s cannot
    choose a precision; only a measurement may."""
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    rows = precision_records() if name else []          # a CPU run reads no file
    rates = [row["images_per_s"] for row in rows if row["gpu"] == name and row["width"] == width]
    best = max(rates[0], key=rates[0].get) if rates else None
    return best if best in ("bf16", "fp16") else None


def synchronize(devices) -> None:
    """Wait for queued GPU work, so a timer reads finished work, not launched work."""
    for d in devices:
        if torch.device(d).type == "cuda":
            torch.cuda.synchronize(d)


class timed:
    """`with timed(devices) as t: work()`, then `t.seconds`: the wall time of finished work
    (`devices` synchronized before the clock starts and stops, or it times the launches)."""

    def __init__(self, devices=()):
        self.devices = list(devices)
        self.seconds = float("nan")

    def __enter__(self) -> "timed":
        synchronize(self.devices)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.devices)
        self.seconds = time.perf_counter() - self._t0


def describe_devices(devices: Optional[Sequence[torch.device]] = None) -> str:
    """A short hardware string printed beside every figure, e.g. '2 x NVIDIA H200' or
    'CPU (AVX512), 2 threads (torch uses 2)': the kernels torch runs, not the brand (the
    records' and banners' machinery adds it: `lab.bench.cpu_name`)."""
    devices = list(devices) if devices is not None else try_all_gpus()
    names = [torch.cuda.get_device_name(torch.device(d)) for d in devices
             if torch.device(d).type == "cuda"]
    parts = [f"{names.count(name)} x {name}" for name in dict.fromkeys(names)]
    if any(torch.device(d).type == "mps" for d in devices):
        parts.append("Apple MPS")
    if any(torch.device(d).type == "cpu" for d in devices):
        isa = torch.backends.cpu.get_cpu_capability()   # the kernels torch runs: AVX512, AVX2
        parts.append(f"CPU ({isa}), {os.cpu_count()} threads (torch uses "
                     f"{torch.get_num_threads()})")
    return " + ".join(parts)
