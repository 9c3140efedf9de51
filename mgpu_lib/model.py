"""The chapter's ResNet-18 for 28x28 inputs, built with eager layers: unlike D2L's lazy ones,
every layer knows its input size up front, so the init reaches every layer and the parameter
count is known before any data flows."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Residual(nn.Module):
    """The residual block of ResNet (He et al., 2016), as in D2L section 8.6."""

    def __init__(self, in_channels: int, out_channels: int, use_1x1conv: bool = False,
                 strides: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv3 = (nn.Conv2d(in_channels, out_channels, 1, stride=strides)
                      if use_1x1conv else None)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def resnet_block(in_channels: int, out_channels: int, num_residuals: int,
                 first_block: bool = False) -> nn.Sequential:
    """One stage: the first block halves the resolution unless it is the first stage."""
    blocks = []
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blocks.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
        else:
            blocks.append(Residual(out_channels, out_channels))
    return nn.Sequential(*blocks)


def resnet18(num_classes: int = 10, in_channels: int = 1, width: int = 64) -> nn.Sequential:
    """The chapter's ResNet-18 (3x3 stride-1 stem, no max-pool), with its module names.
    `width` is the first stage's channels (then 2x, 4x, 8x): 64 is the chapter's model
    (11,175,818 parameters), 16 a CPU-friendly one of the same structure."""
    w = width
    net = nn.Sequential(nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(w), nn.ReLU())
    net.add_module("resnet_block1", resnet_block(w, w, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(w, 2 * w, 2))
    net.add_module("resnet_block3", resnet_block(2 * w, 4 * w, 2))
    net.add_module("resnet_block4", resnet_block(4 * w, 8 * w, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net


def init_weights(net: nn.Module, std: float = 0.01) -> nn.Module:
    """The chapter's init: N(0, std^2) weights for every Conv2d and Linear. Returns `net`."""
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(m.weight, std=std)
    return net


def num_params(net: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def block_shapes(net: nn.Sequential, input_shape=(1, 1, 28, 28)) -> list[tuple[str, tuple]]:
    """Output shape (without the batch dimension) after each top-level module."""
    x = torch.zeros(input_shape)
    shapes = []
    was_training = net.training
    net.eval()
    with torch.no_grad():
        for name, layer in net.named_children():
            x = layer(x)
            shapes.append((name, tuple(x.shape[1:])))
    net.train(was_training)
    return shapes


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """True when two models hold identical parameters and buffers."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)
