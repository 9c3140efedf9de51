"""What the CPU should do instead of training: prepare the next batch while the device trains.
`measure_pipelines` times each of `pipelines` (random crop and flip) alone and feeding training.
"""
from __future__ import annotations

from collections import deque, namedtuple
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ..data import DeviceLoader
from .d2l import PILImages
from ..hetero import forward_backward
from .bench import images_per_second


def augment_batch(x: torch.Tensor, generator: torch.Generator = None) -> torch.Tensor:
    """Random 28x28 crop of the 2-pixel zero-padded batch, and a random horizontal flip, per
    image, as a few batched tensor ops on `x`'s device (no per-sample Python)."""
    b, c, h, w = x.shape
    shift = torch.randint(0, 5, (2, b), generator=generator).to(x.device)
    flip = torch.rand(b, generator=generator).to(x.device) < 0.5
    rows = (shift[0, :, None] + torch.arange(h, device=x.device))[:, :, None]
    cols = (shift[1, :, None] + torch.arange(w, device=x.device))[:, None, :]
    out = F.pad(x, (2, 2, 2, 2))[torch.arange(b, device=x.device)[:, None, None], :, rows, cols]
    out = out.permute(0, 3, 1, 2)                 # [B, H, W, C] -> [B, C, H, W]
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def data_loader(images, labels, batch_size: int, num_workers: int, *, device,
                seed: int = 0) -> torch.utils.data.DataLoader:
    """The classic per-sample CPU pipeline (PIL image, crop, flip, ToTensor); pinned memory on
    CUDA, and two batches prefetched per worker (torch's default)."""
    from torchvision import transforms
    augment = transforms.Compose([transforms.RandomCrop(28, padding=2),
                                  transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    return torch.utils.data.DataLoader(
        PILImages(images, labels, augment), batch_size=batch_size, shuffle=True,
        num_workers=num_workers, pin_memory=torch.device(device).type == "cuda",
        generator=torch.Generator().manual_seed(seed))


def prefetch(batches: Iterable, device, depth: int = 2) -> Iterator:
    """Yield `batches` moved to `device`, prepared by a background thread `depth` ahead, so the
    next batch is built while the current one trains."""
    it = iter(batches)

    def load():     # one worker thread: batches are built in order, and its errors reach us
        x, y = next(it)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    with ThreadPoolExecutor(1) as pool:     # closing the generator waits for those in flight
        ahead = deque(pool.submit(load) for _ in range(depth))
        while True:
            try:
                batch = ahead.popleft().result()
            except StopIteration:
                return
            ahead.append(pool.submit(load))
            yield batch


def device_batches(images, labels, batch_size: int, *, device, seed: int = 0) -> Iterator:
    """Device-resident data (`DeviceLoader`), augmented in batches on the device."""
    g = torch.Generator().manual_seed(seed)
    for x, y in DeviceLoader(images, labels, batch_size, shuffle=True, device=device, seed=seed):
        yield augment_batch(x, g), y


# images/s the pipeline `name` delivers on its own (moved to the device), and of training fed by it
PipelineResult = namedtuple("PipelineResult", "name load_ips train_ips")


def pipelines(images, labels, batch_size: int, device) -> dict[str, Callable[[], Iterable]]:
    """The pipelines compared, by name; each value makes a fresh iterator of batches."""
    def loader(w):
        return lambda: data_loader(images, labels, batch_size, w, device=device)
    return {**{f"DataLoader, {w} worker{'' if w == 1 else 's'}": loader(w) for w in (0, 1, 2)},
            "DataLoader, 0 workers + prefetch thread": lambda: prefetch(loader(0)(), device),
            "device-resident + batched augment":
                lambda: device_batches(images, labels, batch_size, device=device)}


def measure_pipelines(net: nn.Module, images, labels, batch_size: int, device, *,
                      steps: int = 24) -> tuple[float, list[PipelineResult]]:
    """(compute-only images/s on one fixed batch, one `PipelineResult` per pipeline). Training
    (SGD) changes `net`; images: uint8 [N, 28, 28] on the CPU, N >= (steps + 2) x batch_size."""
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
