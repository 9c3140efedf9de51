"""Running DDP ranks from Python: `launch` trains on N processes; `run_ranks` runs any rank
entry point (`trace.trace_ddp`'s too). Rank 0's progress is echoed, nothing outlives the call,
and a failure is one line that names the rank and its exception.

    python -m mgpu_lib.lab.launcher JOB_DIR     # the agent that `run_ranks` starts

torch launches: the agent runs `elastic_launch` (what torchrun runs), which starts the ranks,
stops them once one fails, and describes each failed rank as a `ProcessFailure` (exit code or
signal, and the exception its `@record` wrote), saved as JSON. It is a process of its own
because torch's agent takes the main thread's signal handlers and never gives them back.
Kept here is what torch does not do for a notebook or a command line, each for its reason:
- the agent watches its parent (a kernel killed outright sends nothing, and a parent-death
  signal is Linux's alone); then it stops the ranks as on SIGTERM and removes the job's folder;
- `supervise` stops everything on Ctrl-C, SIGTERM or a whole-job timeout (the agent, in a
  session of its own, hears none of them), and once a rank has failed gives the others
  SHUTDOWN_GRACE_S, not torch's 30 s, which a stopped rank would use up;
- `failure` names a rank's own error before the timeouts and lost peers it causes in the
  others (torch's "root cause" is only the earliest).
"""
from __future__ import annotations

import _thread
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import deque
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import psutil
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from ..config import TrainConfig
from ..ddp import (COLLECTIVE_TIMEOUT_S, RankInputError, check_fresh, choose_backend,
                   cpu_threads, load_checkpoint, local_batch_size)
from ..devices import DeviceError, num_gpus
from ..training import TrainResult

LOG = "rank 0: "        # rank 0's progress lines start with this; `supervise` passes them on
# Once a rank has failed, the others get this long to exit before they are killed (they have
# nothing to save: checkpoints are written atomically); also the agent's `shutdown_timeout`.
SHUTDOWN_GRACE_S = 5
POLL_S = 0.2
# One DDP rank's own memory (USS: torch, gloo, the model, its data), measured on a CPU: 0.8 GB
# at the smoke and cpu profiles' widths, 1.3 GB at width 64; `check_nprocs` refuses jobs that
# need more than the machine has free.
RANK_BYTES = 2**30
# What a rank says when a peer failed first: it waited, or its peer's connection went away
# (gloo's and NCCL's words: "Timed out waiting", "Connection closed by peer", ...).
TIMED_OUT = re.compile(r"\btim(ed|ing) out\b|\btimeout\b", re.I)
SYMPTOM = re.compile(TIMED_OUT.pattern + r"|connection (reset|closed|refused)|closed by peer"
                     r"|broken pipe", re.I)
GLOO_WHERE = re.compile(r"\[[^\]]*\.(cc|cpp|h):\d+\] ")      # "[/path/pair.cc:589] "


class LaunchError(RuntimeError):
    """A DDP job failed or hung; the message names the rank and its error."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a job ran: stopped like Ctrl-C; the exit status is 143."""
    exit_code = 143


# ---- before anything starts ---------------------------------------------------------------------

def check_nprocs(nprocs: int, backend: str) -> None:
    """Refuse more processes than this machine has devices or memory for (a DeviceError).
    With gloo a process is a "virtual device" on the CPU: one a core, though 2 on any CPU
    (the pages' DDP runs); with nccl one a GPU."""
    if backend == "nccl" and nprocs > num_gpus():
        raise DeviceError(f"{nprocs} nccl processes need {nprocs} GPUs; this machine has "
                          f"{num_gpus()}")
    cores = os.cpu_count() or 1
    if backend == "gloo" and nprocs > max(2, cores):
        raise DeviceError(f"{nprocs} gloo processes are more than this machine's {cores} CPU "
                          f"cores; use at most {max(2, cores)}")
    free = psutil.virtual_memory().available
    if nprocs * RANK_BYTES > free:
        raise DeviceError(f"{nprocs} DDP processes need about {nprocs * RANK_BYTES / 2**30:.1f}"
                          f" GB of memory; {free / 2**30:.1f} GB is available")


def rank_env(backend: str, nprocs: int) -> dict:
    """The ranks' environment: unbuffered output; on a CPU, each rank's share of the cores."""
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS=str(cpu_threads(nprocs)) if backend == "gloo" else "1")
    if os.name == "nt":     # torch's Windows wheels have no libuv, which the rendezvous store
        env.setdefault("USE_LIBUV", "0")    # asks for unless told (elastic/utils)
    return env


# ---- the agent (its own process) ------------------------------------------------------------------

def agent(job: Path) -> int:
    """Run `job/job.json`'s ranks under torch's elastic agent. 0 if every rank succeeded, else
    1 with `job/failures.json` written, or 128 + the signal that stopped it."""
    spec = json.loads((job / "job.json").read_text(encoding="utf-8"))
    # Until torch registers its own handlers (when it starts the ranks), a SIGTERM ends us
    # the way it will then: as a SignalException.
    signal.signal(signal.SIGTERM, _signalled)
    parent_alive = _watch_parent()
    # what torchrun --standalone --max-restarts=0 runs; older torch has no shutdown_timeout
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=spec["nprocs"],
                          run_id=job.name, rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          max_restarts=0, logs_specs=DefaultLogsSpecs(log_dir=str(job / "logs")))
    if hasattr(config, "shutdown_timeout"):
        config.shutdown_timeout = SHUTDOWN_GRACE_S      # after a signal to us, not a failure
    try:
        try:
            elastic_launch(config, sys.executable)("-u", *spec["args"])
            return 0
        except ChildFailedError as e:
            records = [failure_record(rank, f) for rank, f in e.failures.items()]
            (job / "failures.json").write_text(json.dumps(records), encoding="utf-8")
            return 1
    except SignalException as e:        # torch has stopped the ranks
        return 128 + int(e.sigval)
    finally:
        if not parent_alive():
            shutil.rmtree(job, ignore_errors=True)


def _signalled(signum, frame):
    raise SignalException(f"process {os.getpid()} got signal {signum}", signal.Signals(signum))


def _watch_parent() -> Callable[[], bool]:
    """Start a thread that stops this agent as SIGTERM does once its parent is gone; returns
    whether the parent is alive. A dead parent's child gets a new parent id (POSIX; `is_running`
    alone would see a zombie as alive); on Windows the id stays and the process goes."""
    ppid, parent = os.getppid(), psutil.Process().parent()     # None if it is gone already

    def alive() -> bool:
        return parent is not None and os.getppid() == ppid and parent.is_running()

    def watch() -> None:
        while alive():
            time.sleep(POLL_S)
        if os.name == "nt":     # no SIGTERM between processes there; torch stops on SIGINT too
            _thread.interrupt_main()
        else:
            os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, daemon=True).start()
    return alive


def failure_record(rank: int, f: ProcessFailure) -> dict:
    """What `failure` needs of a rank's `ProcessFailure`, as JSON: the exception its `@record`
    wrote (`error`, None without an error file), and torch's words for a signal."""
    wrote = os.path.isfile(f.error_file)
    return {"rank": rank, "pid": f.pid, "exitcode": f.exitcode, "signal": f.signal_name(),
            "error": f.message if wrote else None, "message": f.message,
            # the error file's write time, finer than torch's whole-second timestamp
            "at_ns": os.stat(f.error_file).st_mtime_ns if wrote else f.timestamp * 10**9}


# ---- the caller's side ----------------------------------------------------------------------------

@dataclass
class Ended:
    """How the agent ended: its exit code, the output's last lines, and the ranks we killed."""
    code: int
    lines: list = field(default_factory=list)
    stopped: set = field(default_factory=set)       # pids killed after another rank failed


def popen_options() -> dict:
    """Start the agent apart from our terminal's Ctrl-C (we stop it ourselves): a new process
    group on Windows, a new session elsewhere."""
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def run_ranks(args: list, nprocs: int, job, *, env: dict, timeout_s: float,
              log: Optional[Callable[[str], None]] = None) -> Ended:
    """Run `python ARGS` as ranks 0..nprocs-1 on this machine (torch sets RANK, WORLD_SIZE,
    MASTER_ADDR, ...); rank 0's progress lines go to `log`. `job` is an empty folder the job
    owns (a `job_folder`): the agent removes it if its parent dies. A rank that refused its input
    raises a `RankInputError` (a ValueError); a failed rank or a timeout a `LaunchError`."""
    job = Path(job)
    (job / "job.json").write_text(json.dumps({"nprocs": nprocs, "args": list(args)}),
                                  encoding="utf-8")
    ended = supervise([sys.executable, "-m", "mgpu_lib.lab.launcher", str(job)], env, timeout_s,
                      log, logs=job / "logs")
    if ended.code != 0:
        path = job / "failures.json"
        records = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        raise failure(records, ended)
    return ended


@contextmanager
def job_folder(prefix: str):
    """A temporary folder for one job, removed on any exit. While it exists, SIGTERM raises
    `Terminated` (main thread only), so that the job's processes and the folder go too."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame):
    raise Terminated("terminated (SIGTERM)")


def supervise(cmd, env, timeout_s: float, log: Optional[Callable[[str], None]] = None,
              logs=None) -> Ended:
    """Run `cmd`, pass rank 0's lines to `log`, keep the last 60; stop everything on timeout,
    Ctrl-C or any other exception (`Terminated` in a `job_folder`). Once a rank's error file
    appears under `logs`, the other ranks get SHUTDOWN_GRACE_S to exit, then are killed."""
    tail: deque = deque(maxlen=60)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace", **popen_options())
    reader = threading.Thread(target=_pump, args=(proc, tail, log), daemon=True)
    reader.start()
    ended, deadline, failed_at = Ended(code=-1), time.monotonic() + timeout_s, None
    try:
        while True:
            with suppress(subprocess.TimeoutExpired):
                ended.code = proc.wait(POLL_S)
                break
            now = time.monotonic()
            if now >= deadline:
                stop(proc)
                reader.join(5)
                last = next((t for t in reversed(tail) if t.strip()), "nothing")
                raise LaunchError(f"DDP job timed out after {timeout_s:g} s (a rank hung or is "
                                  f"too slow) and was stopped; last output: {last}")
            if failed_at is None and logs and any(Path(logs).rglob("error.json")):
                failed_at = now
            if failed_at is not None and now - failed_at > SHUTDOWN_GRACE_S:
                ranks = tree(proc.pid)
                ended.stopped.update(p.pid for p in ranks)     # noted for `failure`'s blame
                stop_all(ranks, grace_s=0)          # the agent then reports them and exits
                failed_at = float("inf")            # once
    finally:
        if proc.poll() is None:     # an interrupt or another error: leave nothing behind
            stop(proc)
    reader.join(5)
    ended.lines = list(tail)
    return ended


def _pump(proc: subprocess.Popen, tail: deque, log: Optional[Callable[[str], None]]) -> None:
    for line in proc.stdout:
        line = line.rstrip()
        tail.append(line)
        if log is not None and line.startswith(LOG):
            try:
                log(line[len(LOG):])
            except Exception:       # a broken `log` must not stop the reading
                log = None


def tree(pid: int) -> list:
    """Every process below `pid` (psutil), or none if `pid` is gone."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_all(procs: list, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Terminate `procs`, give them `grace_s` to exit, then kill what is left."""
    for p in procs:
        with suppress(psutil.Error):
            p.terminate() if grace_s else p.kill()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=SHUTDOWN_GRACE_S)


def stop(proc: subprocess.Popen) -> None:
    """Stop the agent and every rank below it. On POSIX the agent stops its ranks on SIGTERM;
    on Windows `terminate` ends the agent alone, so the ranks are stopped one by one too."""
    victims = tree(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=2 * SHUTDOWN_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stop_all(victims)


# ---- the one line ---------------------------------------------------------------------------------

def failure(records: list, ended: Ended) -> Exception:
    """The exception for a failed job: a `RankInputError` if a rank refused its input, else a
    `LaunchError`; it names the likeliest cause among `records` (`failure_record`s)."""
    last = next((t for t in reversed(ended.lines) if t.strip()), "no output")
    if not records:                 # the agent itself failed: its last words
        return LaunchError(f"DDP job failed (exit code {ended.code}): {_explain(last)}")
    first = min(records, key=lambda r: _blame(r, ended.stopped))
    name, text = _exception(first)
    if name.split(".")[-1] == RankInputError.__name__:
        return RankInputError(f"DDP rank {first['rank']} failed: {text}")
    if first["error"] is None and first["exitcode"] > 0:    # it said why on its stderr, if at all
        text += f"; last output: {last}"
    return LaunchError(f"DDP rank {first['rank']} failed: "
                       f"{_explain(f'{name}: {text}' if name else text)}")


def _blame(record: dict, stopped: set) -> tuple:
    """Sort key, the likely cause first: a rank stopped by the agent (SIGTERM) or by us after
    another failed comes last; a timeout or a lost peer after a rank's own error; then the
    earliest."""
    own = record["error"] is not None
    ours = not own and (record["signal"] == "SIGTERM" or record["pid"] in stopped)
    name, text = _exception(record)
    symptom = own and name.split(".")[-1] != RankInputError.__name__ and bool(SYMPTOM.search(text))
    return ours, symptom, record["at_ns"], record["rank"]


def _exception(record: dict) -> tuple:
    """(the exception's qualified name, its message's first line), or ("", torch's words for a
    signal, or the exit code) for a rank without an error file. `@record` writes the bare class
    name in its message; the module comes from the traceback's last line that names the class."""
    error = record["error"]
    if error is None:
        return "", record["message"] if record["exitcode"] < 0 else \
            f"exit code {record['exitcode']}"
    if not isinstance(error, dict):         # torch's plain-message format
        return "", str(error)
    short, _, text = str(error.get("message", "")).partition(": ")
    stack = str((error.get("extraInfo") or {}).get("py_callstack", ""))
    names = re.findall(rf"^((?:[\w.]+\.)?{re.escape(short)}): ", stack, re.M)
    return (names[-1] if names else short), (text.strip().splitlines() or [""])[0]


def _explain(detail: str) -> str:
    """`detail` without gloo's source location, cut at a word, and with the likely cause of a
    timeout: the rank that reports it is the one that waited, not the one that hung."""
    detail = textwrap.shorten(GLOO_WHERE.sub("", detail), 300, placeholder=" ...")
    if TIMED_OUT.search(detail):
        detail += (" (a collective timed out: another rank stopped answering; it hung, died or "
                   "is slower than the collective timeout)")
    return detail


# ---- training -------------------------------------------------------------------------------------

def launch(config: TrainConfig, nprocs: int, *, backend: str = "auto", timeout_s: float = 3600,
           collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, checkpoint=None,
           resume: bool = False, log: Optional[Callable[[str], None]] = None) -> TrainResult:
    """Train `config` as a DDP job of `nprocs` processes on this machine; rank 0's `TrainResult`
    (a diverged run is a result with status "diverged").

    `config.batch_size` is the global batch, split evenly over the ranks (`backend` "auto":
    nccl with CUDA). Past `timeout_s` every process is stopped; `collective_timeout_s` is how
    long a rank waits in a collective for a silent peer. `checkpoint` is a folder for per-epoch
    checkpoints; `resume` continues from the last one. `log` gets rank 0's progress lines as
    they arrive. Raises DeviceError (see `check_nprocs`), RankInputError (a rank refused its
    input, missing data say: a ValueError) or LaunchError (a rank failed or the job timed out).
    """
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)          # refuse bad input before starting
    check_nprocs(nprocs, backend)
    if checkpoint and resume:
        load_checkpoint(checkpoint, config, nprocs)      # a bad checkpoint: one line, now
    elif checkpoint:
        check_fresh(checkpoint)                          # never overwrite another run's
    with job_folder("mgpu-ddp-") as tmp:
        cfg, out = tmp / "config.json", tmp / "result.json"
        cfg.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        args = ["-m", "mgpu_lib", "worker", "--config", str(cfg), "--out", str(out),
                "--backend", backend, "--timeout", str(collective_timeout_s)]
        if checkpoint:
            args += ["--checkpoint", str(checkpoint)] + (["--resume"] if resume else [])
        run_ranks(args, nprocs, tmp, env=rank_env(backend, nprocs), timeout_s=timeout_s, log=log)
        return TrainResult.from_dict(json.loads(out.read_text(encoding="utf-8")), str(out))


if __name__ == "__main__":
    sys.exit(agent(Path(sys.argv[1])))
