"""Running a torchrun job from Python: echo rank 0's progress, stop every process on a timeout
or an interrupt, and turn a failure into one line that names the rank and its error.

`ddp.launch` builds the torchrun command; this module only supervises it. The failing rank and
its exception come from the error files torchrun gives each worker (`TORCHELASTIC_ERROR_FILE`,
written by `torch.distributed.elastic.multiprocessing.errors.record`), and the process tree
from `psutil`, so the same code runs on Linux, macOS and Windows.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import psutil

from ..config import TrainConfig
from ..ddp import (COLLECTIVE_TIMEOUT_S, RankInputError, check_fresh, choose_backend,
                   cpu_threads, load_checkpoint, local_batch_size)
from ..devices import DeviceError, num_gpus
from ..training import TrainResult

LOG = "rank 0: "        # rank 0's progress lines start with this; `supervise` passes them on
# The one line of torchrun's own log still read: a rank ended by a signal writes no error file,
# and torchrun reports it as "Signal 9 (SIGKILL) received by PID 1234" (the wording of
# torch.distributed.elastic's `ProcessFailure`); the PID names the rank (`Ended.ranks`).
SIGNALLED = re.compile(r"Signal (\d+) \((\w+)\) received by PID (\d+)")
# gloo's "[/path/to/unbound_buffer.cc:78] " prefix; gloo's and NCCL's words for a timeout
# ("Timed out waiting", "Application timeout caused pair closure", "operation timeout").
GLOO_WHERE = re.compile(r"\[[^\]]*\.(cc|cpp|h):\d+\] ")
TIMED_OUT = re.compile(r"\btim(ed|ing) out\b|\btimeout\b", re.I)
# What a rank says when a peer failed first: it waited, or its peer's connection went away.
SYMPTOM = re.compile(TIMED_OUT.pattern + r"|connection (reset|closed|refused)|closed by peer"
                     r"|broken pipe", re.I)
# Once a rank has failed, the others get this long to exit before they are killed; they have
# nothing to save (checkpoints are written atomically), and a stopped or wedged one would never
# exit: torchrun itself waits 30 s there (torch 2.14's `LocalElasticAgent._stop_workers`).
SHUTDOWN_GRACE_S = 5.0
POLL_S = 0.2
INPUT_ERROR = "RankInputError"      # a rank's own refusal of its input (see `RankInputError`)


class LaunchError(RuntimeError):
    """A DDP job failed or hung; the message names the rank and its error."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a job ran: stopped like Ctrl-C; the exit status is 143."""
    exit_code = 143


# ---- the per-platform part: small, guarded, named ---------------------------------------------

def popen_options() -> dict:
    """How to start torchrun apart from our terminal's Ctrl-C (we stop it ourselves): a new
    process group on Windows (no `preexec_fn` there), a new session elsewhere, and on Linux
    also a parent-death signal."""
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    options = {"start_new_session": True}
    if sys.platform.startswith("linux"):
        options["preexec_fn"] = linux_die_with_parent
    return options


def linux_die_with_parent() -> None:
    """In the child (Linux only): get SIGTERM when this process dies, so torchrun stops its
    workers even when a notebook kernel is killed outright. Best effort: a no-op without libc.
    `CDLL(None)` is this process's own symbols, libc's among them, whatever the libc's name."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError, TypeError):
        pass


def tree(pid: int) -> list:
    """Every process below `pid` (psutil), or none if `pid` is gone."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_all(procs: list, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Terminate `procs`, give them `grace_s` to exit, then kill what is left."""
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def stop(proc: subprocess.Popen) -> None:
    """Stop torchrun and every worker below it. POSIX torchrun stops its workers on SIGTERM;
    on Windows `terminate` ends torchrun alone, so the workers are stopped one by one too."""
    victims = tree(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stop_all(victims)


# ---- the error files --------------------------------------------------------------------------

@dataclass(frozen=True)
class RankError:
    """One rank's exception, from its torchelastic error file."""
    rank: int
    name: str           # the exception's qualified name: torch.OutOfMemoryError
    text: str           # the first line of its message
    timestamp: int      # seconds; torch writes whole seconds
    written_ns: int = 0     # the file's mtime: the order within one second

    @property
    def symptom(self) -> bool:
        """A rank's own refusal is a cause; a timeout or a lost peer is a likely symptom."""
        return self.name.split(".")[-1] != INPUT_ERROR and bool(SYMPTOM.search(self.text))


def read_error_file(path, rank: int) -> Optional[RankError]:
    """The exception `record` wrote to `path`, or None if there is no readable one."""
    try:
        data = json.loads(Path(path).read_text())["message"]
        written = Path(path).stat().st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(data, str):                   # torch's newer plain-message format
        data = {"message": data, "extraInfo": {}}
    short, _, text = str(data.get("message", "")).partition(": ")
    extra = data.get("extraInfo") or {}
    # The message has the bare class name; the traceback's last lines name its module.
    name = next((line.split(":", 1)[0] for line in reversed(
        str(extra.get("py_callstack", "")).splitlines())
        if line.split(":", 1)[0].split(".")[-1] == short and " " not in line.split(":", 1)[0]),
        short)
    first = text.strip().splitlines()[0] if text.strip() else ""
    try:
        stamp = int(extra.get("timestamp", 0))
    except (TypeError, ValueError):             # null or not a number: no time to compare
        stamp = 0
    return RankError(rank, name, first, stamp, written)


def read_errors(log_dir) -> list[RankError]:
    """Every rank's error in torchrun's `--log-dir` (`<run>/attempt_<n>/<local rank>/error.json`),
    the likely cause first: a rank's own failure before the timeouts and lost connections it
    causes in the others, then the earliest.
    With `--standalone` the local rank is the rank."""
    if not log_dir:
        return []
    found = [read_error_file(p, int(p.parent.name))
             for p in Path(log_dir).glob("*/attempt_*/*/error.json") if p.parent.name.isdigit()]
    return sorted((e for e in found if e),
                  key=lambda e: (e.symptom, e.timestamp, e.written_ns, e.rank))


# ---- supervising a job ------------------------------------------------------------------------

@dataclass
class Ended:
    """How a job ended: torchrun's exit code, its last lines, and what identifies the ranks."""
    code: int
    lines: list = field(default_factory=list)
    ranks: dict = field(default_factory=dict)       # pid -> rank of every worker seen
    stopped: set = field(default_factory=set)       # pids this supervisor killed, not the cause
    log_dir: Optional[str] = None

    def errors(self) -> list[RankError]:
        return read_errors(self.log_dir)


def supervise(cmd, env, timeout_s: float, log: Optional[Callable[[str], None]] = None,
              log_dir=None) -> Ended:
    """Run `cmd`, pass rank 0's lines to `log`, keep the last 60; stop everything on timeout.

    `log_dir` is torchrun's `--log-dir`: once an error file appears there, the other workers
    get SHUTDOWN_GRACE_S to exit, then are killed. While the job runs (from the main thread),
    SIGTERM stops it as Ctrl-C does, raising `Terminated`.
    """
    tail: deque = deque(maxlen=60)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen_options())
    reader = threading.Thread(target=_pump, args=(proc, tail, log), daemon=True)
    reader.start()
    ended = Ended(code=-1, log_dir=str(log_dir) if log_dir else None)
    previous = _on_sigterm()
    try:
        ended.code = _wait(proc, ended, time.monotonic() + timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        reader.join(5)
        last = next((t for t in reversed(tail) if t.strip()), "nothing")
        raise LaunchError(f"DDP job timed out after {timeout_s:.0f} s (a rank hung or is too "
                          f"slow) and was stopped; last output: {last}") from None
    finally:
        if proc.poll() is None:     # an interrupt or another error: leave nothing behind
            stop(proc)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    reader.join(5)
    ended.lines = list(tail)
    return ended


def _on_sigterm():
    """Make SIGTERM raise `Terminated` (main thread only); the handler it replaced, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise Terminated("terminated (SIGTERM)")
    return signal.signal(signal.SIGTERM, handler)


def _pump(proc: subprocess.Popen, tail: deque, log: Optional[Callable[[str], None]]) -> None:
    """Read `proc`'s output: keep the tail and pass rank 0's lines to `log`."""
    for line in proc.stdout:
        line = line.rstrip()
        tail.append(line)
        if log is not None and line.startswith(LOG):
            try:
                log(line[len(LOG):])
            except Exception:       # a broken `log` must not stop the reading
                log = None


def _wait(proc: subprocess.Popen, ended: Ended, deadline: float) -> int:
    """`proc`'s exit code, noting each worker's rank meanwhile. Once a rank's error file
    appears, the rest get SHUTDOWN_GRACE_S before they are killed.

    Raises:
        subprocess.TimeoutExpired: `deadline` (a `time.monotonic()` value) passed first.
    """
    failed_at = None
    while True:
        try:
            return proc.wait(POLL_S)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now >= deadline:
            raise subprocess.TimeoutExpired(proc.args, 0)
        _note_ranks(proc.pid, ended.ranks)
        if failed_at is None and ended.log_dir and any(
                Path(ended.log_dir).glob("*/attempt_*/*/error.json")):
            failed_at = now
        if failed_at is not None and now - failed_at > SHUTDOWN_GRACE_S:
            left = tree(proc.pid)
            ended.stopped.update(p.pid for p in left)
            stop_all(left, grace_s=0)               # torchrun then reports them and exits
            return proc.wait(max(0.0, deadline - time.monotonic()))


def _note_ranks(pid: int, ranks: dict) -> None:
    """Add each new worker below `pid` to `ranks` (pid -> its RANK)."""
    for p in tree(pid):
        if p.pid not in ranks:
            try:
                rank = p.environ().get("RANK")
            except psutil.Error:
                continue
            if rank is not None and rank.isdigit():
                ranks[p.pid] = int(rank)


# ---- the one line -----------------------------------------------------------------------------

def failure(ended: Ended) -> Exception:
    """The exception to raise for a failed job: a `RankInputError` if a rank refused its
    input, else a `LaunchError`; its message names the rank that failed first, and why."""
    errors = ended.errors()
    killed = [(int(pid), f"Signal {num} ({name})") for num, name, pid in
              SIGNALLED.findall("\n".join(ended.lines))
              if name != "SIGTERM" and int(pid) not in ended.stopped]
    if killed:                      # SIGKILL, SIGSEGV: nothing else could have written a file
        pid, what = killed[0]
        who = f"rank {ended.ranks[pid]}" if pid in ended.ranks else f"process {pid}"
        return LaunchError(f"DDP {who} failed: {what} received by PID {pid}")
    if errors:
        first = errors[0]
        if first.name.split(".")[-1] == INPUT_ERROR:
            return RankInputError(f"DDP rank {first.rank} failed: {first.text}")
        return LaunchError(f"DDP rank {first.rank} failed: "
                           f"{_explain(f'{first.name}: {first.text}')}")
    last = next((t for t in reversed(ended.lines) if t.strip()), "no output")
    return LaunchError(f"DDP job failed (torchrun exit code {ended.code}): {_explain(last)}")


def _explain(detail: str) -> str:
    """`detail` without gloo's source location, cut at a word, and with the likely cause of a
    timeout: the rank that reports it is the one that waited, not the one that hung."""
    detail = textwrap.shorten(GLOO_WHERE.sub("", detail), 300, placeholder=" ...")
    if TIMED_OUT.search(detail):
        detail += (" (a collective timed out: another rank stopped answering; it hung, died or "
                   "is slower than the collective timeout)")
    return detail


# ---- the launcher -----------------------------------------------------------------------------

def launch(config: TrainConfig, nprocs: int, *, backend: str = "auto", timeout_s: float = 3600,
           collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, checkpoint=None,
           resume: bool = False, log: Optional[Callable[[str], None]] = None) -> TrainResult:
    """Run `config` as a torchrun job of `nprocs` processes on this machine; rank 0's result.

    Args:
        config: what to train; `batch_size` is the global batch, split evenly over the ranks.
        nprocs: processes (one per GPU with nccl; "virtual devices" sharing the CPU with gloo).
        backend: "auto" (nccl with CUDA, gloo without), "nccl" or "gloo".
        timeout_s: the whole job's limit; past it every process is stopped.
        collective_timeout_s: how long a rank waits in a collective for a silent peer.
        checkpoint: a folder for per-epoch checkpoints; `resume` continues from the last one.
        log: called with each of rank 0's progress lines as it arrives (e.g. `print`).
    Returns:
        Rank 0's `TrainResult`; a diverged run is a result with status "diverged".
    Raises:
        RankInputError: a rank refused its input (missing data, say): a ValueError.
        LaunchError: a rank failed or the job timed out (the message names the rank and error).
    """
    backend = choose_backend(backend)
    local_batch_size(config.batch_size, nprocs)          # refuse bad input before starting
    if backend == "nccl" and nprocs > num_gpus():
        raise DeviceError(f"{nprocs} nccl processes need {nprocs} GPUs; this machine has "
                          f"{num_gpus()}")
    if checkpoint and resume:
        load_checkpoint(checkpoint, config, nprocs)      # a bad checkpoint: one line, now
    elif checkpoint:
        check_fresh(checkpoint)                          # never overwrite another run's
    with tempfile.TemporaryDirectory(prefix="mgpu-ddp-") as tmp:
        cfg, out = Path(tmp) / "config.json", Path(tmp) / "result.json"
        cfg.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        args = ["--config", str(cfg), "--out", str(out), "--backend", backend,
                "--timeout", str(collective_timeout_s)]
        if checkpoint:
            args += ["--checkpoint", str(checkpoint)] + (["--resume"] if resume else [])
        logs = Path(tmp) / "logs"    # torchrun gives each rank an error file under it
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nprocs}", "--max-restarts=0", f"--log-dir={logs}",
               "-m", "mgpu_lib", "worker", *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS=str(cpu_threads(nprocs)) if backend == "gloo" else "1")
        if os.name == "nt":     # torch's Windows wheels have no libuv, which torchrun's store
            env.setdefault("USE_LIBUV", "0")    # asks for unless told (elastic/utils)
        ended = supervise(cmd, env, timeout_s, log, log_dir=logs)
        if ended.code != 0:
            raise failure(ended)
        return TrainResult.from_dict(json.loads(out.read_text(encoding="utf-8")), str(out))
