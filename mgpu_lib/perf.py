"""The fast path's switches, chosen per device, and a benchmark against the chapter's own loop.

    python -m mgpu_lib bench --width 64 --batch-size 256 --steps 3 --repeats 3 --out bench.json

`resolve_switches` turns a `TrainConfig`'s "auto" switches into decisions for one device:
- device-resident data with no per-step host sync: always (it never costs anything);
- channels_last and bf16 autocast on CUDA: both on (cuDNN's NHWC kernels feed the tensor cores),
  bf16 only where the GPU supports it;
- on a CPU: channels_last on (oneDNN's NHWC convolutions measured 1.28x faster than NCHW for the
  width-16 model at batch 128 on a 2-core AVX-512 EPYC), and fp32: the chapter's arithmetic, up
  to the order of additions. bf16 autocast is opt-in (`bf16=True`) on every CPU. Where it is
  native (AVX512-BF16 or AMX) it trained the full-width model 2.6x faster than the chapter's loop
  (fp32 with channels_last: 1.3x), but over 20 seeds of the `cpu` profile it ended 5 epochs with
  1.3 +- 0.5 points less training accuracy, and its test accuracy, 0.3 +- 0.6 points below fp32's,
  could not be shown to match; where it is not native it is emulated and much slower. The rule
  is fixed, not probed, so a run's numerics never depend on how busy the machine was;
- cudnn.benchmark: on CUDA; evaluation batch: 1024 images (at least the training batch);
- torch.compile: off unless asked for, because compiling takes longer than the runs this book does.
`bench` times the chapter's loop ("reference") and the fast loop on the same model, batch and
device, alternating A B A B after a warm-up, and reports medians, TFLOP/s and memory.
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass, fields, replace
from itertools import islice
from typing import Optional

import torch
from torch import nn

AUTO = "auto"
EVAL_BATCH = 1024       # images per evaluation batch on the fast path
TRAIN_FLOPS_FACTOR = 3  # a training step ~ forward + backward (2x forward) FLOPs


@dataclass(frozen=True)
class Switches:
    """What the training loop does. All off (`REFERENCE`) is the chapter's loop."""
    device_data: bool = False      # batches built on the device; loss read once per epoch
    channels_last: bool = False
    bf16: bool = False             # autocast; parameters and optimizer stay fp32
    norm_fp32: bool = False        # under bf16: BatchNorm (and what follows it) in fp32
    cudnn_benchmark: bool = False
    compile: bool = False
    eval_batch_size: Optional[int] = None   # None: the training batch

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """E.g. 'device data, channels_last, fp32' or 'DataLoader+ToTensor, fp32, NCHW'."""
        parts = ["device data" if self.device_data else "DataLoader+ToTensor",
                 "channels_last" if self.channels_last else "NCHW",
                 ("bf16 autocast, BatchNorm fp32" if self.norm_fp32 else "bf16 autocast")
                 if self.bf16 else "fp32"]
        parts += [name for name, on in (("cudnn.benchmark", self.cudnn_benchmark),
                                        ("compiled", self.compile)) if on]
        return ", ".join(parts)


REFERENCE = Switches()
# TrainConfig fields that only choose the fast path's switches
SWITCH_FIELDS = ("fast",) + tuple(f.name for f in fields(Switches))
# the --bf16 flag of `bench` and tools/record_accuracy.py, as a TrainConfig value
BF16_FLAG = {"auto": AUTO, "on": True, "off": False}


def cpu_flags() -> set:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_bf16_support(flags: Optional[set] = None) -> str:
    """"amx" (AMX-BF16 tiles), "avx512_bf16" (bf16 dot products) or "none" (emulated)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return "none"


def native_bf16(device, cpu_support: Optional[str] = None) -> bool:
    """Whether `device` computes in bf16 natively: only then may "auto" consider bf16."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return (cpu_support or cpu_bf16_support()) != "none"
    return False


def _norm_input_fp32(module: nn.Module, args: tuple) -> tuple:
    return (args[0].float(),) + tuple(args[1:])


def prepare_model(net: nn.Module, switches: Switches) -> nn.Module:
    """`net` in the switches' memory layout; with `norm_fp32` (under bf16), every BatchNorm gets
    its input as fp32, so normalization, the ReLU after it and the residual sums run in fp32
    while the convolutions stay bf16 (autocast casts their inputs back down)."""
    if switches.channels_last:
        net = net.to(memory_format=torch.channels_last)
    if switches.bf16 and switches.norm_fp32:
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.register_forward_pre_hook(_norm_input_fp32)
    return net


def _make_net(width: int, device, switches: Switches, seed: int = 0) -> nn.Module:
    from .train import TrainConfig, make_model
    return prepare_model(make_model(TrainConfig(width=width, seed=seed), device), switches)


def resolve_switches(config, device) -> Switches:
    """The switches `config` asks for on `device`: "auto" decided here, True/False kept."""
    if not config.fast:
        return REFERENCE
    device = torch.device(device)
    cuda = device.type == "cuda"

    def pick(value, auto):
        return auto() if value == AUTO else bool(value)

    accelerated = device.type in ("cuda", "cpu")
    channels_last = pick(config.channels_last, lambda: accelerated)
    bf16 = pick(config.bf16, lambda: cuda and native_bf16(device))
    norm_fp32 = bf16 and bool(config.norm_fp32)
    return Switches(device_data=pick(config.device_data, lambda: True),
                    channels_last=channels_last, bf16=bf16, norm_fp32=norm_fp32,
                    cudnn_benchmark=pick(config.cudnn_benchmark, lambda: cuda),
                    compile=pick(config.compile, lambda: False),
                    eval_batch_size=config.eval_batch_size or max(EVAL_BATCH, config.batch_size))


def peak_tflops(device, bf16: bool) -> Optional[float]:
    """The device's datasheet peak (bf16 tensor or fp32) from `scaling.DEVICES`; None if unknown."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        from .scaling import DEVICES
    except ImportError:
        return None
    name = torch.cuda.get_device_name(device)
    for key, spec in DEVICES.items():
        if key.split()[0] in name:
            use_tensor = bf16 and spec.tensor_dtype == "bf16"
            return spec.tensor_tflops if use_tensor else spec.fp32_tflops
    return None


class _Mode:
    """One loop under test: its own model, optimizer and endless batch iterator."""

    def __init__(self, switches: Switches, width: int, images, labels, batch: int, device,
                 num_workers: Optional[int]):
        from .data import DeviceLoader, chapter_loader
        self.switches, self.device = switches, device
        self.net = _make_net(width, device, switches)
        self.model = torch.compile(self.net) if switches.compile else self.net
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.05)
        self.loader = (DeviceLoader(images, labels, batch, shuffle=True, device=device)
                       if switches.device_data else
                       chapter_loader(images, labels, batch, shuffle=True,
                                      num_workers=num_workers))
        self.batches = iter(self.loader)    # kept alive: worker start-up is not timed

    def run(self, steps: int) -> float:
        """Train `steps` steps; returns images per second, timed after synchronizing."""
        from .train import cudnn_benchmark, synchronize, train_epoch
        with cudnn_benchmark(self.switches.cudnn_benchmark):
            synchronize([self.device])
            t0 = time.perf_counter()
            _, _, n = train_epoch(self.model, islice(self.batches, steps), self.optimizer,
                                  nn.CrossEntropyLoss(), self.device, switches=self.switches)
            synchronize([self.device])
        return n / (time.perf_counter() - t0)


def measure(modes: dict, *, width: int = 64, batch_size: int = 256, steps: int = 5,
            repeats: int = 3, warmup_steps: int = 2, device=None,
            num_workers: Optional[int] = None) -> dict:
    """Images/s of each mode in `modes` (name -> Switches), round-robin over `repeats`.

    Every mode first trains `warmup_steps` untimed steps; then each repeat runs every mode for
    `steps` steps in turn (A B A B ...), so slow drifts of a shared machine hit all modes alike.
    """
    from .data import synthetic_fashion_mnist
    from .devices import try_gpu
    device = torch.device(device) if device is not None else try_gpu()
    n = batch_size * (warmup_steps + steps * repeats)
    data = synthetic_fashion_mnist(n_train=n, n_test=1)      # content does not change speed
    state = {name: _Mode(sw, width, data["train_images"], data["train_labels"], batch_size,
                         device, num_workers) for name, sw in modes.items()}
    rates = {name: [] for name in modes}
    peak_mem = {name: 0.0 for name in modes}
    for name, mode in state.items():
        mode.run(warmup_steps)
    for _ in range(repeats):
        for name, mode in state.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            rates[name].append(mode.run(steps))
            if device.type == "cuda":
                peak_mem[name] = max(peak_mem[name],
                                     torch.cuda.max_memory_allocated(device) / 2**20)
    del state                                  # shuts the loaders' worker processes down
    return {name: {"switches": modes[name].to_dict(), "describe": modes[name].describe(),
                   "images_per_second": rates[name],
                   "median": statistics.median(rates[name]),
                   "peak_memory_mb": peak_mem[name] if device.type == "cuda" else None}
            for name in modes}


def bench_device(device=None) -> torch.device:
    """`device` as a torch.device (default: the first GPU, else the CPU), checked to exist."""
    from .devices import DeviceError, num_gpus, try_gpu
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


def bench(*, width: int = 64, batch_size: int = 256, steps: int = 5, repeats: int = 3,
          warmup_steps: int = 2, device=None, num_workers: Optional[int] = None,
          bf16=AUTO, norm_fp32: bool = False) -> dict:
    """The chapter's loop vs the fast loop ("auto" switches for `device`, with `bf16` and
    `norm_fp32` as given), measured together."""
    from .data import chapter_workers
    from .devices import describe_devices
    from .model import forward_flops, resnet18
    from .train import TrainConfig
    device = bench_device(device)
    fast = resolve_switches(TrainConfig(width=width, batch_size=batch_size, bf16=bf16,
                                        norm_fp32=norm_fp32), device)
    modes = measure({"reference": REFERENCE, "fast": fast}, width=width, batch_size=batch_size,
                    steps=steps, repeats=repeats, warmup_steps=warmup_steps, device=device,
                    num_workers=num_workers)
    train_flops = TRAIN_FLOPS_FACTOR * forward_flops(resnet18(width=width))
    for m in modes.values():
        m["tflops"] = m["median"] * train_flops / 1e12
        m["peak_tflops"] = peak_tflops(device, m["switches"]["bf16"])
        m["percent_of_peak"] = (100 * m["tflops"] / m["peak_tflops"]
                                if m["peak_tflops"] else None)
    return {"kind": "bench", "device": str(device), "hardware": describe_devices([device]),
            "width": width, "batch_size": batch_size, "steps": steps, "repeats": repeats,
            "warmup_steps": warmup_steps, "num_workers": chapter_workers(num_workers),
            "train_flops_per_image": train_flops, "cpu_bf16": cpu_bf16_support(),
            "torch": torch.__version__, "modes": modes,
            "ratio": modes["fast"]["median"] / modes["reference"]["median"],
            "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def format_bench(result: dict) -> list:
    """The lines `python -m mgpu_lib bench` prints."""
    r = result
    lines = [f"bench: ResNet-18 width {r['width']}, batch {r['batch_size']}, {r['steps']} steps "
             f"x {r['repeats']} repeats, alternating after {r['warmup_steps']} warm-up steps, "
             f"on {r['hardware']}"]
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
    emulated bf16 is slow and teaches nothing. compile is left out: it takes minutes.
    """
    device = torch.device(device)
    base = replace(REFERENCE, device_data=True, eval_batch_size=fast.eval_batch_size)
    modes = {"reference (the chapter's loop)": REFERENCE, "device data, no per-step sync": base,
             "+ channels_last": replace(base, channels_last=True)}
    if native_bf16(device):
        modes["+ bf16 autocast"] = replace(base, bf16=True)
        modes["+ bf16 autocast, BatchNorm fp32"] = replace(base, bf16=True, norm_fp32=True)
    if device.type == "cuda":
        modes["+ cudnn.benchmark"] = replace(base, cudnn_benchmark=True)
    modes["fast ('auto' switches)"] = fast
    return modes


def compare_accuracy(config, data_fast=None, data_reference=None, reference=None) -> dict:
    """Train `config` on the reference path and on the fast path; both results and the gap.

    `reference`: a recorded reference `TrainResult` of this very config to reuse instead of
    training it again (the reference loop is deterministic on one machine: same seed, same
    weights, same image order). It must match `config` exactly.
    """
    from .train import train
    if reference is None:
        reference = train(config.replace(fast=False), data=data_reference, progress=False)
    elif _without_switches(reference.config) != _without_switches(config.to_dict()):
        raise ValueError("the recorded reference was trained with a different config")
    fast = train(config.replace(fast=True), data=data_fast, progress=False)
    return {"kind": "accuracy", "profile": config.profile, "hardware": fast.hardware,
            "data_source": fast.data_source, "reference": reference.to_dict(),
            "fast": fast.to_dict(),
            "gap_points": 100 * (fast.final_test_acc - reference.final_test_acc)}


def _without_switches(config: dict) -> dict:
    """A config's fields minus the fast-path switches, which the reference loop ignores."""
    return {k: v for k, v in config.items() if k not in SWITCH_FIELDS}


def _mean_se(values: list) -> tuple:
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return statistics.mean(values), se


def summarize_accuracy(records: list) -> list:
    """`compare_accuracy` records grouped by profile and fast-path switches, one dict per group
    (its `records` included).

    Each seed's final-epoch gap (fast - reference, in points) is one sample; means come with
    their standard errors, since seeds alone move this model's final accuracy by a few points.
    The training accuracy of the last epoch, averaged over all its steps, is the less noisy
    second view.
    """
    groups = {}
    for rec in records:
        fast = Switches(**rec["fast"]["extra"]["switches"])
        groups.setdefault((rec["profile"], fast.describe()), []).append(rec)
    out = []
    for (profile, describe), recs in groups.items():
        gaps = [r["gap_points"] for r in recs]
        train_gaps = [100 * (r["fast"]["train_acc"][-1] - r["reference"]["train_acc"][-1])
                      for r in recs]
        gap, gap_se = _mean_se(gaps)
        train_gap, train_gap_se = _mean_se(train_gaps)
        out.append({"profile": profile, "fast": describe, "seeds": len(recs), "records": recs,
                    "bf16": recs[0]["fast"]["extra"]["switches"]["bf16"],
                    "hardware": recs[0]["hardware"],
                    "reference_mean": statistics.mean(r["reference"]["test_acc"][-1] for r in recs),
                    "fast_mean": statistics.mean(r["fast"]["test_acc"][-1] for r in recs),
                    "gap_mean_points": gap, "gap_se_points": gap_se, "gaps_points": gaps,
                    "train_gap_mean_points": train_gap, "train_gap_se_points": train_gap_se})
    return out


def paired_fast_gap(records_a: list, records_b: list, metric: str = "test_acc") -> dict:
    """Fast run of `records_b` minus fast run of `records_a`, seed by seed (final epoch, points):
    mean, standard error and the number of seeds both hold."""
    a = {r["seed"]: r["fast"][metric][-1] for r in records_a}
    diffs = [100 * (r["fast"][metric][-1] - a[r["seed"]]) for r in records_b if r["seed"] in a]
    if not diffs:
        return {"seeds": 0, "mean_points": float("nan"), "se_points": float("nan")}
    mean, se = _mean_se(diffs)
    return {"seeds": len(diffs), "mean_points": mean, "se_points": se}


def format_ablation(measured: dict) -> list:
    """A text table of `measure`'s result: images/s and speed-up over the first row."""
    rows = list(measured.items())
    base = rows[0][1]["median"]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'loop':<{width}}  {'images/s':>9}  {'vs first':>8}  switches"]
    for name, m in rows:
        lines.append(f"{name:<{width}}  {m['median']:9.1f}  {m['median'] / base:7.2f}x  "
                     f"{m['describe']}")
    return lines


def load_records(pattern: str = "bench_*.json", folder=None) -> list:
    """Recorded results (dicts) from the repository's results/ folder; [] where there is none."""
    import json
    from pathlib import Path
    folder = Path(folder) if folder else Path(__file__).resolve().parent.parent / "results"
    return [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]
