"""What outlives a DDP job's launcher, however the launcher ended (SIGKILL included), is ended
here: every process whose environment carries the job's mark, and the job's folder.

    python mgpu_lib/lab/reaper.py FOLDER       # started by `launcher`, by path (no torch import)

It waits on its standard input, a pipe whose other end only the launcher holds: the operating
system closes that end whenever the launcher exits, normally or not, on every platform. Then it
kills the job's processes (torchrun's ranks run in sessions of their own, so a process group
would miss them) and removes the folder.
"""
import os
import shutil
import sys

import psutil

MARK = "MGPU_JOB"        # in the environment of every process of a job: its folder


def job_processes(folder: str) -> list:
    """The processes whose environment marks them as `folder`'s job (psutil: any platform)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARK) == folder:
                found.append(p)
        except psutil.Error:        # gone meanwhile, or another user's
            continue
    return found


def kill_job(folder: str) -> None:
    """Kill `folder`'s processes (and look again: a dying torchrun may still start one)."""
    for _ in range(5):
        procs = job_processes(folder)
        if not procs:
            break
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=5)


def end_job(folder: str) -> None:
    """Kill `folder`'s processes, then remove the folder."""
    kill_job(folder)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.stdin.read()            # until the launcher closes its end or exits
    finally:
        end_job(sys.argv[1])
