"""Execute notebooks under a profile, and store clean outputs for the book.

    MGPU_FASHION_MNIST_DIR=... .venv/bin/python tools/execute_notebook.py --profile cpu chapters/*.ipynb
    .venv/bin/python tools/execute_notebook.py --profile smoke --out /tmp/run exercises/ex1*.ipynb

In place by default; with `--out DIR` each notebook is copied alone into DIR/<stem>/ and runs
there, the original untouched. After execution it drops progress-bar widgets (their live view
means nothing in a static page) and refuses to save a notebook whose outputs hold a traceback or
a machine path. A cell that fails or runs past `--timeout` stops the run with one line naming the
page and the cell; `--slowest N` lists the N slowest cells of each page. Every notebook named is
read first: a missing path, a folder, a file that is not a notebook, a timeout that is not a
positive number of seconds, an `--out` that cannot be written or two notebooks of
one name for one `--out` is one line and exit 2, before anything runs. A copy stays in `--out`
only once executed: a failure, Ctrl-C or SIGTERM removes it.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

from mgpu_lib.book.cli import TIMEOUT, Parser, sigterm_interrupts
from mgpu_lib.book.flags import COUNT

MACHINE_PATH = re.compile(r"(/root/|/tmp/|/work/|/home/|/Users/|[A-Z]:\\\\Users)")
WIDGET = "application/vnd.jupyter.widget-view+json"


def clean(nb) -> list[str]:
    """Drop widget outputs and stderr progress streams; return a list of problems found."""
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            if WIDGET in out.get("data", {}):
                continue
            if out.get("output_type") == "stream" and out.get("name") == "stderr" \
                    and "step/s" in out.get("text", ""):
                continue
            text = str(out)
            if out.get("output_type") == "error" or "Traceback (most recent call last)" in text:
                problems.append(f"cell {i}: error output")
            if MACHINE_PATH.search(text):
                problems.append(f"cell {i}: machine path in output")
            kept.append(out)
        cell["outputs"] = kept
        cell.metadata.pop("execution", None)
    nb.metadata.get("widgets", None) and nb.metadata.pop("widgets")
    return problems


def first_line(cell) -> str:
    return next((line for line in cell.source.splitlines() if line.strip()), "")[:60]


def execute(path: Path, profile: str, timeout: float, out: Optional[Path] = None) -> list:
    """Run `path` (or its copy in `out`/<stem>/) and save it; (seconds, cell index) per code cell.

    A cell that fails or runs past `timeout` seconds is a SystemExit naming the page and the
    cell. A copy in `out` stays only once it is executed and saved: any failure, Ctrl-C or
    SIGTERM removes it.
    """
    if out is None:
        return _run(path, profile, timeout)
    folder = out / path.stem
    made = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        copy = Path(shutil.copy(path, folder))
    except OSError as e:
        raise SystemExit(f"--out {out}: cannot copy {path.name} there: {e.strerror or e}") from None
    try:
        return _run(copy, profile, timeout)
    except BaseException:
        copy.unlink(missing_ok=True)
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def _run(path: Path, profile: str, timeout: float) -> list:
    nb = nbformat.read(path, as_version=4)
    times, started = [], {}
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_execute=lambda cell, cell_index: started.update(t=time.perf_counter(),
                                                                i=cell_index),
        on_cell_executed=lambda cell, cell_index, **_: times.append(
            (time.perf_counter() - started["t"], cell_index)))
    try:
        # the profile goes to the kernel alone: set in this process, it leaked into the notebook
        # kernels that a test session starts after a test called main() (issue 50: `make test`
        # with no data folder ran 03, 05 and ex2 under `cpu`, which allows no synthetic data)
        client.execute(env={**os.environ, "MGPU_PROFILE": profile})
    except CellTimeoutError:
        cell = nb.cells[started["i"]]
        raise SystemExit(f"{path.name}: cell {started['i']} ({first_line(cell)!r}) ran past "
                         f"the {timeout:g} s per-cell timeout under profile {profile}") from None
    except CellExecutionError as e:
        cell = nb.cells[started["i"]]
        why = (f"{e.ename}: {e.evalue}".splitlines() or [e.ename])[0][:200]
        raise SystemExit(f"{path.name}: cell {started['i']} ({first_line(cell)!r}) failed "
                         f"under profile {profile}: {why}") from None
    problems = clean(nb)
    if problems:
        raise SystemExit(f"{path}: not saved: " + "; ".join(problems))
    nbformat.write(nb, path)
    return times


def check_notebook(path: Path) -> None:
    """A ValueError (one line, naming `path`) unless it is a readable, valid notebook."""
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file (a folder?); name the notebooks in it")
    try:
        nbformat.validate(nbformat.read(path, as_version=4))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a notebook (not UTF-8 text)") from None
    except Exception as e:          # nbformat's NotJSONError, ValidationError, a KeyError ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise ValueError(f"{path}: not a notebook ({first})") from None


def main(argv=None) -> int:
    p = Parser(prog="tools/execute_notebook.py", description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "full"])
    p.add_argument("--timeout", type=TIMEOUT, default=3600.0,
                   help="seconds per cell (default 3600)")
    p.add_argument("--out", type=Path, help="run copies in this folder, not in place")
    p.add_argument("--slowest", type=COUNT, default=0,
                   help="list this many slowest cells")
    args = p.parse_args(argv)
    for path in args.notebooks:       # every one before the first runs
        try:
            check_notebook(path)
        except ValueError as e:
            p.error(str(e))
    if args.out is not None:
        check_out(p, args.out, args.notebooks)
    with sigterm_interrupts():
        try:
            run_all(args)
        except KeyboardInterrupt as e:             # Ctrl-C, SIGTERM: the copy in progress is gone
            p.exit(getattr(e, "exit_code", 130), f"{p.prog}: {str(e) or 'interrupted'}; "
                                                 "stopped\n")
    return 0


def check_out(p: Parser, out: Path, notebooks: list) -> None:
    """--out before anything runs: a folder this process can write, and one copy per name."""
    if out.exists() and not out.is_dir():
        p.error(f"--out {out}: not a folder")
    parent = next(d for d in [out, *out.parents] if d.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        p.error(f"--out {out}: permission denied")
    stems: dict = {}
    for path in notebooks:
        stems.setdefault(path.stem, []).append(str(path))
    same = next((paths for paths in stems.values() if len(paths) > 1), None)
    if same:
        p.error(f"--out {out}: {' and '.join(same)} would share one copy "
                f"({out / Path(same[0]).stem}); run them into separate folders")


def run_all(args) -> None:
    for path in args.notebooks:
        t0 = time.perf_counter()
        times = execute(path, args.profile, args.timeout, args.out)
        print(f"{path}: executed under profile {args.profile} in "
              f"{time.perf_counter() - t0:.0f} s")
        nb = nbformat.read(path, as_version=4)
        for seconds, i in sorted(times, reverse=True)[:args.slowest]:
            print(f"    cell {i}: {seconds:5.1f} s  {first_line(nb.cells[i])}")


if __name__ == "__main__":
    sys.exit(main())
