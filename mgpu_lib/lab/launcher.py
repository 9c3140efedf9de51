"""DDP jobs from Python: `launch` trains with the DDP program (`torchrun -m mgpu_lib.ddp`),
`run_ranks` runs any rank program (the trace's too). The real torchrun starts the ranks; added
is only what a notebook or a command line needs of it:
- nothing outlives the call. Ctrl-C, SIGTERM and SIGHUP (in a `job_folder`), a timeout or an
  exception stop every process of the job; a launcher killed outright leaves that to its
  reaper (`reaper.py`), which also removes the job's folder;
- a failed rank in one line (`failures`); a rank still running SHUTDOWN_GRACE_S after another
  failed, or after the result was saved, is killed (torchrun would wait 30 s, or forever).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path

import psutil

from ..config import TrainConfig
from ..ddp import (COLLECTIVE_TIMEOUT_S, LOG, check_fresh, choose_backend, cpu_threads,
                   load_checkpoint, local_batch_size)
from ..devices import DeviceError, num_gpus
from ..training import TrainResult
from .failures import Ended, LaunchError, failure, read_failures  # noqa: F401 (LaunchError)
from .reaper import MARK, kill_job

SHUTDOWN_GRACE_S, POLL_S = 5, 0.2
RANK_BYTES = 2**30      # one gloo rank's own memory, measured: 1.3 GB at width 64, 0.8 at 16
_REAPED: set = set()    # the folders whose reaper runs


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while a job ran: stopped as Ctrl-C stops it; exit status 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(f"terminated ({signal.Signals(signum).name})")
        self.exit_code = 128 + signum


def check_nprocs(nprocs: int, backend: str) -> None:
    """Refuse more processes than devices (nccl: one a GPU; gloo: one a core, though 2 on any
    CPU) or memory: a DeviceError."""
    cores, free = os.cpu_count() or 1, psutil.virtual_memory().available
    if backend == "nccl" and nprocs > num_gpus():
        raise DeviceError(f"{nprocs} nccl processes need {nprocs} GPUs; this machine has "
                          f"{num_gpus()}")
    if backend == "gloo" and nprocs > max(2, cores):
        raise DeviceError(f"{nprocs} gloo processes are more than this machine's {cores} CPU "
                          f"cores; use at most {max(2, cores)}")
    if nprocs * RANK_BYTES > free:
        raise DeviceError(f"{nprocs} DDP processes need about {nprocs * RANK_BYTES / 2**30:.1f}"
                          f" GB of memory; {free / 2**30:.1f} GB is available")


def rank_env(backend: str, nprocs: int) -> dict:
    """Unbuffered output; on a CPU each rank's share of the cores; Windows' torch has no libuv."""
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(cpu_threads(nprocs)) if backend == "gloo" else "1")
    return {**env, "USE_LIBUV": env.get("USE_LIBUV", "0")} if os.name == "nt" else env


def popen_options() -> dict:
    """Apart from our terminal's Ctrl-C and hang-up: we stop the job ourselves."""
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


@contextmanager
def _reaped(folder: Path):
    """While inside, `folder`'s reaper waits; on leaving, or if we die, it ends the job."""
    reaper = subprocess.Popen([sys.executable, str(Path(__file__).with_name("reaper.py")),
                               str(folder)], stdin=subprocess.PIPE, **popen_options())
    _REAPED.add(str(folder))
    try:
        yield
    finally:
        _REAPED.discard(str(folder))
        reaper.stdin.close()
        reaper.wait(60)


@contextmanager
def job_folder(prefix: str):
    """A new folder for one job, its reaper started before it exists. SIGTERM and SIGHUP raise
    `Terminated` meanwhile (main thread only)."""
    signals = [getattr(signal, s) for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _terminated) for s in signals} if main else {}
    try:
        folder = Path(tempfile.gettempdir()) / f"{prefix}{secrets.token_hex(6)}"
        with _reaped(folder):
            folder.mkdir(mode=0o700)
            yield folder
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _terminated(signum, frame):
    raise Terminated(signum)


def run_ranks(args: list, nprocs: int, job, *, env: dict, timeout_s: float, log=None,
              done=None) -> Ended:
    """`torchrun --standalone` runs `python ARGS` as ranks 0..nprocs-1; rank 0's lines go to
    `log`. `job`: a folder the job owns, removed with it; `done`: a file that means the work is
    saved. A failure is a LaunchError, or a RankInputError (a ValueError) for a refused input."""
    job = Path(job)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max_restarts=0",
           f"--nproc_per_node={nprocs}", f"--log_dir={job / 'logs'}", "--no_python",
           sys.executable, "-u", *args]
    (job / "tmp").mkdir(exist_ok=True)      # the ranks' temporary files go with the job
    env = {**env, MARK: str(job), "TMPDIR": str(job / "tmp")}
    with nullcontext() if str(job) in _REAPED else _reaped(job):
        ended = supervise(cmd, env, timeout_s, log, job / "logs", done)
    if ended.code != 0 and not (done and Path(done).exists()):
        raise failure(read_failures(job / "logs", ended), ended)
    return ended


def supervise(cmd, env, timeout_s: float, log=None, logs=None, done=None) -> Ended:
    """Run `cmd`, passing rank 0's lines to `log`; SHUTDOWN_GRACE_S after a rank's error file
    appears under `logs` (or `done` does), kill the ranks still running; stop all on timeout
    or any exception."""
    tail: deque = deque(maxlen=200)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace", **popen_options())
    reader = threading.Thread(target=_pump, args=(proc, tail, log), daemon=True)
    reader.start()
    ended, deadline, since, ranks = Ended(-1), time.monotonic() + timeout_s, None, {}
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
            ranks.update(_ranks(proc.pid))
            wrote = {int(f.parent.name) for f in Path(logs).rglob("error.json")} if logs else ()
            if since is None and (wrote or (done and Path(done).exists())):
                since = time.monotonic()
            elif since is not None and time.monotonic() - since > SHUTDOWN_GRACE_S:
                left = {r: p for r, p in ranks.items() if p.is_running()}
                ended.stopped.update(set(left) - set(wrote))    # hung: no error of their own
                stop_all(list(left.values()), grace_s=0)
                since = float("inf")
    finally:
        if proc.poll() is None:     # a timeout, an interrupt or another error
            stop(proc, env.get(MARK))
    reader.join(5)
    ended.code, ended.lines = proc.returncode, list(tail)
    if time.monotonic() >= deadline and ended.code != 0:
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


def _ranks(pid: int) -> dict:
    found = {}
    for p in tree(pid):
        with suppress(psutil.Error, KeyError, ValueError):
            found[int(p.environ()["RANK"])] = p
    return found


def tree(pid: int) -> list:
    """Every process below `pid`, or none if `pid` is gone."""
    with suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def stop_all(procs: list, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Terminate `procs` (kill them, with no `grace_s`); after `grace_s`, kill the rest."""
    for p in procs:
        with suppress(psutil.Error):
            p.terminate() if grace_s else p.kill()
    for p in psutil.wait_procs(procs, timeout=grace_s)[1]:
        with suppress(psutil.Error):
            p.kill()


def stop(proc: subprocess.Popen, mark=None) -> None:
    """Kill torchrun, what runs below it, and what carries `mark` (a rank it was starting)."""
    stop_all(tree(proc.pid) + [psutil.Process(proc.pid)], grace_s=0)
    proc.wait()
    if mark:
        kill_job(mark)


def launch(config: TrainConfig, nprocs: int, *, backend: str = "auto", timeout_s: float = 3600,
           collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, checkpoint=None,
           resume: bool = False, log=None) -> TrainResult:
    """Train `config` (its batch the global one) with the DDP program on `nprocs` processes;
    rank 0's result. `log` gets rank 0's lines; past `timeout_s` all stops. A DeviceError
    (`check_nprocs`), a RankInputError (bad input) or a LaunchError (a rank failed)."""
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)          # refuse bad input before starting
    check_nprocs(nprocs, backend)
    if checkpoint:      # a bad checkpoint, or another run's, is refused now
        load_checkpoint(checkpoint, config, nprocs) if resume else check_fresh(checkpoint)
    with job_folder("mgpu-ddp-") as job:
        (job / "config.json").write_text(json.dumps(config.to_dict()), encoding="utf-8")
        args = ["-m", "mgpu_lib.ddp", "--config", str(job / "config.json"), "--out",
                str(job / "result.json"), "--backend", backend, "--timeout",
                str(collective_timeout_s)]
        args += ["--checkpoint", str(checkpoint)] + ["--resume"] * resume if checkpoint else []
        run_ranks(args, nprocs, job, env=rank_env(backend, nprocs), timeout_s=timeout_s,
                  log=log, done=job / "result.json")
        return TrainResult.from_dict(json.loads((job / "result.json").read_text(
            encoding="utf-8")), "the DDP job's result")
