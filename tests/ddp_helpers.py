"""Shared by the DDP tests: a tiny job's config, finding a worker process by its rank (psutil,
on any platform), error files written as torch writes them, and a worker made to raise."""
import os
import time
from pathlib import Path

import psutil
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from mgpu_lib.book.profiles import get_profile
from mgpu_lib.training import TrainConfig

# On PYTHONPATH, this folder's sitecustomize makes a DDP worker raise MGPU_TEST_RAISE.
HOOKS = Path(__file__).resolve().parent / "worker_hooks"


def source() -> str:
    """The local copy where there is one (fast, real); synthetic data elsewhere (no network)."""
    local = os.environ.get("MGPU_FASHION_MNIST_DIR")
    return "local" if local and Path(local).is_dir() else "synthetic"


def tiny(**kw) -> TrainConfig:
    base = dict(width=4, num_epochs=1, train_limit=400, test_limit=100, data_source=source())
    base.update(kw)
    return get_profile("smoke").config(**base)


def workers() -> list:
    """The DDP workers below this test process."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "RANK" in p.environ() and "worker" in p.cmdline():
                found.append(p)
        except psutil.Error:
            continue
    return found


def rank_pid(rank: int) -> int:
    """The pid of a DDP worker below this test process whose RANK is `rank`, or 0."""
    for p in workers():
        try:
            if p.environ().get("RANK") == str(rank):
                return p.pid
        except psutil.Error:
            continue
    return 0


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def write_error_file(log_dir: Path, rank: int, error: BaseException, monkeypatch) -> Path:
    """`error`, raised and recorded by torch's own ErrorHandler where torchrun puts rank
    `rank`'s error file (`<log_dir>/<run>/attempt_0/<rank>/error.json`)."""
    path = Path(log_dir) / "none_abc" / "attempt_0" / str(rank) / "error.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise error
    except BaseException as e:
        ErrorHandler().record_exception(e)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    return path


def wait_for(condition, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return False
