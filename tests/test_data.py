import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mgpu_lib import data
from mgpu_lib.data import DataError, balanced_subset, load_fashion_mnist, read_idx


def write_idx(path: Path, tensor: torch.Tensor, magic=None, cut: int = 0) -> Path:
    dims = tuple(tensor.shape)
    magic = magic if magic is not None else (0x800 | len(dims))
    raw = struct.pack(f">{1 + len(dims)}I", magic, *dims) + tensor.numpy().tobytes()
    with gzip.open(path, "wb") as f:
        f.write(raw[:len(raw) - cut])
    return path


def write_folder(folder: Path, n_train=40, n_test=20, **corrupt) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw = data.synthetic_fashion_mnist(n_train, n_test, seed=3)
    for key, stem in data.FILES.items():
        write_idx(folder / f"{stem}.gz", raw[key], **corrupt.get(key, {}))
    return folder


def test_read_idx_roundtrip(tmp_path):
    x = torch.randint(0, 256, (3, 28, 28), dtype=torch.uint8)
    assert torch.equal(read_idx(write_idx(tmp_path / "a.gz", x), 3), x)


def test_bad_magic_is_a_data_error_naming_the_file(tmp_path):
    folder = write_folder(tmp_path / "fm", train_images={"magic": 0x1234})
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz: bad IDX magic"):
        load_fashion_mnist(8, source="local", root=folder)


def test_truncated_file_is_a_data_error(tmp_path):
    folder = write_folder(tmp_path / "fm", test_labels={"cut": 5})
    with pytest.raises(DataError, match=r"fm/t10k-labels-idx1-ubyte.gz: expected 20 data bytes"):
        load_fashion_mnist(8, source="local", root=folder)


def test_not_gzip_is_a_data_error(tmp_path):
    folder = write_folder(tmp_path / "fm")
    (folder / "train-labels-idx1-ubyte.gz").write_bytes(b"not a gzip file at all")
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte.gz: cannot read"):
        load_fashion_mnist(8, source="local", root=folder)


def test_missing_folder_and_unknown_source(tmp_path):
    with pytest.raises(DataError, match="named by root does not exist"):
        load_fashion_mnist(8, source="local", root=tmp_path / "nope")
    with pytest.raises(ValueError, match="unknown data source"):
        load_fashion_mnist(8, source="web")


def test_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    """A download that writes a corrupt file is refused, and the data root stays clean."""
    import torchvision.datasets

    class CorruptDownload:
        def __init__(self, root, train=True, download=False):
            raw_dir = Path(root) / "FashionMNIST" / "raw"
            write_folder(raw_dir, train_images={"cut": 100})

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", CorruptDownload)
    with pytest.raises(DataError, match="train-images"):
        data.download(tmp_path)
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
    assert train_iter.num_samples == 1000 and len(train_iter) == 15    # 1000 // 64
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
