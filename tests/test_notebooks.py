"""Static checks of the committed notebooks: what `pytest --nbval` does not look at."""
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).glob("*.ipynb"))
MACHINE_PATH = re.compile(r"(/root/|/tmp/|/work/|/home/|/Users/)")


def toc_files() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return {ch["file"] for part in toc["parts"] for ch in part["chapters"]}


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_in_the_toc(path):
    assert str(path.relative_to(ROOT).with_suffix("")) in toc_files()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_title_and_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    setup = next(c for c in nb.cells if c.cell_type == "code")
    repo_url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    assert f'REPO_URL = "{repo_url}"' in setup.source, "setup cell must install from _config.yml's URL"
    assert f'PROFILE, SETUP = setup_page("{path.stem}")' in setup.source, "setup_page(<stem>)"
    assert "print(SETUP)" in setup.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_are_clean(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "commit executed notebooks"
    assert any(c.outputs for c in code)
    for c in code:
        for out in c.outputs:
            text = str(out)
            assert out.output_type != "error", f"{path.name}: error output"
            assert "Traceback" not in text and "Warning:" not in text, f"{path.name}: {text[:200]}"
            assert not MACHINE_PATH.search(text), f"{path.name}: machine path in {text[:200]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_reusable_code_in_notebooks(path):
    nb = nbformat.read(path, as_version=4)
    for c in nb.cells:
        if c.cell_type == "code":
            assert not re.search(r"^\s*(def|class) ", c.source, re.M), \
                f"{path.name}: define functions and classes in mgpu_lib"
