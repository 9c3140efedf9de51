"""The network's arithmetic: FLOPs per image (counted by torch, or computed from the shapes),
parameters, and the memory a training step holds, for the time model, the benchmarks and the
bounds on width and batch. Pure arithmetic on `model.resnet18`'s shapes; nothing trains."""
from __future__ import annotations

import copy
from typing import Optional

import psutil
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode


def count_flops(net: nn.Module, input_shape=(1, 1, 28, 28), train: bool = False) -> int:
    """FLOPs per image as torch's `FlopCounterMode` counts them: convolutions and matrix
    products, 1 multiply-add = 2 FLOPs (BatchNorm, ReLU and pooling, well under 1%, are not).
    With `train`, one forward and backward of the cross-entropy loss, as a training step does;
    else the forward alone. A copy of `net` runs on the meta device, so nothing is computed."""
    meta = copy.deepcopy(net).to("meta").train(train)
    x = torch.zeros(input_shape, device="meta")
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(train):
        out = meta(x)
        if train:
            F.cross_entropy(out, torch.zeros(len(x), dtype=torch.long, device="meta")).backward()
    return counter.get_total_flops() // input_shape[0]


def forward_flops(net: nn.Module, input_shape=(1, 1, 28, 28)) -> int:
    """Forward FLOPs per image (`count_flops`); it follows `width` and the input size."""
    return count_flops(net, input_shape)


def train_flops(net: nn.Module, input_shape=(1, 1, 28, 28)) -> int:
    """FLOPs per image of a training step, forward and backward, as `FlopCounterMode` counts."""
    return count_flops(net, input_shape, train=True)


def _convs(width: int, size: int = 28) -> list[tuple[int, ...]]:
    """(in channels, out channels, kernel, output side) of each convolution of
    `resnet18(width=width)` on `size` x `size` one-channel images: what its FLOPs, parameters
    and activations follow from, with no network built."""
    w, side = width, size
    convs = [(1, w, 3, side)]
    for i, (cin, cout) in enumerate(((w, w), (w, 2 * w), (2 * w, 4 * w), (4 * w, 8 * w))):
        side = side if i == 0 else (side + 1) // 2       # stride 2: a 3x3 (pad 1) or a 1x1
        convs += [(cin, cout, 3, side), (cout, cout, 3, side)]
        convs += ([(cin, cout, 1, side)] if i else []) + [(cout, cout, 3, side)] * 2
    return convs


def resnet18_flops(width: int = 64, size: int = 28, train: bool = False) -> int:
    """`count_flops` of `resnet18(...)` on `size`-pixel images, computed, not counted: 2 x kernel
    area x input channels per convolution output, 2 x in x out for the linear layer; a training
    step 3x that (two gradients per layer) less the stem's input gradient, which nothing needs."""
    fwd = sum(2 * k * k * cin * cout * s * s for cin, cout, k, s in
              _convs(width, size)) + 2 * 8 * width * 10         # 10 classes
    return 3 * fwd - 2 * 9 * width * size * size if train else fwd


def resnet18_params(width: int = 64) -> int:
    """`num_params(resnet18(...))`, computed: each convolution's weights and bias, a BatchNorm
    (2 per channel) after each 3x3 convolution, and the linear layer (10 classes)."""
    return sum(k * k * cin * cout + cout + 2 * cout * (k == 3)
               for cin, cout, k, _ in _convs(width, 1)) + (8 * width + 1) * 10


def train_bytes(width: int, batch: int, size: int = 28) -> int:
    """About the bytes one device holds to train `batch` images: fp32 weights and gradients
    (plain SGD keeps no state) and, for the backward pass, about 3 saved tensors per
    convolution output (its own, its BatchNorm's, its ReLU's)."""
    acts = sum(cout * s * s for _, cout, _, s in _convs(width, size))
    return 4 * (2 * resnet18_params(width) + 3 * batch * acts)


def check_width(width: int, batch: int, devices: Optional[int] = None,
                available: Optional[int] = None) -> None:
    """A one-line ValueError, before anything is allocated, when `train_bytes` of `width` at
    `batch` split over `devices` (default: every GPU, else the CPU) exceeds `available` bytes
    (default: the first GPU's memory where CUDA exists, else psutil's available host memory)."""
    gpus = torch.cuda.device_count()
    n = devices or max(1, gpus)
    free = available if available is not None else (
        torch.cuda.get_device_properties(0).total_memory if gpus else
        psutil.virtual_memory().available)
    need = train_bytes(width, -(-batch // n))
    if need > free:
        lo, hi = 0, width                        # the widest that fits, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if train_bytes(mid, -(-batch // n)) <= free else (lo, mid - 1)
        raise ValueError(f"width {_big(width)} at batch {batch} needs about "
                         f"{_big(need // 10**9)} GB and this machine has {free / 1e9:.1f} GB; "
                         f"the widest that fits is {lo}")


def _big(n: int) -> str:
    """An integer as digits, or as a power of ten once it is too long to read."""
    return f"{n:,}" if n < 10 ** 15 else f"10^{int(n.bit_length() * 0.30103)}"
