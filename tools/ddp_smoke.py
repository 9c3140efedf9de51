"""DDP smoke: short DDP trains in a row, each of which must end with its result file in time.

    python tools/ddp_smoke.py --runs 10 --timeout 60 --out runs/ddp_smoke

Each run is `python -m mgpu_lib train --strategy ddp --nprocs 2 --epochs 1 --train-limit 320
--test-limit 64 --out OUT/runN.json`. A run that has not exited after --timeout seconds is named
as hung: where py-spy is installed, the stacks of every process in its tree are saved beside its
output (OUT/runN.stacks.txt) first, then the job gets SIGTERM
and, 10 s later, SIGKILL. Exit code 0 when every run ended
with exit 0 and its result file, else 1. `make floors` runs it at the declared floors (issue 41:
on torch 2.3 a DDP job sometimes hung after printing its result).
"""
import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

TRAIN = ["-m", "mgpu_lib", "train", "--strategy", "ddp", "--nprocs", "2", "--epochs", "1",
         "--train-limit", "320", "--test-limit", "64"]


def dump_stacks(root: psutil.Process, path: Path) -> str:
    """py-spy's stacks of `root` and its descendants, written to `path`; a note where none."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return "py-spy not installed: no stacks"
    parts = []
    for proc in [root] + root.children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        out = subprocess.run([spy, "dump", "--native", "--pid", str(proc.pid)],
                             capture_output=True, text=True, timeout=30)
        parts.append(f"==== pid {proc.pid}: {cmd}\n{out.stdout}{out.stderr}")
    path.write_text("\n".join(parts), encoding="utf-8")
    return f"stacks in {path}"


def stop_tree(root: psutil.Process) -> None:
    """SIGTERM to the job (its launcher cleans up), then SIGKILL to whatever is left."""
    procs = [root] + root.children(recursive=True)
    try:
        root.terminate()
    except psutil.Error:
        pass
    _, alive = psutil.wait_procs([root], timeout=10)
    for proc in alive + [p for p in procs[1:] if p.is_running()]:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def one_run(n: int, out: Path, timeout_s: float, extra: list) -> tuple:
    """Run train once; return (ok, one line saying how it ended)."""
    result, log = out / f"run{n}.json", out / f"run{n}.log"
    result.unlink(missing_ok=True)
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen([sys.executable, *TRAIN, "--out", str(result), *extra],
                                stdout=sink, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            wrote = "written" if result.exists() else "not written"
            stacks = dump_stacks(psutil.Process(proc.pid), out / f"run{n}.stacks.txt")
            stop_tree(psutil.Process(proc.pid))
            proc.wait()
            return False, (f"HUNG: pid {proc.pid} still running after {timeout_s:.0f} s "
                           f"(result file {wrote}); {stacks}; log {log}")
    took = time.monotonic() - start
    if code != 0:
        return False, f"FAILED: exit {code} after {took:.1f} s; log {log}"
    if not result.exists():
        return False, f"FAILED: exit 0 after {took:.1f} s but no {result}; log {log}"
    return True, f"ok in {took:.1f} s ({result})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("runs/ddp_smoke"))
    parser.add_argument("extra", nargs="*", help="more train options, after --")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for n in range(1, args.runs + 1):
        ok, line = one_run(n, args.out, args.timeout, args.extra)
        print(f"run {n}/{args.runs}: {line}", flush=True)
        if not ok:
            failed.append(n)
    print(f"ddp smoke: {args.runs - len(failed)} of {args.runs} runs ended with their result "
          f"within {args.timeout:.0f} s" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
