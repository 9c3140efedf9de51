"""Shared by the DDP tests: a tiny job's config, finding a worker process by its rank (psutil,
on any platform), failure records made as torch's agent makes them, and a worker made to raise."""
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

from mgpu_lib.book.profiles import get_profile
from mgpu_lib.lab.reaper import tree
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
    """The DDP ranks below this test process (torchrun gives each a RANK)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "RANK" in p.environ():
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


def failed(log_dir: Path, rank: int, monkeypatch, error: BaseException = None,
           exitcode: int = 1, pid: int = 0) -> ProcessFailure:
    """Rank `rank`'s failure as the launcher reads it: torch's `ProcessFailure`, from the error
    file `error` was recorded in, or (no `error`) from the exit code alone."""
    path = write_error_file(log_dir, rank, error, monkeypatch) if error else log_dir / "none"
    return ProcessFailure(rank, pid or 100 + rank, exitcode, str(path))


def wait_for(condition, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return False


def ranks_below(pid: int) -> list:
    """The DDP ranks (processes with a RANK) below `pid`."""
    found = []
    for p in tree(pid):
        try:
            if "RANK" in p.environ():
                found.append(p)
        except psutil.Error:
            continue
    return found


def signal_job(argv: list, tmp_path: Path, sig: int, nranks: int = 2) -> tuple:
    """Run `python -m mgpu_lib ARGV` with TMPDIR=`tmp_path`, and send it `sig` once its ranks
    run: (its exit code, its stderr, every process it had started by then)."""
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "mgpu_lib", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if not wait_for(lambda: len(ranks_below(proc.pid)) == nranks, 180):
            proc.kill()
            pytest.fail(f"no job started: {proc.communicate()[1][-2000:]}")
        started = tree(proc.pid)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, started


def gone(procs: list, timeout_s: float = 30) -> bool:
    """Whether every one of `procs` has exited within `timeout_s`."""
    return wait_for(lambda: not any(alive(p.pid) for p in procs), timeout_s)
