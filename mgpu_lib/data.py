"""Fashion-MNIST from a local copy, the official download, or synthetic data, in one loader.

`source="auto"` tries a named folder (`root`, or `MGPU_FASHION_MNIST_DIR`), then torchvision's
download into `MGPU_DATA_DIR` (default `data/`), then, only with `allow_synthetic=True` and
announced, synthetic data. `load_fashion_mnist` keeps the uint8 images on the device and turns
each batch into floats in [0, 1]. The chapter's own pipeline over the same tensors (a
`DataLoader` whose workers pass every image through PIL and `ToTensor`) is D2L's code, in
`mgpu_lib.lab.d2l`.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Iterator, Optional, Union

import torch
from torch.utils.data.distributed import DistributedSampler

# The four files and the shapes Fashion-MNIST's have.
FILES = {
    "train_labels": ("train-labels-idx1-ubyte", (60000,)),
    "test_labels": ("t10k-labels-idx1-ubyte", (10000,)),
    "test_images": ("t10k-images-idx3-ubyte", (10000, 28, 28)),
    "train_images": ("train-images-idx3-ubyte", (60000, 28, 28)),
}
NUM_CLASSES = 10        # t-shirt, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag, boot
SOURCES = ("auto", "local", "torchvision", "synthetic")


class DataError(RuntimeError):
    """Data that is missing, corrupt or truncated; the message names the folder."""


def read_folder(folder: Union[str, Path]) -> dict[str, torch.Tensor]:
    """The four tensors from a folder of Fashion-MNIST files, gzipped or not (Kaggle's are not),
    in it or in torchvision's `FashionMNIST/raw` below it. torchvision's reader reads them (a
    gzipped file inflated into a temporary folder: the folder itself is never written); any
    failure, or a shape that is not Fashion-MNIST's, is one `DataError` line naming the folder."""
    from torchvision.datasets.mnist import read_image_file, read_label_file
    from torchvision.datasets.utils import extract_archive

    folder, out, stem = Path(folder), {}, ""
    try:
        with tempfile.TemporaryDirectory(prefix="mgpu-fashion-") as tmp:
            for key, (stem, _) in FILES.items():
                here = [p for sub in (folder, folder / "FashionMNIST" / "raw")
                        for p in (sub / stem, sub / f"{stem}.gz") if p.is_file()]
                path = here[0] if here else folder / f"{stem}.gz"
                if path.suffix == ".gz":
                    path = extract_archive(path, tmp)
                out[key] = (read_label_file if "labels" in key else read_image_file)(str(path))
    except Exception as e:          # missing, truncated, not gzip, not IDX: torchvision's words
        cause = " ".join(f"{stem}: {type(e).__name__}: {e}".split()).rstrip(":")
        raise DataError(f"the Fashion-MNIST folder {folder} could not be read ({cause})") from None
    for key, (stem, dims) in FILES.items():
        if tuple(out[key].shape) != dims or "labels" in key and int(out[key].max()) >= 10:
            raise DataError(f"the Fashion-MNIST folder {folder}: {stem} is not Fashion-MNIST's "
                            f"(shape {tuple(out[key].shape)}, expected {dims}, labels 0-9)")
        out[key] = out[key].to(torch.uint8)
    return out


def data_root() -> Path:
    """`MGPU_DATA_DIR`, else `data/` at the repository root (or the working directory)."""
    if os.environ.get("MGPU_DATA_DIR"):
        return Path(os.environ["MGPU_DATA_DIR"])
    repo = Path(__file__).resolve().parent.parent
    return repo / "data" if (repo / "pyproject.toml").exists() else Path("data")


def download(root: Union[str, Path, None] = None) -> Path:
    """torchvision's download (each file's MD5 checked) into `root/FashionMNIST/raw`, through a
    temporary folder: a failed download leaves nothing half-written in `root`."""
    from torchvision.datasets import FashionMNIST

    root = Path(root) if root is not None else data_root()
    if all((root / "FashionMNIST" / "raw" / stem).is_file() for stem, _ in FILES.values()):
        return root
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        FashionMNIST(tmp, train=True, download=True)
        shutil.rmtree(root / "FashionMNIST", ignore_errors=True)
        os.replace(Path(tmp) / "FashionMNIST", root / "FashionMNIST")
    return root


def synthetic_fashion_mnist(n_train: int = 60000, n_test: int = 10000,
                            seed: int = 1234) -> dict[str, torch.Tensor]:
    """Learnable stand-in data with Fashion-MNIST's shapes and dtypes: each image is its class's
    fixed random blob pattern, shifted by up to 2 pixels, plus noise."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(NUM_CLASSES, 1, 7, 7, generator=g)
    templates = torch.nn.functional.interpolate(coarse, size=(28, 28), mode="bilinear",
                                                align_corners=False)[:, 0] * 200

    def make(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = (torch.arange(n) % NUM_CLASSES)[torch.randperm(n, generator=g)]
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
    """Indices of a fixed, class-balanced subset of `limit` samples (all if None): `limit // C`
    a class, the first `limit % C` classes one more, chosen at random by `seed`."""
    n = labels.shape[0]
    if limit is None or limit >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    classes = torch.unique(labels).tolist()
    picks = []
    for k, c in enumerate(classes):
        want = limit // len(classes) + (1 if k < limit % len(classes) else 0)
        idx = torch.nonzero(labels == c).flatten()
        picks.append(idx[torch.randperm(len(idx), generator=g)[:want]])
    return torch.sort(torch.cat(picks)).values


def shard_indices(n: int, rank: int, world_size: int, epoch: int, seed: int = 0) -> torch.Tensor:
    """What rank `rank`'s `DistributedSampler` yields in `epoch`: disjoint shards of the `n`
    samples (up to `world_size - 1` repeated, so that every rank runs as many steps)."""
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed)
    sampler.set_epoch(epoch)    # without it every epoch would reuse the first epoch's order
    return torch.tensor(list(sampler), dtype=torch.int64)


class DeviceLoader:
    """Batches from uint8 tensors that live on `device`, as floats in [0, 1].

    Shuffled, each pass draws the next `torch.randperm` from a generator seeded once: two
    loaders with one seed yield the same batches. With `world_size` > 1, rank `rank` gets its
    `DistributedSampler` shard of the epoch `set_epoch` set. `drop_last` skips a final partial
    batch (in training, a few images give BatchNorm useless statistics and a full step).
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 shuffle: bool, device: Union[str, torch.device, None] = None, seed: int = 0,
                 source: str = "unknown", drop_last: bool = False, rank: int = 0,
                 world_size: int = 1):
        self.device = torch.device(device or "cpu")
        self.images = images.to(self.device)
        self.labels = labels.to(self.device, torch.int64)
        self.batch_size, self.shuffle, self.source = batch_size, shuffle, source
        self.rank, self.world_size, self.seed, self.epoch = rank, world_size, seed, 0
        self.per_rank = math.ceil(len(self.labels) / world_size)   # DistributedSampler's count
        self.drop_last = drop_last and self.per_rank >= batch_size
        self._gen = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose shard the next pass yields (as `DistributedSampler.set_epoch`)."""
        self.epoch = epoch

    def __len__(self) -> int:
        n, b = self.per_rank, self.batch_size
        return n // b if self.drop_last else math.ceil(n / b)

    def _order(self) -> torch.Tensor:
        n = len(self.labels)
        if self.world_size > 1:
            return shard_indices(n, self.rank, self.world_size, self.epoch, self.seed)
        return torch.randperm(n, generator=self._gen) if self.shuffle else torch.arange(n)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order().to(self.device)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            idx = order[start:start + self.batch_size]
            yield self.images[idx].unsqueeze(1).float().div_(255), self.labels[idx]


def load_raw(source: str = "auto", root: Union[str, Path, None] = None,
             allow_synthetic: bool = False) -> tuple[dict[str, torch.Tensor], str]:
    """The four uint8 tensors and their source's name. A named folder (`root`, or
    `MGPU_FASHION_MNIST_DIR`) is a promise: missing or bad, it is a `DataError`. Synthetic data
    stands in, with a warning, only where nothing was named, the download failed, and the
    caller allows it."""
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
    """Fashion-MNIST as `(train_iter, test_iter)`, two `DeviceLoader`s on `device` (default
    CPU). `train_limit`, `test_limit`: fixed class-balanced subsets (None: every image); `seed`
    seeds the training shuffle; `eval_batch_size`: the test batch (default `batch_size`)."""
    xtr, ytr, xte, yte, origin = load_subsets(source, root, allow_synthetic, train_limit,
                                              test_limit)
    train_iter = DeviceLoader(xtr, ytr, batch_size, shuffle=True, device=device, seed=seed,
                              source=origin, drop_last=True)
    test_iter = DeviceLoader(xte, yte, eval_batch_size or batch_size, shuffle=False,
                             device=device, seed=seed, source=origin)
    return train_iter, test_iter
