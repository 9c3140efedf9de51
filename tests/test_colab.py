"""Colab, simulated. Every page runs the Colab way once, under nbval (the root conftest.py):
`mgpu_lib` installed non-editable into a temporary folder, each notebook alone in an empty folder,
that install alone on the path. These tests test that harness on planted pages, and run the two
pages that read records instead of training under `cpu`, as Colab without a GPU does.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

from nbval_colab import MISSING, ORIGIN, ROOT, install_site

NOTEBOOKS = sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).glob("*.ipynb"))
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = install_site(tmp_path_factory.mktemp("site"))
    assert list((target / "mgpu_lib").rglob("ex1_cpu.jsonl")), "records not shipped"
    return target


def cell(source: str, output: Optional[str] = None, tags: tuple = ()):
    c = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)})
    if output is not None:        # a stored output for nbval to compare against
        c.execution_count = 1
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    return c


# Planted pages and what the harness must say about each: (outcome, words in its report).
PLANTED = {
    "alone": ([cell("import os\nprint(sorted(os.listdir('.')))", "['alone.ipynb']\n")],
              "PASSED", ""),
    "differs": ([cell("print(1 + 1)", "3\n")], "FAILED", "Cell outputs differ"),
    "reads_repo": ([cell("open('../mgpu_lib/recorded/ex1_cpu.jsonl')")], "FAILED", "FileNotFoundError"),
    "says_missing": ([cell("print('The recorded benchmarks (bench_cpu.jsonl) were not found.')",
                           tags=("nbval-ignore-output",))],
                     "FAILED", "says_missing.ipynb: a recorded file is missing"),
    "imports_repo": ([cell(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport mgpu_lib")],
                     "ERROR", "imports_repo.ipynb: mgpu_lib was not imported from the installed"),
    "stalls": ([cell("x = 1"), cell("import time\ntime.sleep(120)")], "FAILED",
               "stalls.ipynb, cell 1: Timeout of 5 seconds exceeded"),
}


def test_the_harness_catches_each_planted_fault_in_one_nbval_run(installed, tmp_path):
    """Test the test: `pytest --nbval` (the root conftest's Colab way) passes a page that runs
    alone, and fails a page whose output differs, that reads ../, that says a record is missing,
    that imports the repository's mgpu_lib, or whose cell stalls (named with its page and cell)."""
    for name, (cells, _, _) in PLANTED.items():
        nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / f"{name}.ipynb")
    env = dict(os.environ, MGPU_COLAB_SITE=str(installed))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "--nbval", "--nbval-cell-timeout",
         "5", "-rA", "--color=no",
         *(str(tmp_path / f"{n}.ipynb") for n in PLANTED)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seen: dict = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR) \S*?(\w+)\.ipynb::Cell \d+", run.stdout, re.M):
        seen.setdefault(m.group(2), set()).add(m.group(1))
    for name, (_, outcome, says) in PLANTED.items():
        worst = next((o for o in ("ERROR", "FAILED", "PASSED") if o in seen.get(name, ())), None)
        assert worst == outcome, f"{name}: {worst}\n{run.stdout[-3000:]}"
        assert says in run.stdout, f"{name}: the report does not say {says!r}"


def run_alone(notebook: Path, site: Path, folder: Path, profile: str,
              timeout: int = 600) -> str:
    """Execute a copy of `notebook` alone in the empty `folder`, `site` alone on the path; the
    text of its outputs. An error, a stall (naming the cell) or an import from elsewhere fails."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(ORIGIN.format(site=str(site))))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), MGPU_PROFILE=profile)
    cells = {}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}},
                            on_cell_execute=lambda cell, cell_index: cells.update(i=cell_index))
    try:
        client.execute(env=env)
    except CellTimeoutError:
        pytest.fail(f"{notebook.name}: cell {cells['i']} ran past {timeout} s under {profile}")
    except CellExecutionError as e:
        pytest.fail(f"{notebook.name}: {str(e).strip().splitlines()[-1]}")
    return "\n".join(str(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _study_seeds() -> int:
    """The seeds of page 06's accuracy study: its chapter-loop runs, one a seed."""
    path = ROOT / "mgpu_lib" / "recorded" / "accuracy_cpu.jsonl"
    runs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return len({r["config"]["seed"] for r in runs if not r["config"]["fast"]})


# What a page must show under `cpu` when it reads its records instead of training.
RECORDED_UNDER_CPU = {
    "06_performance": ["recorded with `python -m mgpu_lib bench`", f"over {_study_seeds()} seeds",
                       f"one run's final test accuracy over {_study_seeds()} seeds"],
    "ex1_hyperparameters": ["reading the recorded sweep (ex1_cpu.jsonl", "the notes' setting"],
}


@pytest.mark.parametrize("stem", sorted(RECORDED_UNDER_CPU))
def test_under_cpu_the_recorded_pages_show_their_records_without_training(stem, installed,
                                                                          tmp_path, monkeypatch):
    """In Colab without a GPU (`cpu`), page 06 shows its recorded tables and ex1 its recorded
    sweep; nothing is retrained: the shipped records are byte for byte the same afterwards, and
    no real data is offered, so any training would fail (`cpu` refuses synthetic data)."""
    records = sorted((installed / "mgpu_lib").rglob("*.jsonl"))
    before = [p.read_bytes() for p in records]
    monkeypatch.delenv("MGPU_FASHION_MNIST_DIR", raising=False)
    notebook = next(p for p in NOTEBOOKS if p.stem == stem)
    text = run_alone(notebook, installed, tmp_path / "content", "cpu")
    assert not MISSING.search(text), f"{stem} says a record is missing"
    for words in RECORDED_UNDER_CPU[stem]:
        assert words in text, f"{stem} under cpu does not show: {words}"
    assert [p.read_bytes() for p in records] == before, "a record was retrained and appended"
