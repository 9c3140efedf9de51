"""What a run is: `TrainConfig`, each setting declared once, and the fast path's switches.

    config = TrainConfig(devices=2, batch_size=512, lr=0.2)
    switches = resolve_switches(config, device)     # "auto" decided for one device

A setting is a dataclass field declared with `setting(default, check, help)`: `validate` checks
it, and the command lines (`mgpu_lib.book.cli`, `ddp.parse_args`) build its flag from it.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from .data import SOURCES
from .devices import autocast_dtype

SEED_MAX = 2 ** 63 - 1          # torch.manual_seed takes up to 2**64 - 1; keep it signed-safe


@dataclass(frozen=True)
class Check:
    """What values a setting takes (`ok`), said as "must be <words>"; `convert` reads the
    command line's text, shown in help as `metavar`."""
    words: str
    ok: Callable[[Any], bool]
    convert: Callable[[str], Any]
    metavar: str = "VALUE"

    def parse(self, text: str):
        try:
            value = self.convert(text.strip())
        except (ValueError, OverflowError):
            value = None
        if value is None or not self.ok(value):
            raise ValueError(f"must be {self.words}, got {text!r}")
        return value

    def __call__(self, text: str):
        """`parse` as an argparse type: a refusal is one line naming the flag."""
        try:
            return self.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    def check(self, name: str, value) -> None:
        if not self.ok(value):
            raise ValueError(f"{name} must be {self.words}, got {value!r}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def _to_bool(text: str) -> Optional[bool]:
    t = text.lower()
    return True if t in _TRUE else False if t in _FALSE else None


POSITIVE_INT = Check("a positive integer", lambda v: _is_int(v) and v >= 1, int, "N")
COUNT = Check("an integer >= 0", lambda v: _is_int(v) and v >= 0, int, "N")
SEED = Check("an integer from 0 to 2**63 - 1", lambda v: _is_int(v) and 0 <= v <= SEED_MAX,
             int, "N")
POSITIVE_NUMBER = Check("a positive number", lambda v: is_number(v) and v > 0, float, "X")
FLAG = Check("true or false (on/off)", lambda v: isinstance(v, bool), _to_bool, "on|off")
AUTO_FLAG = Check("true, false or 'auto' (on/off/auto)",
                  lambda v: isinstance(v, bool) or v == "auto",
                  lambda t: "auto" if t.lower() == "auto" else _to_bool(t), "on|off|auto")
NAME = Check("a name (a string)", lambda v: isinstance(v, str), str, "NAME")


def one_of(*choices: str) -> Check:
    return Check(f"one of {', '.join(choices)}", lambda v: v in choices, str, "|".join(choices))


def setting(default, check: Check, help: str, *, optional: bool = False,
            flag: Optional[str] = None, cli: bool = True):
    """A dataclass field declared once. `optional`: None is allowed too (a default chosen at
    run time); `flag`: its flag (default `--field-name`); `cli=False`: no flag."""
    return dataclasses.field(default=default, metadata=dict(
        check=check, help=help, optional=optional, flag=flag, cli=cli))


def declared(cls_or_obj) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls_or_obj) if "check" in f.metadata]


def on_cli(cls_or_obj) -> list[dataclasses.Field]:
    return [f for f in declared(cls_or_obj) if f.metadata["cli"]]


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def add_flags(parser, cls, skip=()) -> None:
    """A flag for each command-line setting of `cls` but `skip`; a true/false one alone: true."""
    for f in on_cli(cls):
        check, on_off = f.metadata["check"], f.metadata["check"] is FLAG
        if f.name not in skip:
            parser.add_argument(flag_name(f), dest=f.name, type=check, metavar=check.metavar,
                                nargs="?" if on_off else None, const=True if on_off else None,
                                help=f.metadata["help"])


def validate(config) -> None:
    """Raise a ValueError naming the first declared field whose value its check refuses."""
    for f in declared(config):
        value = getattr(config, f.name)
        if not (value is None and f.metadata["optional"]):
            f.metadata["check"].check(f.name, value)


@dataclass(frozen=True)
class TrainConfig:
    """One training run, validated on construction; each setting is declared once, here."""
    devices: Optional[int] = setting(
        None, POSITIVE_INT, "number of GPUs (default: all; the CPU where there is none)",
        optional=True)
    batch_size: int = setting(256, POSITIVE_INT, "global batch size (DataParallel splits it)")
    lr: float = setting(0.1, POSITIVE_NUMBER, "learning rate")
    num_epochs: int = setting(10, POSITIVE_INT, "number of epochs", flag="--epochs")
    seed: int = setting(0, SEED, "seeds the weights and the data shuffle")
    width: int = setting(64, POSITIVE_INT, "ResNet width (64 = the chapter's)")
    train_limit: Optional[int] = setting(None, POSITIVE_INT, "class-balanced training subset",
                                         optional=True)
    test_limit: Optional[int] = setting(None, POSITIVE_INT, "class-balanced test subset",
                                        optional=True)
    data_source: str = setting("auto", one_of(*SOURCES), "where Fashion-MNIST comes from")
    allow_synthetic: bool = setting(False, FLAG, "let 'auto' fall back to synthetic data")
    profile: str = setting("custom", NAME, "the profile this config came from (recorded)",
                           cli=False)            # --profile picks the whole profile instead
    # The fast path: fast=False is the chapter's loop and ignores the switches below; each switch
    # is True, False, or "auto" (`resolve_switches` decides it per device).
    fast: bool = setting(True, FLAG, "the fast path; off: the chapter's loop")
    device_data: Union[bool, str] = setting(
        "auto", AUTO_FLAG, "batches made on the device, no per-step sync")
    channels_last: Union[bool, str] = setting("auto", AUTO_FLAG, "channels_last memory format")
    bf16: Union[bool, str] = setting("auto", AUTO_FLAG,
                                     "bf16 autocast; the weights stay fp32 (auto: GPUs with bf16)")
    norm_fp32: bool = setting(False, FLAG, "under bf16: BatchNorm in fp32")
    fp16: Union[bool, str] = setting("auto", AUTO_FLAG,
                                     "CUDA: fp16 autocast + GradScaler (auto: T4, V100)")
    cudnn_benchmark: Union[bool, str] = setting("auto", AUTO_FLAG, "cudnn.benchmark")
    compile: Union[bool, str] = setting("auto", AUTO_FLAG,
                                        "torch.compile (auto: off; compiling dominates)")
    eval_batch_size: Optional[int] = setting(
        None, POSITIVE_INT, "evaluation batch (default: 1024, at least the batch, when fast)",
        optional=True)
    num_workers: Optional[int] = setting(
        None, COUNT, "the chapter loader's workers (default: 4, capped at the cores)",
        optional=True)

    def __post_init__(self):
        validate(self)

    def replace(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


AUTO = "auto"
EVAL_BATCH = 1024       # images per evaluation batch on the fast path


@dataclass(frozen=True)
class Switches:
    """What the training loop does. All off (`REFERENCE`) is the chapter's loop."""
    device_data: bool = False      # batches built on the device, not by a DataLoader
    channels_last: bool = False
    bf16: bool = False             # autocast; parameters and optimizer stay fp32
    norm_fp32: bool = False        # under bf16: BatchNorm (and what follows it) in fp32
    fp16: bool = False             # autocast to fp16, with a GradScaler (CUDA only)
    cudnn_benchmark: bool = False
    compile: bool = False
    eval_batch_size: Optional[int] = None   # None: the training batch

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """E.g. 'device data, channels_last, fp32' or 'DataLoader+ToTensor, NCHW, fp32'."""
        parts = ["device data" if self.device_data else "DataLoader+ToTensor",
                 "channels_last" if self.channels_last else "NCHW",
                 ("bf16 autocast, BatchNorm fp32" if self.norm_fp32 else "bf16 autocast")
                 if self.bf16 else "fp16 autocast + GradScaler" if self.fp16 else "fp32"]
        parts += [name for name, on in (("cudnn.benchmark", self.cudnn_benchmark),
                                        ("compiled", self.compile)) if on]
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
    hardware, never probed (so a run's numerics never depend on how busy the machine was):
    device data always; channels_last where `channels_last_safe`; bf16 autocast on CUDA from
    compute capability 8.0 (opt-in on a CPU), fp16 with a GradScaler on 7.0 and 7.5 (V100,
    T4); cudnn.benchmark on CUDA; torch.compile only when asked. fast=False: `REFERENCE`."""
    if not config.fast:
        return REFERENCE
    device = torch.device(device)
    cuda = device.type == "cuda"

    def pick(value, auto: bool) -> bool:
        return auto if value == AUTO else bool(value)

    bf16 = pick(config.bf16, autocast_dtype(device) == "bf16")   # CUDA from 8.0 only
    fp16 = not bf16 and pick(config.fp16, autocast_dtype(device) == "fp16")
    if fp16 and not cuda:
        raise ValueError("fp16 autocast with a GradScaler needs a CUDA GPU; on a CPU use bf16")
    return Switches(device_data=pick(config.device_data, True),
                    channels_last=pick(config.channels_last,
                                       channels_last_safe(device.type, config.width)),
                    bf16=bf16, norm_fp32=bf16 and bool(config.norm_fp32), fp16=fp16,
                    cudnn_benchmark=pick(config.cudnn_benchmark, cuda),
                    compile=pick(config.compile, False),
                    eval_batch_size=config.eval_batch_size or max(EVAL_BATCH, config.batch_size))
