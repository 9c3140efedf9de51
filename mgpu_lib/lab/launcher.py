"""DDP jobs from Python: `launch` trains with the DDP program (`torchrun -m mgpu_lib.ddp`),
`run_ranks` runs any rank program (the trace's too), under the real torchrun. Nothing outlives
the call (Ctrl-C, a timeout or an exception stops the job; if this process dies instead, its
reaper does: `reaper.py`), and a failed or hung rank is named in one line (`failures.py`).
"""
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from ..config import TrainConfig
from ..ddp import COLLECTIVE_TIMEOUT_S, LOG, choose_backend, cpu_threads, local_batch_size
from ..devices import DeviceError, num_gpus
from ..training import TrainResult
from .failures import Ended, LaunchError, failure, read_failures  # noqa: F401 (LaunchError)
from .reaper import MARK, kill_ranks, reaped, stop, stop_all, tree  # noqa: F401 (tree, stop_all)

SHUTDOWN_GRACE_S, POLL_S = 5, 0.2


def check_nprocs(nprocs: int, backend: str) -> None:
    """A DeviceError for more processes than devices (nccl: a GPU each; gloo: a core, or 2)."""
    cores = os.cpu_count() or 1
    if backend == "nccl" and nprocs > num_gpus():
        raise DeviceError(f"{nprocs} nccl processes need {nprocs} GPUs; this machine has "
                          f"{num_gpus()}")
    if backend == "gloo" and nprocs > max(2, cores):
        raise DeviceError(f"{nprocs} gloo processes are more than this machine's {cores} CPU "
                          f"cores; use at most {max(2, cores)}")


def rank_env(backend: str, nprocs: int) -> dict:
    """Unbuffered; a gloo rank's share of the cores; no libuv on Windows."""
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(cpu_threads(nprocs)) if backend == "gloo" else "1")
    return {**env, "USE_LIBUV": env.get("USE_LIBUV", "0")} if os.name == "nt" else env


def popen_options() -> dict:
    """Apart from our terminal's Ctrl-C and hang-up: we stop the job ourselves."""
    return ({"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if os.name == "nt"
            else {"start_new_session": True})


@contextmanager
def job_folder(prefix: str):
    """A new folder for one job, its reaper started before it exists."""
    folder = Path(tempfile.gettempdir()) / f"{prefix}{secrets.token_hex(6)}"
    with reaped(folder, popen_options()):
        folder.mkdir(mode=0o700)
        yield folder


def run_ranks(args: list, nprocs: int, job, *, env: dict, timeout_s: Optional[float] = None,
              log=None, done=None) -> Ended:
    """`torchrun --standalone` runs `python ARGS` as ranks 0..nprocs-1; rank 0's lines go to
    `log`. `job`: the job's `job_folder`, removed with it; `done`: a file that means the work is
    saved. A failure is a LaunchError, or a RankInputError (a ValueError) for a refused input."""
    job = Path(job)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max_restarts=0",
           f"--nproc_per_node={nprocs}", f"--log_dir={job / 'logs'}", "--no_python",
           sys.executable, "-u", *args]
    (job / "tmp").mkdir(exist_ok=True)      # the ranks' temporary files go with the job
    env = {**env, MARK: str(job), "TMPDIR": str(job / "tmp")}
    ended = supervise(cmd, env, timeout_s, log, job / "logs", done)
    if ended.code != 0 and not (done and Path(done).exists()):
        raise failure(read_failures(job / "logs", ended), ended)
    return ended


def supervise(cmd, env, timeout_s: Optional[float], log=None, logs=None, done=None) -> Ended:
    """Run `cmd`, passing rank 0's lines to `log`; stop all after `timeout_s` seconds (None:
    no limit; the collective timeout finds a hung rank) or on any exception. SHUTDOWN_GRACE_S
    after a rank's error file appears under `logs` (or `done` does), kill the ranks still
    running: torchrun would wait 30 s for one that ignores its SIGTERM (it hung)."""
    tail: deque = deque(maxlen=200)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace", **popen_options())
    reader = threading.Thread(target=_pump, args=(proc, tail, log), daemon=True)
    reader.start()
    ended, since, late = Ended(-1), None, False
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
            wrote = {int(f.parent.name) for f in Path(logs).rglob("error.json")} if logs else ()
            if since is None and (wrote or (done and Path(done).exists())):
                since = time.monotonic()
            elif since is not None and time.monotonic() - since > SHUTDOWN_GRACE_S:
                ended.stopped = kill_ranks(proc.pid) - set(wrote)   # hung: no error of their own
                since = float("inf")
    finally:
        if proc.poll() is None:     # a timeout, an interrupt or another error
            late = time.monotonic() >= deadline
            stop(proc)
    reader.join(5)
    ended.code, ended.lines = proc.returncode, list(tail)
    if late:        # not by its exit code: one psutil reaped reads as 0 (Popen's ECHILD)
        raise LaunchError(f"DDP job timed out after {timeout_s:g} s (a rank hung or is too "
                          f"slow) and was stopped; last output: {ended.last}")
    return ended


def _pump(proc: subprocess.Popen, tail: deque, log) -> None:
    for line in proc.stdout:
        tail.append(line.rstrip())
        if log is not None and line.startswith(LOG):
            try:
                log(line.rstrip()[len(LOG):])
            except Exception:       # a broken `log` must not stop the reading
                log = None


def launch(config: TrainConfig, nprocs: int, *, backend: str = "auto",
           timeout_s: Optional[float] = None,
           collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, checkpoint=None,
           resume: bool = False, log=None) -> TrainResult:
    """Train `config` (its batch the global one) with the DDP program on `nprocs` processes;
    rank 0's result. `log` gets rank 0's lines. No wall-clock limit unless `timeout_s` is given:
    a rank that stops answering fails the job after `collective_timeout_s`. A DeviceError
    (`check_nprocs`), a RankInputError (a rank refused its input) or a LaunchError."""
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)          # refuse bad input before starting
    check_nprocs(nprocs, backend)
    with job_folder("mgpu-ddp-") as job:
        given, out = job / "config.json", job / "result.json"
        given.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        args = ["-m", "mgpu_lib.ddp", "--config", str(given), "--out", str(out), "--backend",
                backend, "--timeout", str(collective_timeout_s)]
        args += ["--checkpoint", str(checkpoint)] + ["--resume"] * resume if checkpoint else []
        run_ranks(args, nprocs, job, env=rank_env(backend, nprocs), timeout_s=timeout_s,
                  log=log, done=out)
        return TrainResult(**json.loads(out.read_text(encoding="utf-8")))   # the program's
