"""The fast path's switches: what the training loop does on a device, decided when a run starts.

`resolve_switches` turns a config's "auto" switches into decisions for one device, by fixed rules
read from the hardware (never probed, so a run's numerics never depend on how busy the machine
was):
- device-resident data: always (batches are sliced on the device; no DataLoader workers);
- channels_last: on CUDA, and on a CPU where `channels_last_safe` says so;
- bf16 autocast: on CUDA GPUs with native bf16 (compute capability 8.0 and newer). On a CPU it
  is opt-in (`bf16=True`): the Performance page shows what it costs in accuracy;
- fp16 autocast with a `GradScaler`: on CUDA GPUs of capability 7.0 and 7.5 (V100, T4), which
  have fp16 tensor cores but no bf16;
- cudnn.benchmark: on CUDA; evaluation batch: 1024 images (at least the training batch);
- torch.compile: off unless asked for (compiling takes longer than the runs this book does).
All off (`REFERENCE`) is the chapter's loop: its DataLoader, NCHW and fp32.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional

import torch
from torch import nn

from .devices import autocast_dtype, cpu_bf16_support

AUTO = "auto"
EVAL_BATCH = 1024       # images per evaluation batch on the fast path
# a command-line --bf16 value as a config value
BF16_FLAG = {"auto": AUTO, "on": True, "off": False}


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
# config fields that only choose the fast path's switches (the chapter's loop ignores them)
SWITCH_FIELDS = ("fast",) + tuple(f.name for f in fields(Switches))


def native_bf16(device, cpu_support: Optional[str] = None) -> bool:
    """Whether `device` computes in bf16 natively: only then may "auto" consider bf16.

    On CUDA that is compute capability 8.0 (Ampere) and newer. `torch.cuda.is_bf16_supported()`
    is not the test: it also says True where bf16 is only emulated (a T4 or a V100), which is
    slower than fp32 there.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return autocast_dtype(device) == "bf16"
    if device.type == "cpu":
        return (cpu_support or cpu_bf16_support()) != "none"
    return False


def channels_last_safe(device_type: str, width: int) -> bool:
    """Whether "auto" may pick channels_last for a ResNet-18 of `width` on `device_type`.

    On CUDA, always. On a CPU, only from width 16. In torch 2.14 the backward pass of a
    channels_last, stride-2, 1x1 convolution crashes oneDNN (a segfault or heap corruption) when
    it has few input channels: 2 to 7 on one thread on an AVX2 EPYC, 8 on two threads on another
    CPU; at 16 and more it never did. The narrowest such convolution here has `width` input
    channels, so the rule keeps channels_last where it is safe and measured faster (1.1x to 1.3x
    at widths 16 and 64). tests/test_crash_regression.py keeps the ten-line reproduction.
    """
    if device_type == "cuda":
        return True
    return device_type == "cpu" and width >= 16


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


def resolve_switches(config, device) -> Switches:
    """The switches `config` (a `TrainConfig`) asks for on `device`: "auto" decided here."""
    if not config.fast:
        return REFERENCE
    device = torch.device(device)
    cuda = device.type == "cuda"

    def pick(value, auto: bool) -> bool:
        return auto if value == AUTO else bool(value)

    bf16 = pick(config.bf16, cuda and native_bf16(device))
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
