"""Static checks of the committed notebooks: what `pytest --nbval` does not look at."""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).glob("*.ipynb"))
# The book's Sphinx extension that adds the Kaggle button (a plain module in _ext/).
_spec = importlib.util.spec_from_file_location("launch_kaggle", ROOT / "_ext" / "launch_kaggle.py")
kaggle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kaggle)

MACHINE_PATH = re.compile(r"(/root/|/tmp/|/work/|/home/|/Users/)")


def toc_files() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
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
    # issue 31: the answer first, before the setup cell and its output
    assert nb.cells[1].cell_type == "markdown" and "{admonition} In short" in nb.cells[1].source
    setup = next(c for c in nb.cells if c.cell_type == "code")
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    repo_url, branch = config["repository"]["url"], config["repository"]["branch"]
    assert f'REPO_URL = "{repo_url}"' in setup.source, \
        "setup cell must install from _config.yml's URL: run tools/set_repository.py"
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(
        encoding="utf-8"), re.M)[1]
    assert f'REPO_REF = "v{version}"' in setup.source and "@{REPO_REF}" in setup.source, \
        "setup cell must install the version the page was written for: tools/set_repository.py"
    assert "google.colab" in setup.source and "KAGGLE_KERNEL_RUN_TYPE" in setup.source
    # The launch links follow the same setting: the theme's Colab link, and Kaggle's from it.
    where = f"{repo_url.removeprefix('https://github.com/')}/blob/{branch}/{path.relative_to(ROOT)}"
    colab = f"{config['launch_buttons']['colab_url']}/github/{where}"
    assert kaggle.kaggle_url(colab) == f"https://kaggle.com/kernels/welcome?src={repo_url}/blob/" \
        f"{branch}/{path.relative_to(ROOT)}"
    assert config["sphinx"]["local_extensions"]["launch_kaggle"] == "_ext"
    assert f'PROFILE, SETUP = setup_page("{path.stem}")' in setup.source, "setup_page(<stem>)"
    assert "print(SETUP)" in setup.source


def _install_part(path: Path) -> str:
    """The setup cell's install step: what runs before it imports mgpu_lib."""
    setup = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    return setup.source.split("from mgpu_lib")[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_setup_cell_installs_what_is_named_and_refuses_an_empty_name(path, monkeypatch):
    """Before (issue 33): `MGPU_INSTALL=""` installed nothing without a word. Run where mgpu_lib
    is missing: a name is what pip installs; an empty one is a one-line error, and no pip."""
    import subprocess
    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    monkeypatch.setenv("MGPU_INSTALL", " ./a/checkout ")
    exec(_install_part(path), {})
    assert [argv[-1] for argv in calls] == ["./a/checkout"] and calls[0][1:4] == ["-m", "pip",
                                                                                 "install"]
    monkeypatch.setenv("MGPU_INSTALL", " ")
    with pytest.raises(ValueError, match="MGPU_INSTALL is empty") as e:
        exec(_install_part(path), {})
    assert "\n" not in str(e.value) and len(calls) == 1
    monkeypatch.setenv("MGPU_INSTALL", "--help")       # issue 39: was passed to pip as an option
    with pytest.raises(ValueError, match="not an option") as e:
        exec(_install_part(path), {})
    assert "\n" not in str(e.value) and len(calls) == 1


def test_the_kaggle_button_follows_colabs():
    colab = "https://colab.research.google.com/github/o/r/blob/main/chapters/05_ddp.ipynb"
    launch = {"label": "launch-buttons", "buttons": [{"text": "Binder"}, {"text": "Colab",
                                                                          "url": colab}]}
    context = {"header_buttons": [{"label": "download-buttons"}, launch]}
    kaggle.add_kaggle(None, "chapters/05_ddp", "page.html", context, None)
    kaggle.add_kaggle(None, "chapters/05_ddp", "page.html", context, None)    # once only
    assert [b["text"] for b in launch["buttons"]] == ["Binder", "Colab", "Kaggle"]
    assert launch["buttons"][2]["url"] == \
        "https://kaggle.com/kernels/welcome?src=https://github.com/o/r/blob/main/chapters/05_ddp.ipynb"


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


SHOWN_AS_TEXT = ("text/html", "text/markdown", "image/png", "image/svg+xml")
MAX_COLUMNS = 88          # tools/check_book.py's limit, checked here without building the book


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_printed_output_lines_fit_the_column(path):
    """What the book shows as plain text (printed lines, and a result with no richer form)
    stays within the column: the built-book check finds the same, minutes later."""
    nb = nbformat.read(path, as_version=4)
    wide = []
    for i, c in enumerate(x for x in nb.cells if x.cell_type == "code"):
        for out in c.outputs:
            data = out.get("data", {})
            if out.output_type == "stream":
                text = out.text
            elif "text/plain" in data and not any(k in data for k in SHOWN_AS_TEXT) and \
                    not any(k.startswith("application/papermill") for k in data):
                text = data["text/plain"]
            else:
                continue
            wide += [f"code cell {i}: {len(line)} chars: {line[:60]}"
                     for line in text.splitlines() if len(line) > MAX_COLUMNS]
    assert not wide, f"{path.name}: " + "; ".join(wide)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_column(path):
    """The book shows every code cell (a hidden one opens in place): no line past the column,
    which the built-book check finds minutes later (tools/check_book.py)."""
    nb = nbformat.read(path, as_version=4)
    wide = [f"code cell {i}: {len(line)} chars: {line[:60]}"
            for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for line in c.source.splitlines() if len(line) > MAX_COLUMNS]
    assert not wide, f"{path.name}: " + "; ".join(wide)


CORE_IMPORT = re.compile(r"^\s*(from mgpu_lib\.(\w+) import|from mgpu_lib import (\w+))", re.M)
CORE = {p.stem for p in (ROOT / "mgpu_lib").glob("*.py")} - {"__init__", "__main__"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_pages_reach_the_core_through_mg(path):
    """As d2l's pages call `d2l.try_gpu()`, the pages call `mg.try_gpu()`: the core's names come
    from `import mgpu_lib as mg` (`mg.train`, `mg.data.load_raw`), never out of its modules;
    only the machinery (book, lab, perf) is imported by module. The chapter's pages (01 to 04)
    do not import a core module either; later pages may name the DDP program's module
    (`from mgpu_lib import ddp`), which 05 teaches as a program."""
    nb = nbformat.read(path, as_version=4)
    chapter = path.parent.name == "chapters" and path.name[:2] in ("01", "02", "03", "04")
    by_module = [f"code cell {i}: {m.group(0).strip()}"
                 for i, c in enumerate(nb.cells) if c.cell_type == "code"
                 for m in CORE_IMPORT.finditer(c.source)
                 if m.group(2) in CORE or (chapter and m.group(3) in CORE)]
    assert CORE and not by_module, f"{path.name}: " + "; ".join(by_module)


FIGSIZE = re.compile(r"figsize\s*=\s*\(\s*([\d.]+)")
FONTSIZE = re.compile(r"fontsize\s*=\s*([\d.]+)")


def figure_code() -> list[tuple[str, str]]:
    """(where, source) for every notebook code cell and library module that may draw."""
    found = [(f"{p.name} cell {i}", c.source) for p in NOTEBOOKS
             for i, c in enumerate(nbformat.read(p, as_version=4).cells) if c.cell_type == "code"]
    return found + [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
                    for p in (ROOT / "mgpu_lib").rglob("*.py")]


def test_figures_stay_readable_on_a_phone():
    """Issue 32: no figure wider than style.WIDTH_IN and no text set below style.MIN_FONT_PT,
    so every label renders at 9 px or more in the 352 px column of a 400 px phone."""
    from mgpu_lib.book.style import MIN_FONT_PT, WIDTH_IN
    wide = [f"{where}: figsize width {w}" for where, src in figure_code()
            for w in FIGSIZE.findall(src) if float(w) > WIDTH_IN]
    small = [f"{where}: fontsize {s}" for where, src in figure_code()
             for s in FONTSIZE.findall(src) if float(s) < MIN_FONT_PT]
    assert not wide + small, "; ".join(wide + small)
