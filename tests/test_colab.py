"""Colab, simulated: every notebook alone in an empty folder, `mgpu_lib` installed as a package.

In Colab a notebook arrives without the repository around it and `pip` installs `mgpu_lib`
(non-editable) from the repository URL. Here the package is installed non-editable into a temporary
folder, each notebook is copied alone into an empty directory, and it runs under the smoke profile
with that folder first on the path, so the repository itself is not what gets imported. A page
fails if it reads outside its folder (`../results`, say) or says a recorded table is missing.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).glob("*.ipynb"))
MISSING = re.compile(r"\b(was|were) not found")   # what a page prints for a missing record


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """mgpu_lib installed non-editable into a folder of its own, as pip does in Colab."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(ROOT)], check=True,
                   capture_output=True, timeout=300)
    assert (target / "mgpu_lib" / "results" / "ex1_cpu.jsonl").is_file(), "records not shipped"
    return target


def run_alone(notebook: Path, site: Path, folder: Path, profile: str = "smoke",
              outputs: Optional[list] = None) -> list[str]:
    """Execute `notebook` alone in the empty `folder` with `site` first on the path; the
    problems found (an error, an import from elsewhere, a missing record). The text of every
    output is appended to `outputs` when given."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(shutil.copy(notebook, folder), as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        "import mgpu_lib, pathlib\n"
        f"assert pathlib.Path(mgpu_lib.__file__).is_relative_to({str(site)!r}), "
        "mgpu_lib.__file__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), MGPU_PROFILE=profile)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}})
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        return [f"{notebook.name}: {str(e).strip().splitlines()[-1]}"]
    text = "\n".join(str(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if outputs is not None:
        outputs.append(text)
    return [f"{notebook.name}: a recorded file is missing"] if MISSING.search(text) else []


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_runs_alone_from_the_installed_package(notebook, installed, tmp_path):
    assert run_alone(notebook, installed, tmp_path / "content") == []


def test_the_simulation_catches_a_page_that_reads_the_repository(installed, tmp_path):
    """Test the test: a page that reads ../results fails, as it would in Colab."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import json\nrecords = json.load(open('../results/ex1_cpu.json'))")])
    planted = tmp_path / "planted.ipynb"
    nbformat.write(nb, planted)
    problems = run_alone(planted, installed, tmp_path / "content")
    assert problems and "FileNotFoundError" in problems[0], problems


@pytest.mark.parametrize("line", ["The recorded benchmarks (bench_cpu.jsonl) were not found.",
                                  "The recorded accuracy study (accuracy_cpu.jsonl) was not found."])
def test_the_simulation_catches_a_missing_record(installed, tmp_path, line):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print({line!r})")])
    planted = tmp_path / "planted.ipynb"
    nbformat.write(nb, planted)
    assert run_alone(planted, installed, tmp_path / "content") == \
        ["planted.ipynb: a recorded file is missing"]


# What a page must show under `cpu` when it reads its records instead of training.
RECORDED_UNDER_CPU = {
    "06_performance": ["recorded with `python -m mgpu_lib bench`", "mean over 20 seeds",
                       "The recorded 20 pairs below answer it"],
    "ex1_hyperparameters": ["reading the recorded sweep (ex1_cpu.jsonl", "the notes' setting"],
}


@pytest.mark.parametrize("stem", sorted(RECORDED_UNDER_CPU))
def test_under_cpu_the_recorded_pages_show_their_records_without_training(stem, installed,
                                                                          tmp_path):
    """In Colab without a GPU (`cpu`), page 05 shows its recorded tables and ex1 its recorded
    sweep; nothing is retrained: the shipped records are byte for byte the same afterwards, and
    no real data is offered, so any training would fail (`cpu` refuses synthetic data)."""
    records = sorted((installed / "mgpu_lib" / "results").glob("*.jsonl"))
    before = [p.read_bytes() for p in records]
    notebook = next(p for p in NOTEBOOKS if p.stem == stem)
    saved = os.environ.pop("MGPU_FASHION_MNIST_DIR", None)
    try:
        outputs: list = []
        assert run_alone(notebook, installed, tmp_path / "content", "cpu", outputs) == []
    finally:
        if saved is not None:
            os.environ["MGPU_FASHION_MNIST_DIR"] = saved
    for text in RECORDED_UNDER_CPU[stem]:
        assert text in outputs[0], f"{stem} under cpu does not show: {text}"
    assert [p.read_bytes() for p in records] == before, "a record was retrained and appended"
