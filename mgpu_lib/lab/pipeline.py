"""What the CPU should do instead of training: prepare the next batch while the device trains.

Measured over a few dozen batches, with random-crop and flip augmentation:
- a torchvision `DataLoader` with per-sample PIL transforms at `num_workers` 0, 1 and 2
  (`pin_memory` and `prefetch_factor` where a GPU exists);
- the same loader with `num_workers=0`, overlapped with compute by a background thread;
- device-resident data (`DeviceLoader`) augmented in batches on the device itself.
Each is timed alone (how fast can it deliver?) and feeding a training step.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ..chapter import PILImages
from ..data import DeviceLoader
from ..hetero import forward_backward
from .bench import images_per_second


def augment_batch(x: torch.Tensor, generator: torch.Generator = None) -> torch.Tensor:
    """Random 28x28 crop of the 2-pixel zero-padded batch, and a random horizontal flip, per
    image, as a few batched tensor ops on `x`'s device (no per-sample Python)."""
    b, c, h, w = x.shape
    shift = torch.randint(0, 5, (2, b), generator=generator).to(x.device)
    flip = torch.rand(b, generator=generator).to(x.device) < 0.5
    padded = F.pad(x, (2, 2, 2, 2))
    rows = (shift[0, :, None] + torch.arange(h, device=x.device))[:, :, None]
    cols = (shift[1, :, None] + torch.arange(w, device=x.device))[:, None, :]
    out = padded[torch.arange(b, device=x.device)[:, None, None], :, rows, cols]
    out = out.permute(0, 3, 1, 2)                 # [B, H, W, C] -> [B, C, H, W]
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def data_loader(images, labels, batch_size: int, num_workers: int, *, device,
                seed: int = 0) -> torch.utils.data.DataLoader:
    """The classic per-sample CPU pipeline (PIL image, RandomCrop(28, padding=2),
    RandomHorizontalFlip, ToTensor); pinned memory and two batches prefetched per worker on
    CUDA."""
    from torchvision import transforms
    augment = transforms.Compose([transforms.RandomCrop(28, padding=2),
                                  transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    extra = dict(prefetch_factor=2) if num_workers > 0 else {}
    return torch.utils.data.DataLoader(
        PILImages(images, labels, augment), batch_size=batch_size, shuffle=True,
        num_workers=num_workers, pin_memory=torch.device(device).type == "cuda",
        generator=torch.Generator().manual_seed(seed), **extra)


def prefetch(batches: Iterable, device, depth: int = 2) -> Iterator:
    """Yield `batches` moved to `device`, prepared by a background thread `depth` ahead, so the
    next batch is built while the current one trains."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work():
        try:
            for x, y in batches:
                if stop.is_set():
                    return
                q.put((x.to(device, non_blocking=True), y.to(device, non_blocking=True)))
        except BaseException as e:     # hand the error to the consumer
            q.put(e)
        q.put(done)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():          # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.01)


def device_batches(images, labels, batch_size: int, *, device, seed: int = 0) -> Iterator:
    """Device-resident data (`DeviceLoader`), augmented in batches on the device."""
    g = torch.Generator().manual_seed(seed)
    for x, y in DeviceLoader(images, labels, batch_size, shuffle=True, device=device, seed=seed):
        yield augment_batch(x, g), y


@dataclass(frozen=True)
class PipelineResult:
    name: str
    load_ips: float     # images/s the input pipeline delivers on its own (moved to the device)
    train_ips: float    # images/s of training steps fed by it


def pipelines(images, labels, batch_size: int, device) -> dict[str, Callable[[], Iterable]]:
    """The pipelines compared, by name; each value makes a fresh iterator of batches."""
    def loader(w):
        return lambda: data_loader(images, labels, batch_size, w, device=device)
    return {
        "DataLoader, 0 workers": loader(0),
        "DataLoader, 1 worker": loader(1),
        "DataLoader, 2 workers": loader(2),
        "DataLoader, 0 workers + prefetch thread": lambda: prefetch(loader(0)(), device),
        "device-resident + batched augment": lambda: device_batches(
            images, labels, batch_size, device=device),
    }


def measure_pipelines(net: nn.Module, images, labels, batch_size: int, device, *,
                      steps: int = 24) -> tuple[float, list[PipelineResult]]:
    """(compute-only images/s on one fixed batch, one `PipelineResult` per pipeline).

    Training runs forward, backward and an SGD step on `net` (which it changes), on `device`.
    Images must be uint8 [N, 28, 28] on the CPU, with at least (steps + 2) x batch_size of them.
    """
    device = torch.device(device)
    net = net.to(device).train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def train_step(x, y):
        optimizer.zero_grad(set_to_none=True)
        forward_backward(net, x, y, loss_fn)
        optimizer.step()

    def rate(make_batches, step=None) -> float:
        batches = iter(make_batches())
        images_per_second(batches, 2, device, step)     # warm-up: worker start-up not timed
        return images_per_second(batches, steps, device, step)

    fixed = next(iter(device_batches(images, labels, batch_size, device=device)))
    compute = rate(lambda: iter(lambda: fixed, None), train_step)
    return compute, [PipelineResult(name, rate(make), rate(make, train_step))
                     for name, make in pipelines(images, labels, batch_size, device).items()]
