"""Ending a DDP job's processes. `stop` and `stop_all` end what runs below the launcher; the
reaper (`reaped`) ends what outlives it, however it ended (SIGKILL included): every process
whose environment carries the job's mark, and the job's folder.

    python mgpu_lib/lab/reaper.py FOLDER       # started by `launcher`, by path (no torch import)

The reaper waits on its standard input, a pipe whose other end only the launcher holds: the
operating system closes that end whenever the launcher exits, normally or not, on every
platform. torchrun starts each rank in a session of its own, so a process group would miss them.
"""
import shutil
import subprocess
import sys
from contextlib import contextmanager, suppress

import psutil

MARK = "MGPU_JOB"        # in the environment of every process of a job: its folder


@contextmanager
def reaped(folder, options: dict):
    """While inside, `folder`'s reaper waits; on leaving, or if this process dies, it ends the
    job and removes the folder. `options`: Popen's, to keep it from our terminal's signals."""
    reaper = subprocess.Popen([sys.executable, __file__, str(folder)], stdin=subprocess.PIPE,
                              **options)
    try:
        yield
    finally:
        reaper.stdin.close()
        reaper.wait(60)


def tree(pid: int) -> list:
    """Every process below `pid`, or none if `pid` is gone."""
    with suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def stop_all(procs: list) -> None:
    """Kill `procs` (those already gone are skipped)."""
    for p in procs:
        with suppress(psutil.Error):
            p.kill()


def stop(proc: subprocess.Popen) -> None:
    """Kill `proc` and what runs below it (what it was still starting is the reaper's)."""
    stop_all(tree(proc.pid) + [psutil.Process(proc.pid)])
    proc.wait()


def kill_ranks(pid: int) -> set:
    """Kill what runs below `pid` (torchrun); the RANKs it had (a loader's workers share theirs)."""
    below, ranks = tree(pid), set()
    for p in below:
        with suppress(psutil.Error, KeyError, ValueError):
            ranks.add(int(p.environ()["RANK"]))
    stop_all(below)
    return ranks


def kill_job(folder: str) -> None:
    """Kill the processes marked as `folder`'s job."""
    for _ in range(5):      # and look again: a dying torchrun may still start one
        marked = [p for p in psutil.process_iter(["environ"])
                  if (p.info["environ"] or {}).get(MARK) == folder]
        if not marked:
            return
        stop_all(marked)
        psutil.wait_procs(marked, timeout=5)


if __name__ == "__main__":
    try:
        sys.stdin.read()            # until the launcher closes its end or exits
    finally:
        kill_job(sys.argv[1])
        shutil.rmtree(sys.argv[1], ignore_errors=True)
