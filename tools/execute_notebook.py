"""Execute notebooks in place under a profile, and store clean outputs for the book.

    MGPU_FASHION_MNIST_DIR=... .venv/bin/python tools/execute_notebook.py --profile cpu chapters/*.ipynb

After execution it drops progress-bar widgets (their live view means nothing in a static page)
and refuses to save a notebook whose outputs hold a traceback or a machine path.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

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


def execute(path: Path, profile: str, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    os.environ["MGPU_PROFILE"] = profile
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - t0
    problems = clean(nb)
    if problems:
        raise SystemExit(f"{path}: not saved: " + "; ".join(problems))
    nbformat.write(nb, path)
    return seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "full"])
    p.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = p.parse_args()
    for path in args.notebooks:
        seconds = execute(path, args.profile, args.timeout)
        print(f"{path}: executed under profile {args.profile} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
