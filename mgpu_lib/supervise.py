"""Running a torchrun job from Python: echo rank 0's progress, stop every process on a timeout
or an interrupt, and turn a failure into one line that names the rank and its error.

`ddp.launch` builds the torchrun command; this module only supervises it. torchrun starts its
workers in sessions of their own, so stopping the job means finding them under /proc.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Optional

LOG = "rank 0: "        # rank 0's progress lines start with this; `supervise` passes them on
# A worker's own error line (see the CLI's `worker` command), and any exception line.
WORKER_ERROR = re.compile(r"mgpu_lib worker rank (\d+): error: (.*)")
EXCEPTION = re.compile(r"^(\[rank\d+\]: )?\w*(Error|Exception)\b")
# gloo's "[/path/to/unbound_buffer.cc:78] " prefix; gloo's and NCCL's words for a timeout
# ("Timed out waiting", "Application timeout caused pair closure", "operation timeout").
GLOO_WHERE = re.compile(r"\[[^\]]*\.(cc|cpp|h):\d+\] ")
TIMED_OUT = re.compile(r"\btim(ed|ing) out\b|\btimeout\b", re.I)
# torchrun's log line when it stops its workers (one failed, or it was told to stop).
CLOSING = re.compile(r"Sending process \d+ closing signal")
# Then a worker gets this long to exit before it is killed; it has nothing to save (the
# checkpoints are written atomically), and a stopped or wedged one would never exit.
SHUTDOWN_GRACE_S = 5.0


class LaunchError(RuntimeError):
    """A DDP job failed or hung; the message names the rank and its error."""


class RankInputError(ValueError):
    """A rank refused its input (bad data, a bad checkpoint): a user error, said in one line."""


def supervise(cmd, env, timeout_s: float, log: Optional[Callable[[str], None]] = None
              ) -> tuple[int, list[str]]:
    """Run `cmd`, pass rank 0's lines to `log`, keep the last lines; stop everything on timeout.

    Returns the exit code and the lines kept: every error line (however early it came) and
    then the last 60 lines. Once torchrun stops its workers after a failure, any that has not
    exited SHUTDOWN_GRACE_S later is killed.
    """
    tail: deque = deque(maxlen=60)
    errors: list[str] = []
    closing = threading.Event()     # torchrun is stopping its workers, or its output ended
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_die_with_parent)
    reader = threading.Thread(target=_pump, args=(proc, tail, errors, closing, log),
                              daemon=True)
    reader.start()
    try:
        code = _wait(proc, closing, time.monotonic() + timeout_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
        reader.join(5)
        last = next((t for t in reversed(tail) if t.strip()), "nothing")
        raise LaunchError(f"DDP job timed out after {timeout_s:.0f} s (a rank hung or is too "
                          f"slow) and was stopped; last output: {last}") from None
    finally:
        if proc.poll() is None:     # KeyboardInterrupt or another error: leave nothing behind
            _stop(proc)
    reader.join(5)
    return code, errors + [t for t in tail if t not in errors]


def _pump(proc: subprocess.Popen, tail: deque, errors: list, closing: threading.Event,
          log: Optional[Callable[[str], None]]) -> None:
    """Read `proc`'s output: keep the tail and the error lines, pass rank 0's lines to `log`,
    and set `closing` when torchrun starts stopping its workers."""
    try:
        for line in proc.stdout:
            line = line.rstrip()
            tail.append(line)
            if (WORKER_ERROR.search(line) or EXCEPTION.match(line)) and len(errors) < 20:
                errors.append(line)
            if CLOSING.search(line):
                closing.set()
            if log is not None and line.startswith(LOG):
                log(line[len(LOG):])
    finally:
        closing.set()               # the output ended (or `log` raised): wait for the exit


def _wait(proc: subprocess.Popen, closing: threading.Event, deadline: float) -> int:
    """`proc`'s exit code. Once torchrun stops its workers after a failure, they get
    SHUTDOWN_GRACE_S, then SIGKILL: torchrun itself gives a rank that ignores SIGTERM (a
    stopped or wedged one) 30 s there (its --shutdown-timeout only applies when torchrun
    itself is signalled; torch 2.14's `LocalElasticAgent._stop_workers`).

    Raises:
        subprocess.TimeoutExpired: `deadline` (a `time.monotonic()` value) passed first.
    """
    closing.wait(max(0.0, deadline - time.monotonic()))
    try:
        return proc.wait(max(0.0, min(SHUTDOWN_GRACE_S, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        if time.monotonic() >= deadline:
            raise
    for pid in _descendants(proc.pid):     # torchrun then reports them and exits
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return proc.wait(max(0.0, deadline - time.monotonic()))


def _die_with_parent() -> None:
    """In the child: get SIGTERM if this (notebook) process dies, so torchrun stops its workers
    even when the kernel is killed outright (Linux only; elsewhere a no-op)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _descendants(pid: int) -> list[int]:
    """All processes below `pid` (Linux /proc; elsewhere none). torchrun puts its workers in
    sessions of their own, so a signal to its process group would not reach them."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for t in os.listdir(f"/proc/{p}/task")
                    for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun (it stops its workers), then SIGKILL whatever is left."""
    victims = _descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def failure_message(code: int, lines: list[str]) -> str:
    """One line from torchrun's output: which rank failed first, and why."""
    text = "\n".join(lines)
    own = WORKER_ERROR.findall(text)
    if own:                          # a user error the rank explained itself
        return f"DDP rank {own[0][0]} failed: {own[0][1]}"
    root = text[text.find("Root Cause"):] if "Root Cause" in text else text
    rank = re.search(r"^\s*rank\s*:\s*(\d+)", root, re.M)
    exitcode = re.search(r"^\s*exitcode\s*:\s*(-?\d+)", root, re.M)
    signal_ = re.search(r"^\s*traceback\s*:\s*(Signal .*)", root, re.M)
    if rank:
        errors = [t.split(":", 1)[1].strip() for t in lines if t.startswith(f"[rank{rank.group(1)}]:")
                  and re.match(r"\w*(Error|Exception)\b", t.split(":", 1)[1].strip())]
        detail = (signal_.group(1) if signal_ else errors[-1] if errors
                  else f"exit code {exitcode.group(1) if exitcode else '?'}")
        return f"DDP rank {rank.group(1)} failed: {_explain(detail)}"
    # No torchrun summary (torchrun itself failed): an exception says more than the last line.
    errors = [t for t in lines if EXCEPTION.match(t)]
    last = errors[-1] if errors else next((t for t in reversed(lines) if t.strip()), "no output")
    return f"DDP job failed (torchrun exit code {code}): {_explain(last)}"


def _explain(detail: str) -> str:
    """`detail` without gloo's source location, and with the likely cause of a timeout: the
    rank that reports it is the one that waited, not the one that hung."""
    detail = GLOO_WHERE.sub("", detail)
    if TIMED_OUT.search(detail):
        detail += (" (a collective timed out: another rank stopped answering; it hung, died or "
                   "is slower than the collective timeout)")
    return detail
