"""Fashion-MNIST from a local copy, the official download, or synthetic data; batches on device.

Sources, in the order `source="auto"` tries them:
1. `local`: the four `*-ubyte.gz` files in a folder (`root`, or `MGPU_FASHION_MNIST_DIR`);
2. `torchvision`: the official download into `MGPU_DATA_DIR` (default `data/` at the repo root);
3. `synthetic`: only with `allow_synthetic=True`, and always announced.

Images stay uint8 on the target device; the iterator turns each batch into floats in [0, 1]
(what the chapter's `ToTensor` does) with no per-sample PIL work. The chapter's own pipeline,
built from the same tensors, is `chapter.load_fashion_mnist_chapter`.
"""
from __future__ import annotations

import gzip
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path
import warnings
from typing import Iterator, Optional, Union

import torch

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CLASSES = ("t-shirt", "trouser", "pullover", "dress", "coat",
           "sandal", "shirt", "sneaker", "bag", "ankle boot")
SOURCES = ("auto", "local", "torchvision", "synthetic")
_MAGIC = {1: 0x801, 3: 0x803}   # IDX: unsigned byte data, 1 dim (labels) or 3 dims (images)


class DataError(RuntimeError):
    """Data that is missing, corrupt or truncated; the message names the file."""


def _name(path: Path) -> str:
    """A file named with its folder, e.g. 'fashion-mnist/t10k-labels-idx1-ubyte.gz'."""
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def read_idx(path: Union[str, Path], ndim: int) -> torch.Tensor:
    """Read a (gzipped) IDX file of unsigned bytes with `ndim` dimensions, validating it."""
    path = Path(path)
    name = _name(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{name}: cannot read ({e})") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{name}: truncated header ({len(raw)} bytes)")
    magic, *dims = struct.unpack(f">{1 + ndim}I", raw[:header])
    if magic != _MAGIC[ndim]:
        raise DataError(f"{name}: bad IDX magic {magic:#x}, expected {_MAGIC[ndim]:#x}")
    expected = math.prod(dims)
    if len(raw) - header != expected:
        raise DataError(f"{name}: expected {expected} data bytes for shape {tuple(dims)}, "
                        f"found {len(raw) - header} (truncated or corrupt)")
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def _find(folder: Path, stem: str) -> Optional[Path]:
    for name in (stem + ".gz", stem):
        for sub in (folder, folder / "FashionMNIST" / "raw"):
            if (sub / name).is_file():
                return sub / name
    return None


def read_folder(folder: Union[str, Path]) -> dict[str, torch.Tensor]:
    """The four tensors from a folder of standard Fashion-MNIST files, validated together."""
    folder = Path(folder)
    out = {}
    for key, stem in FILES.items():
        path = _find(folder, stem)
        if path is None:
            raise DataError(f"{stem}.gz not found in the Fashion-MNIST folder {folder}")
        out[key] = read_idx(path, 3 if key.endswith("images") else 1)
    for split in ("train", "test"):
        images, labels = out[f"{split}_images"], out[f"{split}_labels"]
        if images.shape[0] != labels.shape[0] or tuple(images.shape[1:]) != (28, 28):
            raise DataError(f"{split} files disagree: images {tuple(images.shape)}, "
                            f"labels {tuple(labels.shape)}")
        if labels.numel() and int(labels.max()) >= len(CLASSES):
            raise DataError(f"{FILES[split + '_labels']}: label {int(labels.max())} out of range")
    return out


def data_root() -> Path:
    """`MGPU_DATA_DIR`, else `data/` at the repository root (or the working directory)."""
    if os.environ.get("MGPU_DATA_DIR"):
        return Path(os.environ["MGPU_DATA_DIR"])
    repo = Path(__file__).resolve().parent.parent
    return repo / "data" if (repo / "pyproject.toml").exists() else Path("data")


def download(root: Union[str, Path, None] = None) -> Path:
    """The official download through torchvision, into `root/FashionMNIST/raw`.

    It downloads into a temporary folder beside the target, validates the files, then renames,
    so an interrupted or failed download leaves nothing half-written in the data root.
    """
    from torchvision.datasets import FashionMNIST

    root = Path(root) if root is not None else data_root()
    target = root / "FashionMNIST"
    if _find(root, FILES["train_images"]) is not None:
        return root
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=root))
    try:
        FashionMNIST(str(tmp), train=True, download=True)
        read_folder(tmp)                       # refuse to install corrupt files
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp / "FashionMNIST", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def synthetic_fashion_mnist(n_train: int = 60000, n_test: int = 10000,
                            seed: int = 1234) -> dict[str, torch.Tensor]:
    """Deterministic, learnable stand-in data with Fashion-MNIST's shapes and dtypes.

    Each class is a fixed random blob pattern; every image is its class pattern, shifted by up
    to 2 pixels, plus noise. A small CNN learns it well above chance within an epoch.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(len(CLASSES), 1, 7, 7, generator=g)
    templates = torch.nn.functional.interpolate(coarse, size=(28, 28), mode="bilinear",
                                                align_corners=False)[:, 0] * 200

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(n) % len(CLASSES)
        labels = labels[torch.randperm(n, generator=g)]
        images = templates[labels]
        shifts = torch.randint(-2, 3, (2,), generator=g).tolist()
        images = torch.roll(images, shifts=shifts, dims=(1, 2))
        images = images + 40 * torch.randn(images.shape, generator=g)
        return images.clamp(0, 255).to(torch.uint8), labels.to(torch.uint8)

    train_images, train_labels = make(n_train)
    test_images, test_labels = make(n_test)
    return {"train_images": train_images, "train_labels": train_labels,
            "test_images": test_images, "test_labels": test_labels}


def balanced_subset(labels: torch.Tensor, limit: Optional[int], seed: int = 0) -> torch.Tensor:
    """Indices of a fixed, class-balanced subset of `limit` samples (all indices if None).

    Classes get `limit // C` samples each, the first `limit % C` classes one more; within a class
    the samples are a fixed random choice (seed 0 by default, so every run sees the same subset).
    """
    n = labels.shape[0]
    if limit is None or limit >= n:
        return torch.arange(n)
    if limit < 1:
        raise ValueError(f"limit must be positive, got {limit}")
    g = torch.Generator().manual_seed(seed)
    classes = torch.unique(labels).tolist()
    picks = []
    for k, c in enumerate(classes):
        want = limit // len(classes) + (1 if k < limit % len(classes) else 0)
        idx = torch.nonzero(labels == c).flatten()
        picks.append(idx[torch.randperm(len(idx), generator=g)[:want]])
    return torch.sort(torch.cat(picks)).values


class DeviceLoader:
    """Batches from uint8 tensors that live on `device`, shuffled by `torch.randperm`.

    Each pass draws the next permutation from a generator seeded once, so two loaders with the
    same seed yield the same batches, epoch after epoch. `drop_last` skips a final partial batch:
    for training, where a batch of a handful of images gives BatchNorm useless statistics and
    a full learning-rate step from a tiny sample (a 5,000-image subset at batch 128 would end
    every epoch on 8 images, right before evaluation).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 shuffle: bool, device: Union[str, torch.device, None] = None, seed: int = 0,
                 source: str = "unknown", drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.device = torch.device(device or "cpu")
        self.images = images.to(self.device)
        self.labels = labels.to(self.device, torch.int64)
        self.batch_size, self.shuffle, self.source = batch_size, shuffle, source
        self.drop_last = drop_last and len(self.labels) >= batch_size
        self._gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n, b = len(self.labels), self.batch_size
        return n // b if self.drop_last else math.ceil(n / b)

    @property
    def num_samples(self) -> int:
        return len(self.labels)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.labels)
        order = (torch.randperm(n, generator=self._gen).to(self.device) if self.shuffle
                 else torch.arange(n, device=self.device))
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            idx = order[start:start + self.batch_size]
            x = self.images[idx].unsqueeze(1).float().div_(255)
            yield x, self.labels[idx]


def load_raw(source: str = "auto", root: Union[str, Path, None] = None,
             allow_synthetic: bool = False) -> tuple[dict[str, torch.Tensor], str]:
    """The four uint8 tensors and the name of the source they came from.

    A folder that was named (`root`, or `MGPU_FASHION_MNIST_DIR`) is a promise: if it is missing
    or bad, that is a `DataError` naming it. Synthetic data stands in only when nothing was named,
    the download failed, and the caller allows it (with a warning).
    """
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; valid: {', '.join(SOURCES)}")
    if source == "synthetic":
        return synthetic_fashion_mnist(), "synthetic"
    named = "root" if root else "MGPU_FASHION_MNIST_DIR"
    local = root or os.environ.get("MGPU_FASHION_MNIST_DIR")
    if source == "local" and not local:
        raise DataError("source='local' needs a folder: pass root= or set MGPU_FASHION_MNIST_DIR")
    if local and source in ("auto", "local"):
        if not Path(local).is_dir():
            what = "is not a folder" if Path(local).exists() else "does not exist"
            raise DataError(f"the Fashion-MNIST folder named by {named} {what}: {local}")
        return read_folder(local), "local"
    try:
        return read_folder(download(data_root())), "torchvision"
    except DataError:
        raise
    except Exception as e:            # no network, HTTP errors, ...
        if source == "auto" and allow_synthetic:
            warnings.warn("Fashion-MNIST is not available here, so this run uses SYNTHETIC data "
                          "(same shapes; accuracies are not Fashion-MNIST figures)", stacklevel=2)
            return synthetic_fashion_mnist(), "synthetic"
        raise DataError(
            f"Fashion-MNIST could not be downloaded ({type(e).__name__}: {e}). Set "
            "MGPU_FASHION_MNIST_DIR to a folder holding the four *-ubyte.gz files, "
            "or connect to the network and retry.") from None


def load_subsets(source, root, allow_synthetic, train_limit, test_limit):
    """The four tensors, cut to the fixed class-balanced subsets, and the source's name."""
    raw, origin = load_raw(source, root, allow_synthetic)
    tr = balanced_subset(raw["train_labels"], train_limit)
    te = balanced_subset(raw["test_labels"], test_limit)
    return (raw["train_images"][tr], raw["train_labels"][tr],
            raw["test_images"][te], raw["test_labels"][te], origin)


def load_fashion_mnist(batch_size: int, *, root=None, source: str = "auto",
                       train_limit: Optional[int] = None, test_limit: Optional[int] = None,
                       device=None, seed: int = 0, allow_synthetic: bool = False,
                       eval_batch_size: Optional[int] = None
                       ) -> tuple[DeviceLoader, DeviceLoader]:
    """Fashion-MNIST as two device-resident iterators, `(train_iter, test_iter)`.

    Args:
        batch_size: images per batch.
        root: a folder with the four files (implies a local copy); default from the environment.
        source: "auto", "local", "torchvision" or "synthetic".
        train_limit, test_limit: fixed class-balanced subsets; None keeps every image.
        device: where the images live and batches are produced (default CPU).
        seed: seeds the training shuffle.
        allow_synthetic: let "auto" fall back to synthetic data when nothing real is found.
        eval_batch_size: the test iterator's batch (default `batch_size`).
    """
    xtr, ytr, xte, yte, origin = load_subsets(source, root, allow_synthetic, train_limit,
                                              test_limit)
    train_iter = DeviceLoader(xtr, ytr, batch_size, shuffle=True, device=device, seed=seed,
                              source=origin, drop_last=True)
    test_iter = DeviceLoader(xte, yte, eval_batch_size or batch_size, shuffle=False,
                             device=device, seed=seed, source=origin)
    return train_iter, test_iter
