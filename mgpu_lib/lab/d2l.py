"""D2L 12.6's own code (PyTorch, d2l 1.0.3), kept to show its behaviour and to time against:
its lazy network, init and training loop, which the book's `mg.resnet18` and `mg.train` fix,
and its input pipeline (`load_fashion_mnist_chapter`: PIL and `ToTensor` per image in worker
processes), which the core's device-resident `mg.load_fashion_mnist` replaces.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from ..data import load_subsets


def lazy_resnet18(num_classes: int = 10, width: int = 64) -> nn.Sequential:
    """D2L's ResNet-18 as the chapter builds it: residual blocks of lazy layers, which learn
    their input size at the first forward pass; until then their weights are
    `UninitializedParameter`s and their class is `LazyConv2d`, not `Conv2d`."""
    class LazyResidual(nn.Module):
        def __init__(self, channels: int, use_1x1conv: bool = False, strides: int = 1):
            super().__init__()
            self.conv1 = nn.LazyConv2d(channels, 3, padding=1, stride=strides)
            self.conv2 = nn.LazyConv2d(channels, 3, padding=1)
            self.conv3 = nn.LazyConv2d(channels, 1, stride=strides) if use_1x1conv else None
            self.bn1, self.bn2 = nn.LazyBatchNorm2d(), nn.LazyBatchNorm2d()

        def forward(self, x):
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (self.conv3(x) if self.conv3 is not None else x))

    w = width
    net = nn.Sequential(nn.Conv2d(1, w, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(w), nn.ReLU())
    for i, (channels, first) in enumerate([(w, True), (2 * w, False), (4 * w, False),
                                           (8 * w, False)], start=1):
        net.add_module(f"resnet_block{i}", nn.Sequential(
            LazyResidual(channels, use_1x1conv=not first, strides=1 if first else 2),
            LazyResidual(channels)))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net


def chapter_init_weights(net: nn.Module, std: float = 0.01) -> int:
    """The chapter's init, `type(m) in [nn.Linear, nn.Conv2d]`; returns how many layers it reached.
    The exact type test skips `LazyConv2d` layers that have not seen data yet."""
    reached = 0
    for m in net.modules():
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.normal_(m.weight, std=std)
            reached += 1
    return reached


def chapter_step(net: nn.Module, trainer, loss, device):
    """The body of the chapter's training loop, as `step(X, y)`. It reads nothing back
    to the host: the chapter's loop only draws test accuracy, once per epoch."""
    def step(X, y):
        trainer.zero_grad()
        X, y = X.to(device), y.to(device)
        l = loss(net(X), y)
        l.backward()
        trainer.step()
    return step


def evaluate_accuracy_gpu(net: nn.Module, data_iter, train_mode: bool = False) -> float:
    """D2L's `evaluate_accuracy_gpu`: eval mode (`train_mode`: BatchNorm uses each batch's own
    statistics, for `lab.drop`), and the count of correct predictions read back every batch."""
    net.train(train_mode)
    device = next(iter(net.parameters())).device
    correct = total = 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            correct += float((net(X).argmax(dim=1).type(y.dtype) == y).sum())
            total += y.numel()
    return correct / total


def train(net: nn.Module, devices, train_iter, test_iter, lr: float, num_epochs: int = 10) -> dict:
    """D2L 12.6's `train(net, num_gpus, batch_size, lr)`, refactored (no Animator, the step
    factored out, the data and the devices passed in): the test accuracy and seconds of every
    epoch (`time.perf_counter` for `d2l.Timer`: no synchronize)."""
    chapter_init_weights(net)                 # net.apply(init_weights)
    net = nn.DataParallel(net, device_ids=devices)
    trainer = torch.optim.SGD(net.parameters(), lr)
    step = chapter_step(net, trainer, nn.CrossEntropyLoss(), devices[0])
    out = {"test_acc": [], "epoch_seconds": []}
    for epoch in range(num_epochs):
        net.train()
        t0 = time.perf_counter()
        for X, y in train_iter:
            step(X, y)
        out["epoch_seconds"].append(time.perf_counter() - t0)
        out["test_acc"].append(evaluate_accuracy_gpu(net, test_iter))
    return out


# ---- the chapter's input pipeline -------------------------------------------------------------

class PILImages(Dataset):
    """uint8 images served as torchvision's `FashionMNIST` serves them: each item becomes a PIL
    image, then goes through `transform` (default `ToTensor`) in the loader's workers."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None):
        from torchvision import transforms
        self.images, self.labels = images.cpu(), labels.cpu().to(torch.int64)
        self.transform = transform or transforms.ToTensor()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        from PIL import Image
        image = Image.fromarray(self.images[i].numpy())     # a 2-D uint8 array: mode "L"
        return self.transform(image), int(self.labels[i])


class PermutationSampler(Sampler):
    """`DeviceLoader`'s order: one `torch.randperm` per epoch from a generator seeded once, so
    both loops see the same images in the same order (`RandomSampler` drifts after epoch 1)."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.generator = n, torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).tolist())


def chapter_workers(requested: Optional[int] = None) -> int:
    """Worker processes for the chapter's loader: its 4 (`get_dataloader_workers()`), capped at
    the usable cores, where more would only compete with training. A request above 4 a core (64
    at most) is refused: each worker is a process with a copy of the data."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if requested is None:
        return min(4, cores)
    if not 0 <= requested <= min(4 * cores, 64):
        raise ValueError(f"DataLoader workers must be 0 to {min(4 * cores, 64)} here ({cores} "
                         f"usable cores: 4 a core, 64 at most), got {requested}")
    return requested


def chapter_loader(images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                   shuffle: bool, seed: int = 0, num_workers: Optional[int] = None,
                   source: str = "unknown") -> DataLoader:
    """The chapter's loader over uint8 tensors: PIL + `ToTensor` per image, worker processes;
    training drops a final partial batch, as `DeviceLoader` does."""
    dataset = PILImages(images, labels)
    sampler = PermutationSampler(len(dataset), seed) if shuffle else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                        drop_last=shuffle and len(dataset) >= batch_size,
                        num_workers=chapter_workers(num_workers),
                        generator=torch.Generator().manual_seed(seed))
    loader.source = source         # where the data came from, as a `DeviceLoader` says
    return loader


def load_fashion_mnist_chapter(batch_size: int, *, source: str = "auto",
                               train_limit: Optional[int] = None, test_limit: Optional[int] = None,
                               seed: int = 0, allow_synthetic: bool = False
                               ) -> tuple[DataLoader, DataLoader]:
    """The images of `load_fashion_mnist`, through the chapter's pipeline (on the CPU), with
    `chapter_workers()` worker processes."""
    xtr, ytr, xte, yte, origin = load_subsets(source, None, allow_synthetic, train_limit,
                                              test_limit)
    return (chapter_loader(xtr, ytr, batch_size, shuffle=True, seed=seed, source=origin),
            chapter_loader(xte, yte, batch_size, shuffle=False, seed=seed, source=origin))


def chapter_data(config) -> tuple[DataLoader, DataLoader]:
    """`config`'s data through the chapter's pipeline: what `mg.train(config, data=...)` takes
    to run the chapter's loop in full (`fast=False`: the chapter's loader, fp32, NCHW)."""
    return load_fashion_mnist_chapter(config.batch_size, source=config.data_source,
                                      train_limit=config.train_limit, test_limit=config.test_limit,
                                      seed=config.seed, allow_synthetic=config.allow_synthetic)
