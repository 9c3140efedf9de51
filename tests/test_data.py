import gzip
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mgpu_lib import data
from mgpu_lib.data import DataError, DeviceLoader, balanced_subset, load_fashion_mnist


def idx(dims: tuple, magic=None) -> bytes:
    """An IDX file of zeros with Fashion-MNIST's `dims` (zeros inflate ~1000x: KBs on disk)."""
    magic = 0x800 | len(dims) if magic is None else magic
    return struct.pack(f">{1 + len(dims)}I", magic, *dims) + bytes(math.prod(dims))


@pytest.fixture(scope="module")
def good_files(tmp_path_factory) -> dict:
    """The four files at Fashion-MNIST's sizes, gzipped, by key."""
    folder = tmp_path_factory.mktemp("good")
    out = {}
    for key, (stem, dims) in data.FILES.items():
        out[key] = folder / f"{stem}.gz"
        out[key].write_bytes(gzip.compress(idx(dims), compresslevel=1))
    return out


def folder_with(folder: Path, good_files: dict, name: str = "", content: bytes = b"") -> Path:
    """A Fashion-MNIST folder of links to `good_files`, and `content` as the file `name` (a name
    without .gz shadows the gzipped one: an uncompressed file is read first, as Kaggle ships)."""
    folder.mkdir(parents=True)
    for path in good_files.values():
        (folder / path.name).symlink_to(path)
    if name:
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_bytes(content)
    return folder


def listing(folder: Path):
    return sorted((p.name, p.lstat().st_mtime_ns) for p in folder.iterdir())


def test_a_good_folder_is_read_by_torchvision_and_never_written(tmp_path, good_files):
    folder = folder_with(tmp_path / "fm", good_files)
    before = listing(folder)
    raw = data.read_folder(folder)
    assert raw["train_images"].shape == (60000, 28, 28) and raw["test_labels"].shape == (10000,)
    assert raw["train_images"].dtype == torch.uint8 and int(raw["train_labels"].max()) == 0
    assert listing(folder) == before
    # torchvision's own layout (a download) is found too; an inflated file is read as it is
    raw_dir = folder_with(tmp_path / "root" / "FashionMNIST" / "raw", good_files)
    (raw_dir / "t10k-labels-idx1-ubyte").write_bytes(idx((10000,)))
    assert data.read_folder(tmp_path / "root")["test_labels"].shape == (10000,)


BAD = {   # a bad file of each kind: whatever torchvision says, it is one line naming the folder
    "truncated gzip": ("t10k-labels-idx1-ubyte.gz", gzip.compress(idx((10000,)))[:-20]),
    "truncated data": ("t10k-labels-idx1-ubyte.gz", gzip.compress(idx((10000,))[:-5])),
    "truncated, uncompressed": ("t10k-labels-idx1-ubyte", idx((10000,))[:-5]),
    "not gzip": ("train-labels-idx1-ubyte.gz", b"not a gzip file at all"),
    "empty": ("train-labels-idx1-ubyte", b""),
    "not IDX": ("t10k-images-idx3-ubyte.gz", gzip.compress(idx((10000, 28, 28), 0x1234)[:64])),
    "wrong shape": ("t10k-labels-idx1-ubyte.gz", gzip.compress(idx((40,)))),
    "label 10": ("t10k-labels-idx1-ubyte.gz", gzip.compress(idx((10000,))[:-1] + b"\x0a")),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_file_is_one_data_error_line_naming_the_folder(tmp_path, good_files, case):
    folder = folder_with(tmp_path / "fm", good_files, *BAD[case])
    before = listing(folder)
    with pytest.raises(DataError) as e:
        load_fashion_mnist(8, source="local", root=folder)
    assert "\n" not in str(e.value) and str(folder) in str(e.value)
    assert listing(folder) == before


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_a_named_folder_that_is_not_one_is_one_line_naming_it(tmp_path, what):
    named = tmp_path / "fm"
    if what == "a file":
        named.write_bytes(b"")
    with pytest.raises(DataError) as e:
        load_fashion_mnist(8, source="local", root=named)
    assert "\n" not in str(e.value) and str(named) in str(e.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as e:         # a folder without the files
        data.read_folder(empty)
    assert "\n" not in str(e.value) and str(empty) in str(e.value)
    assert list(empty.iterdir()) == []


def test_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    """A download that fails half-way (torchvision's MD5 check) leaves the data root clean."""
    import torchvision.datasets

    class CorruptDownload:
        def __init__(self, root, train=True, download=False):
            raw_dir = Path(root) / "FashionMNIST" / "raw"
            raw_dir.mkdir(parents=True)
            (raw_dir / "train-images-idx3-ubyte.gz").write_bytes(b"half a file")
            raise RuntimeError("File not found or corrupted.")

    monkeypatch.setenv("MGPU_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", CorruptDownload)
    with pytest.raises(DataError, match=r"could not be downloaded \(RuntimeError: File not"):
        data.load_raw("torchvision")
    assert list(tmp_path.iterdir()) == []


def test_no_data_without_synthetic_is_a_clear_error(tmp_path, monkeypatch):
    import torchvision.datasets

    class Offline:
        def __init__(self, *a, **k):
            raise OSError("network unreachable")

    monkeypatch.delenv("MGPU_FASHION_MNIST_DIR", raising=False)
    monkeypatch.setenv("MGPU_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", Offline)
    with pytest.raises(DataError, match="MGPU_FASHION_MNIST_DIR"):
        load_fashion_mnist(8)
    with pytest.warns(UserWarning, match="SYNTHETIC data"):
        train_iter, _ = load_fashion_mnist(8, allow_synthetic=True, train_limit=100,
                                           test_limit=10)
    assert train_iter.source == "synthetic"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_named_folder_that_is_missing_never_falls_back_to_synthetic(tmp_path, monkeypatch):
    """Before: MGPU_FASHION_MNIST_DIR=/nope trained on synthetic data with exit 0 (smoke)."""
    monkeypatch.setenv("MGPU_FASHION_MNIST_DIR", str(tmp_path / "nope"))
    with pytest.raises(DataError, match="named by MGPU_FASHION_MNIST_DIR does not exist"):
        load_fashion_mnist(8, allow_synthetic=True)
    run = subprocess.run([sys.executable, "-m", "mgpu_lib", "train", "--profile", "smoke"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, MGPU_FASHION_MNIST_DIR=str(tmp_path / "nope")))
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "does not exist" in run.stderr


def test_balanced_subset_is_fixed_and_balanced():
    labels = torch.arange(1000) % 10
    a, b = balanced_subset(labels, 95), balanced_subset(labels, 95)
    assert torch.equal(a, b) and len(a) == 95 and len(set(a.tolist())) == 95
    counts = torch.bincount(labels[a], minlength=10)
    assert counts.max() - counts.min() <= 1


@pytest.mark.slow
def test_real_data_shapes_dtypes_balance_and_seed(fashion_dir):
    train_iter, test_iter = load_fashion_mnist(64, root=fashion_dir, train_limit=1000,
                                               test_limit=200, seed=7)
    x, y = next(iter(train_iter))
    assert x.shape == (64, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (64,) and y.dtype == torch.int64
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.9   # ToTensor's [0, 1] scale
    assert train_iter.images.dtype == torch.uint8                 # stored compactly
    assert len(train_iter.labels) == 1000 and len(train_iter) == 15    # 1000 // 64
    assert [len(y) for _, y in train_iter] == [64] * 15     # no 40-image last batch in training
    assert sum(len(y) for _, y in test_iter) == 200          # evaluation keeps every image
    assert torch.bincount(train_iter.labels, minlength=10).tolist() == [100] * 10
    assert torch.bincount(test_iter.labels, minlength=10).tolist() == [20] * 10
    again, _ = load_fashion_mnist(64, root=fashion_dir, train_limit=1000, test_limit=200, seed=7)
    x2, y2 = next(iter(again))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    other, _ = load_fashion_mnist(64, root=fashion_dir, train_limit=1000, test_limit=200, seed=8)
    assert not torch.equal(y, next(iter(other))[1])


def test_full_real_copy_has_the_standard_counts(fashion_dir):
    raw = data.read_folder(fashion_dir)
    assert raw["train_images"].shape == (60000, 28, 28)
    assert raw["test_images"].shape == (10000, 28, 28)
    assert torch.bincount(raw["train_labels"].long()).tolist() == [6000] * 10


def test_synthetic_has_fashion_mnist_shapes():
    raw = data.synthetic_fashion_mnist(100, 50)
    assert raw["train_images"].shape == (100, 28, 28) and raw["train_images"].dtype == torch.uint8
    assert torch.equal(raw["test_labels"], data.synthetic_fashion_mnist(100, 50)["test_labels"])


def test_one_loader_shards_for_ddp_as_distributed_sampler_does():
    """`DeviceLoader(rank=, world_size=)` yields the rank's `shard_indices` for the epoch set by
    `set_epoch`, as floats in [0, 1], dropping a last partial batch (it was ddp.ShardLoader)."""
    n, world = 10, 3
    images = torch.arange(n, dtype=torch.uint8)[:, None, None].expand(n, 28, 28)
    for epoch in (0, 1):
        seen = []
        for rank in range(world):
            loader = DeviceLoader(images, torch.arange(n), 2, shuffle=True, seed=5,
                                  drop_last=True, rank=rank, world_size=world)
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(loader) == len(batches) == 2          # 4 per rank: 2 full batches
            x = torch.cat([x for x, _ in batches])
            y = torch.cat([y for _, y in batches])
            assert torch.equal(y, data.shard_indices(n, rank, world, epoch, seed=5)[:4])
            assert torch.equal(x[:, 0, 0, 0], y.float() / 255)
            seen.append(y)
        if epoch == 0:
            first = seen
    assert any(not torch.equal(a, b) for a, b in zip(first, seen))   # set_epoch reshuffles
