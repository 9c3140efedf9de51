"""What a run is: `TrainConfig`, each setting declared once, and the fast path's switches.

    config = TrainConfig(devices=2, batch_size=512, lr=0.2)
    switches = resolve_switches(config, device)     # "auto" decided for one device

A setting is a dataclass field with its type, default and help (`setting`); the command lines
(`ddp.parse_args`, `mgpu_lib.book.cli`) derive their flags from the fields, and
`TrainConfig.__post_init__` checks the values: the one place a run's settings are checked.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, replace
from typing import Optional, Union

import torch
from torch import nn

from .data import SOURCES
from .devices import autocast_dtype, measured_precision

AUTO = "auto"
GRAPHS = "graphs"      # compile="graphs": torch.compile's reduce-overhead mode (CUDA graphs)
SEED_MAX = 2 ** 63 - 1          # torch.manual_seed takes up to 2**64 - 1; keep it signed-safe
OPTIONAL = ("devices", "train_limit", "test_limit")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def setting(default, help: str, **more):
    """A `TrainConfig` field: its default and its help, declared once (`more`: `flag`, the
    command line's name for it, or `cli=False`, no flag). Command lines derive their flags
    from these fields; `TrainConfig.__post_init__` checks the values."""
    return dataclasses.field(default=default, metadata=dict(help=help, **more))


@dataclass(frozen=True)
class TrainConfig:
    """One training run, validated on construction; each setting is declared once, here."""
    devices: Optional[int] = setting(
        None, "number of GPUs (default: all; the CPU where there is none)")
    batch_size: int = setting(256, "global batch size (DataParallel splits it)")
    lr: float = setting(0.1, "learning rate")
    num_epochs: int = setting(10, "number of epochs", flag="--epochs")
    seed: int = setting(0, "seeds the weights and the data shuffle")
    width: int = setting(64, "ResNet width (64 = the chapter's)")
    train_limit: Optional[int] = setting(None, "class-balanced training subset")
    test_limit: Optional[int] = setting(None, "class-balanced test subset")
    data_source: str = setting("auto", "where Fashion-MNIST comes from: " + ", ".join(SOURCES))
    allow_synthetic: bool = setting(False, "let 'auto' fall back to synthetic data")
    profile: str = setting("custom", "the profile this config came from (recorded)",
                           cli=False)            # --profile picks the whole profile instead
    # The fast path: fast=False is the chapter's loop and ignores the switches below; each switch
    # is True, False, or "auto" (`resolve_switches` decides it per device).
    fast: bool = setting(True, "the fast path; off: the chapter's loop")
    device_data: Union[bool, str] = setting("auto", "batches made on the device, no per-step "
                                                    "sync")
    channels_last: Union[bool, str] = setting("auto", "channels_last memory format")
    bf16: Union[bool, str] = setting("auto", "bf16 autocast; the weights stay fp32 (auto: where "
                                             "a GPU record measured it faster)")
    norm_fp32: bool = setting(False, "under bf16: BatchNorm in fp32")
    fp16: Union[bool, str] = setting("auto", "CUDA: fp16 autocast + GradScaler (auto: where a "
                                             "GPU record measured it faster)")
    cudnn_benchmark: Union[bool, str] = setting("auto", "cudnn.benchmark")
    compile: Union[bool, str] = setting("auto", "torch.compile (auto: off; compiling dominates); "
                                               "graphs: with CUDA graphs (reduce-overhead)")

    def __post_init__(self):
        """Each setting's range, checked where a run's settings enter: a one-line ValueError
        naming the first setting out of its range."""
        lows = dict(batch_size=1, num_epochs=1, width=1, devices=1, train_limit=1, test_limit=1,
                    seed=0)
        problems = [(n, f"an integer from {low} to 2**63 - 1", v is None and n in OPTIONAL
                     or _int(v) and low <= v <= SEED_MAX)
                    for n, low in lows.items() for v in [getattr(self, n)]]
        problems.append(("lr", "a positive number", is_number(self.lr) and self.lr > 0))
        choices = {**dict.fromkeys(("allow_synthetic", "fast", "norm_fp32"), (True, False)),
                   **dict.fromkeys(("device_data", "channels_last", "bf16", "fp16",
                                    "cudnn_benchmark"), (True, False, AUTO)),
                   "compile": (True, False, AUTO, GRAPHS), "data_source": SOURCES}
        problems += [(n, "one of " + ", ".join(map(repr, c)), type(v) in (bool, str) and v in c)
                     for n, c in choices.items() for v in [getattr(self, n)]]
        problems.append(("profile", "a name", isinstance(self.profile, str)))
        for name, words, ok in problems:
            if not ok:
                raise ValueError(f"{name} must be {words}, got {getattr(self, name)!r}")

    def replace(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


EVAL_BATCH = 1024       # images per evaluation batch on the fast path


@dataclass(frozen=True)
class Switches:
    """What the training loop does. All off (`REFERENCE`) is the chapter's loop."""
    device_data: bool = False      # batches built on the device, not on the host
    channels_last: bool = False
    bf16: bool = False             # autocast; parameters and optimizer stay fp32
    norm_fp32: bool = False        # under bf16: BatchNorm (and what follows it) in fp32
    fp16: bool = False             # autocast to fp16, with a GradScaler (CUDA only)
    tf32: bool = False             # fp32 matmuls and convs on TF32 tensor cores (CUDA from 8.0)
    cudnn_benchmark: bool = False
    compile: Union[bool, str] = False    # or GRAPHS: compiled, replayed as CUDA graphs
    eval_batch_size: Optional[int] = None   # None: the training batch

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def precision(self) -> str:
        """'fp32', 'fp32 (TF32)', 'bf16 autocast' or 'fp16 autocast + GradScaler'."""
        if self.bf16:
            return "bf16 autocast, BatchNorm fp32" if self.norm_fp32 else "bf16 autocast"
        return ("fp16 autocast + GradScaler" if self.fp16
                else "fp32 (TF32)" if self.tf32 else "fp32")

    def describe(self) -> str:
        """E.g. 'device data, channels_last, fp32' or 'host data, NCHW, fp32'."""
        parts = ["device data" if self.device_data else "host data",
                 "channels_last" if self.channels_last else "NCHW", self.precision]
        parts += [name for name, on in (("cudnn.benchmark", self.cudnn_benchmark),
                                        ("compiled, CUDA graphs" if self.compile == GRAPHS
                                         else "compiled", self.compile)) if on]
        return ", ".join(parts)


REFERENCE = Switches()


def channels_last_safe(device_type: str, width: int) -> bool:
    """Whether "auto" may pick channels_last for a ResNet-18 of `width` on `device_type`. In
    torch 2.14 oneDNN's backward of a channels_last, stride-2, 1x1 convolution with 2 to 8 input
    channels crashed on CPUs here (never at 16 and more, where it ran 1.1x to 1.3x faster); the
    narrowest one has `width` inputs. tests/test_crash_regression.py keeps the reproduction."""
    return device_type == "cuda" or (device_type == "cpu" and width >= 16)


def prepare_model(net: nn.Module, switches: Switches) -> nn.Module:
    """`net` in the switches' memory layout; with `norm_fp32` (under bf16) every BatchNorm gets
    fp32 input, so the normalizations, ReLUs and residual sums run in fp32, the convs in bf16."""
    if switches.channels_last:
        net = net.to(memory_format=torch.channels_last)
    if switches.bf16 and switches.norm_fp32:
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.register_forward_pre_hook(lambda module, args: (args[0].float(), *args[1:]))
    return net


def resolve_switches(config, device) -> Switches:
    """The switches `config` asks for on `device`, "auto" decided by fixed rules read from the
    hardware and the shipped records, never probed (so a run's numerics never depend on how busy
    the machine was): device data always; channels_last where `channels_last_safe`; fp32, with
    TF32 on CUDA from compute capability 8.0; bf16 or fp16 autocast only where a shipped record
    of this GPU model measured it faster at this width (`measured_precision`), else when asked
    (fp16 comes with a GradScaler, CUDA only); cudnn.benchmark on CUDA; torch.compile only when
    asked. fast=False: `REFERENCE`."""
    if not config.fast:
        return REFERENCE
    device = torch.device(device)
    cuda = device.type == "cuda"

    def pick(value, auto: bool) -> bool:
        return auto if value == AUTO else bool(value)

    measured = measured_precision(device, config.width)    # None without a GPU record
    bf16 = pick(config.bf16, measured == "bf16" and autocast_dtype(device) == "bf16")
    fp16 = not bf16 and pick(config.fp16, measured == "fp16")
    if fp16 and not cuda:
        raise ValueError("fp16 autocast with a GradScaler needs a CUDA GPU; on a CPU use bf16")
    return Switches(device_data=pick(config.device_data, True),
                    channels_last=pick(config.channels_last,
                                       channels_last_safe(device.type, config.width)),
                    bf16=bf16, norm_fp32=bf16 and bool(config.norm_fp32), fp16=fp16,
                    tf32=autocast_dtype(device) == "bf16",        # CUDA from 8.0
                    cudnn_benchmark=pick(config.cudnn_benchmark, cuda),
                    compile=False if config.compile == AUTO else config.compile,
                    eval_batch_size=max(EVAL_BATCH, config.batch_size))
