"""Shared by the DDP tests: a tiny job's config, and finding a worker process by its rank."""
import os
from pathlib import Path

from mgpu_lib import supervise
from mgpu_lib.profiles import get_profile
from mgpu_lib.train import TrainConfig


def source() -> str:
    """The local copy where there is one (fast, real); synthetic data elsewhere (no network)."""
    local = os.environ.get("MGPU_FASHION_MNIST_DIR")
    return "local" if local and Path(local).is_dir() else "synthetic"


def tiny(**kw) -> TrainConfig:
    base = dict(width=4, num_epochs=1, train_limit=400, test_limit=100, data_source=source())
    base.update(kw)
    return TrainConfig.from_profile(get_profile("smoke"), **base)


def rank_pid(rank: int) -> int:
    """The pid of a DDP worker below this test process whose RANK is `rank`, or 0."""
    for pid in supervise._descendants(os.getpid()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"worker" in cmdline:
            return pid
    return 0
