"""Time the chapter's input pipeline alone, one process, for `perf.scaling.CHAPTER_LOADER_S`.

    .venv/bin/python tools/time_loader.py            # seconds an image at 28 px and at 64 px

d2l's loader: each image a PIL image, `ToTensor` (after `Resize(64)` at 64 px), batched by a
`DataLoader`; here with no worker processes (`num_workers=0`), so the figure is one core's, and
the time model multiplies it by d2l's 4 workers. Batch 256, random uint8 images (the CPU is
timed, not the disk), 30 batches after one of warm-up, best of 3 rounds.
"""
from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader
from torchvision import transforms

from mgpu_lib.lab.d2l import PILImages
from mgpu_lib.devices import describe_devices


def seconds_an_image(size: int, batch: int = 256, batches: int = 30, rounds: int = 3) -> float:
    images = torch.randint(0, 256, ((batches + 1) * batch, 28, 28), dtype=torch.uint8)
    labels = torch.zeros(len(images), dtype=torch.long)
    steps = ([transforms.Resize(size)] if size != 28 else []) + [transforms.ToTensor()]
    data = PILImages(images, labels, transforms.Compose(steps))
    best = float("inf")
    for _ in range(rounds):
        it = iter(DataLoader(data, batch_size=batch, shuffle=True, num_workers=0))
        next(it)                                   # warm-up
        t0 = time.perf_counter()
        n = sum(len(x) for x, _ in it)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> int:
    print(f"on {describe_devices([torch.device('cpu')])}, torch {torch.__version__}")
    for size in (28, 64):
        s = seconds_an_image(size)
        print(f"{size} px: {s * 1e6:.1f} us an image ({1 / s:,.0f} images/s a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
