"""The chapter's loop against the fast loop, timed on the same model, batch and device, with
TFLOP/s against the device's peak; `measure` times any set of switches (the ablation).

    python -m mgpu_lib bench --width 64 --batch-size 256 --steps 3 --repeats 3 --out bench.jsonl
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from itertools import islice
from typing import Callable, Iterator, Optional

import psutil
import torch
from torch import nn

from ..data import DeviceLoader, synthetic_fashion_mnist
from ..devices import (DeviceError, autocast_dtype, describe_devices, num_gpus,
                       timed, try_gpu)
from ..model import resnet18
from ..perf.flops import check_width, train_bytes, train_flops
from ..perf.scaling import conv_peak_tflops, spec_for_name
from ..config import AUTO, REFERENCE, Switches, prepare_model, resolve_switches
from .d2l import chapter_loader, chapter_step, chapter_workers
from .files import cpu_info, record_header as header
from ..training import TrainConfig, backends, make_model, make_step


def cpu_bf16_support(flags: Optional[set] = None) -> str:
    """"amx" (AMX-BF16 tiles), "avx512_bf16" (bf16 dot products) or "none" (emulated), from
    the CPU's flags (py-cpuinfo's, unless given)."""
    flags = set(cpu_info().get("flags", [])) if flags is None else flags
    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "none"


def native_bf16(device, cpu_support: Optional[str] = None) -> bool:
    """Whether `device` computes in bf16 natively, where the bench tries bf16: CUDA from compute
    capability 8.0 (`devices.autocast_dtype`), a CPU with AVX512-BF16 or AMX."""
    device = torch.device(device)
    if device.type == "cuda":
        return autocast_dtype(device) == "bf16"
    return device.type == "cpu" and (cpu_support or cpu_bf16_support()) != "none"


def peak_tflops(device, bf16: bool, fp16: bool = False) -> Optional[float]:
    """The datasheet peak a loop's convolutions run at on `device`: the tensor cores' under bf16
    (where they do bf16) or fp16 autocast, else `conv_peak_tflops`; None: no datasheet."""
    device = torch.device(device)
    spec = spec_for_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    if spec and ((bf16 and spec.tensor_dtype == "bf16") or (fp16 and spec.tensor_tflops)):
        return spec.tensor_tflops
    return conv_peak_tflops(spec) if spec else None


def add_tflops(modes: dict, width: int, device) -> float:
    """Add achieved TFLOP/s and the share of the device's peak to each of `measure`'s modes;
    returns the training FLOPs per image (`FlopCounterMode`'s count, forward and backward)."""
    flops = train_flops(resnet18(width=width))
    for m in modes.values():
        m["tflops"] = m["median"] * flops / 1e12
        sw = m["switches"]
        m["peak_tflops"] = peak_tflops(device, sw["bf16"], sw.get("fp16", False))
        m["percent_of_peak"] = 100 * m["tflops"] / m["peak_tflops"] if m["peak_tflops"] else None
    return flops


def _mode(switches: Switches, width: int, images, labels, batch: int, device,
          num_workers: Optional[int]) -> Callable[[int], float]:
    """One loop under test (its own model, optimizer, batches): `run(steps)` -> images/s."""
    net = prepare_model(make_model(TrainConfig(width=width), device), switches)
    model = torch.compile(net) if switches.compile else net
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    step = (chapter_step(model, optimizer, nn.CrossEntropyLoss(), device)
            if switches == REFERENCE else   # the chapter's loop body, line by line
            make_step(model, optimizer, nn.CrossEntropyLoss(), device, switches))
    # one iterator, kept alive between runs: worker start-up is not timed
    batches = iter(DeviceLoader(images, labels, batch, shuffle=True, device=device)
                   if switches.device_data else    # else the chapter's loader
                   chapter_loader(images, labels, batch, shuffle=True, num_workers=num_workers))

    def run(steps: int) -> float:
        net.train()
        with backends(switches):
            return images_per_second(batches, steps, device, step)
    return run


def images_per_second(batches: Iterator, steps: int, device,
                      step: Optional[Callable] = None) -> float:
    """Images per second of the next `steps` batches of `batches`, each moved to `device` and
    passed to `step(x, y)` (None: only delivered), timed by `devices.timed`."""
    n = 0
    with timed([device]) as t:
        for x, y in islice(batches, steps):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if step is not None:
                step(x, y)
            n += len(y)
    return n / t.seconds


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (where psutil has no peak: its current RSS)."""
    try:            # POSIX only; ru_maxrss: bytes on macOS, KiB on Linux
        import resource
    except ImportError:     # Windows: psutil's peak
        info = psutil.Process().memory_info()
        return getattr(info, "peak_wset", info.rss) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def measure(modes: dict, *, device, width: int = 64, batch_size: int = 256, steps: int = 5,
            repeats: int = 3, warmup_steps: int = 2, num_workers: Optional[int] = None) -> dict:
    """Images/s of each mode in `modes` (name -> Switches), round-robin over `repeats`: after
    `warmup_steps` untimed steps each, every repeat runs every mode `steps` steps in turn
    (A B A B ...), so slow drifts of a shared machine hit all modes alike."""
    device, cuda = torch.device(device), torch.device(device).type == "cuda"
    n = batch_size * (warmup_steps + steps * repeats)
    data = synthetic_fashion_mnist(n_train=n, n_test=1)      # content does not change speed
    runs = {name: _mode(sw, width, data["train_images"], data["train_labels"], batch_size,
                        device, num_workers) for name, sw in modes.items()}
    rates, peak_mem = {name: [] for name in modes}, {name: [] for name in modes}    # MiB
    for run in runs.values():
        run(warmup_steps)
    for _ in range(repeats):
        for name, run in runs.items():
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            rates[name].append(run(steps))
            peak_mem[name].append(torch.cuda.max_memory_allocated(device) / 2**20 if cuda else 0)
    del runs                                   # shuts the loaders' worker processes down
    return {name: {"switches": modes[name].to_dict(), "describe": modes[name].describe(),
                   "images_per_second": rates[name], "median": statistics.median(rates[name]),
                   "peak_memory_mb": max(peak_mem[name]) if cuda else None} for name in modes}


def bench_device(device=None) -> torch.device:
    """`device` as a torch.device (default: the first GPU, else the CPU), checked to exist."""
    if device is None:
        return try_gpu()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and (device.index or 0) >= num_gpus():
        raise DeviceError(f"{device} requested but this machine has {num_gpus()} CUDA GPU(s)")
    if device.type not in ("cpu", "cuda"):
        raise DeviceError(f"bench supports cpu and cuda devices, got {device}")
    return device


def usable_memory(device=None) -> int:
    """Bytes `device` can hold (default: the first GPU where CUDA exists, else the CPU): a GPU's
    memory, or the host's available memory, less where this process has an address-space limit
    (`ulimit -v`)."""
    device = torch.device(device if device is not None else "cuda" if num_gpus() else "cpu")
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory
    free = psutil.virtual_memory().available
    if hasattr(psutil, "RLIMIT_AS"):                 # Linux and BSD: setrlimit's, via psutil
        process = psutil.Process()
        soft = process.rlimit(psutil.RLIMIT_AS)[0]
        if soft != psutil.RLIM_INFINITY:
            free = min(free, max(0, soft - process.memory_info().vms))
    return free


def check_fits(width: int, batch: int, devices: Optional[int] = None,
               available: Optional[int] = None) -> None:
    """The one bound on a network and its batch, checked before anything is allocated: a ValueError
    when training `width` at `batch` over `devices` needs more than `available` bytes (default
    `usable_memory()`), naming the batch if even width 1 cannot take it, else the width."""
    free = usable_memory() if available is None else available
    n = devices or max(1, num_gpus())
    if train_bytes(1, -(-batch // n)) > free:
        fixed = train_bytes(width, 0)                # weights; each image adds the same
        largest = max(0, free - fixed) // (train_bytes(width, 1) - fixed) * n
        raise ValueError(f"batch {batch:,} needs about {train_bytes(1, -(-batch // n)) / 1e9:,.0f}"
                         f" GB even at width 1, and this machine has {free / 1e9:.1f} GB; the "
                         f"largest batch that fits width {width} is {largest:,}")
    check_width(width, batch, devices, available=free)


def bench(*, width: int = 64, batch_size: int = 256, steps: int = 5, repeats: int = 3,
          warmup_steps: int = 2, device=None, num_workers: Optional[int] = None,
          bf16=AUTO, norm_fp32: bool = False) -> dict:
    """The chapter's loop vs the fast loop ("auto" switches for `device`), measured together."""
    workers = chapter_workers(num_workers)       # a bad count is refused before any work
    device = bench_device(device)
    # before allocating: the network, then the images (each made from 3 float32 28x28 arrays)
    images, free = batch_size * (warmup_steps + steps * repeats), usable_memory(device)
    check_fits(width, batch_size, 1, available=free)
    if (need := images * 3 * 4 * 28 * 28) > free - train_bytes(width, batch_size):
        raise ValueError(f"{images:,} images (batch {batch_size:,} times the steps) need about "
                         f"{need / 1e9:,.0f} GB beside the network, and this machine has "
                         f"{free / 1e9:.1f} GB; fewer steps or repeats")
    fast = resolve_switches(TrainConfig(width=width, batch_size=batch_size, bf16=bf16,
                                        norm_fp32=norm_fp32), device)
    modes = measure({"reference": REFERENCE, "fast": fast}, width=width, batch_size=batch_size,
                    steps=steps, repeats=repeats, warmup_steps=warmup_steps, device=device,
                    num_workers=num_workers)
    flops = add_tflops(modes, width, device)
    config = dict(device=str(device), width=width, batch_size=batch_size, steps=steps,
                  repeats=repeats, warmup_steps=warmup_steps, num_workers=workers)
    # No profile: a benchmark's arguments (its config) set every size.
    return {**header(hardware=describe_devices([device]), profile=None,
                     config={**config, "bf16": bf16, "norm_fp32": norm_fp32}),
            "kind": "bench", **config, "train_flops_per_image": flops,
            "cpu_bf16": cpu_bf16_support(), "chapter_loop": "line by line", "modes": modes,
            "ratio": modes["fast"]["median"] / modes["reference"]["median"],
            "process_peak_rss_mb": peak_rss_mb()}


def format_bench(r: dict) -> list:
    """The lines `python -m mgpu_lib bench` prints."""
    lines = ["bench: ResNet-18 width {width}, batch {batch_size}, {steps} steps x {repeats} "
             "repeats, alternating after {warmup_steps} warm-up steps, on {hardware}".format_map(r)]
    for name, m in r["modes"].items():
        peak = (f"{m['percent_of_peak']:.1f}% of {m['peak_tflops']:g} TFLOP/s peak"
                if m["peak_tflops"] else "peak unknown for this device")
        mem = (f"peak memory {m['peak_memory_mb']:.0f} MiB" if m["peak_memory_mb"] is not None
               else f"process peak RSS {r['process_peak_rss_mb']:.0f} MiB")
        runs = ", ".join(f"{v:.1f}" for v in m["images_per_second"])
        lines.append(f"{name:>9}: {m['median']:9.1f} images/s median ({runs}); "
                     f"{m['tflops']:.3f} TFLOP/s, {peak}; {mem}  [{m['describe']}]")
    lines.append(f"    ratio: fast / reference = {r['ratio']:.2f}x")
    return lines


def ablation_modes(fast: Switches, device) -> dict:
    """Reference, device data, then each other switch alone on top of it, then `fast` itself.
    bf16 is tried only where it is native (CUDA with bf16, or a CPU with AVX512-BF16/AMX):
    emulated bf16 is slow and teaches nothing. compile is left out: it takes minutes."""
    device = torch.device(device)
    base = replace(REFERENCE, device_data=True, eval_batch_size=fast.eval_batch_size)
    modes = {"reference (the chapter's loop)": REFERENCE, "device data": base,
             "+ channels_last": replace(base, channels_last=True)}
    if native_bf16(device):
        modes["+ bf16 autocast"] = replace(base, bf16=True)
        modes["+ bf16 autocast, BatchNorm fp32"] = replace(base, bf16=True, norm_fp32=True)
    if device.type == "cuda":
        modes["+ cudnn.benchmark"] = replace(base, cudnn_benchmark=True)
    modes["fast ('auto' switches)"] = fast
    return modes
