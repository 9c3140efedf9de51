"""The book as laid out: tools/check_layout.py in headless Chromium on planted pages, then
(MGPU_CHECK_BOOK=1, as `make test` sets it) on the real build.

The planted pages copy the markup that matters of jupyter-book 1.x: an ``article.bd-article``
column, sections with ``span.section-number`` headings, cells as ``div.cell > div.cell_input /
div.cell_output``, and each page's source under ``_sources/`` (how check_book finds the pages).
Without Chromium or Playwright every test here is skipped with one line saying so.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
_spec = importlib.util.spec_from_file_location("check_layout", ROOT / "tools" / "check_layout.py")
check_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layout)

pytestmark = pytest.mark.slow  # each test drives a browser

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8" /><title>{name}</title>
<meta name="viewport" content="width=device-width, initial-scale=1" />
<style>body {{ margin: 0; }} article.bd-article {{ max-width: 700px; margin: 0 auto;
padding: 0 16px; }} img {{ max-width: 100%; height: auto !important; }}
pre {{ overflow-x: auto; }} .pst-scrollable-table-container {{ overflow-x: auto; }}</style>
</head><body><main><article class="bd-article">
<section id="{name}">
<h1><span class="section-number">{number}. </span>A page<a class="headerlink" href="#">#</a></h1>
<section id="part">
<h2><span class="section-number">{number}.1. </span>Part<a class="headerlink" href="#">#</a></h2>
<p>Prose that may name NaN as a concept, and code like <code>math.isnan(x)</code>.</p>
{body}
</section></section>
</article></main></body></html>
"""


def cell(source: str, output: str | None) -> str:
    """A myst-nb code cell: its source, then its outputs (None: no output at all)."""
    out = "" if output is None else f'<div class="cell_output docutils container">{output}</div>'
    return (f'<div class="cell docutils container"><div class="cell_input docutils container">'
            f'<div class="highlight"><pre>{source}</pre></div></div>{out}</div>')


def png(path: Path, width: int, height: int) -> str:
    """Write a width x height PNG and return its src (relative to a chapters/ page)."""
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (width, height), "steelblue").save(path)
    return f"../_images/{path.name}"


def write_page(root: Path, name: str, body: str, number: int = 1) -> Path:
    """chapters/<name>.html and its _sources/ entry, as jupyter-book writes them."""
    page = root / "chapters" / f"{name}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(PAGE.format(name=name, body=body, number=number), encoding="utf-8")
    src = root / "_sources" / "chapters" / f"{name}.ipynb"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("{}")
    return page


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module; skipped (one line) where there is none."""
    try:
        with check_layout.browser() as b:
            yield b
    except check_layout.BrowserMissing as e:
        pytest.skip(f"check_layout: {e}")


def problems(browser, root: Path) -> list[str]:
    pages = check_layout.toc_pages(root)
    return check_layout.check_pages(browser, root, pages)


def clean_body(root: Path) -> str:
    """What a good page holds: a scaled-down retina plot, a table, a value shown by a bare name."""
    src = png(root / "_images" / "plot.png", 1200, 600)
    return "\n".join([
        cell("plot()", f'<img alt="plot" src="{src}" style="width: 600px; height: 300px;" />'),
        cell("Table(...)", '<div class="pst-scrollable-table-container"><table><tr><th>lr</th>'
                           '<th>acc</th></tr><tr><td>50</td><td>diverged</td></tr></table></div>'),
        cell("x = 1\nx", '<div class="output text_plain"><pre>1</pre></div>'),
    ])


def test_clean_page_has_no_problems(browser, tmp_path: Path):
    write_page(tmp_path, "clean", clean_body(tmp_path))
    assert problems(browser, tmp_path) == []


# (what is planted, the body, the rule it must break, words the problem must carry, widths)
def _faults(root: Path) -> list:
    squash = png(root / "_images" / "squash.png", 400, 200)
    fixed = png(root / "_images" / "fixed.png", 1200, 600)
    wide_table = ("<table>" + "<tr>" + "".join(f"<td>column_{i}_with_long_unbreakable_text</td>"
                                               for i in range(12)) + "</tr></table>")
    return [
        ("squashed image",
         f'<img alt="p" src="{squash}" style="width: 400px; height: 400px !important;" />',
         "distorted image", "squash.png", {1280, 400}),
        ("inline height on a phone",
         f'<img alt="p" src="{fixed}" style="width: 600px; height: 300px !important;" />',
         "distorted image", "shown 368x300", {400}),
        ("over-wide table", f'<div class="pst-scrollable-table-container">{wide_table}</div>',
         "wider than the column", "table", {1280}),
        ("over-wide output", cell("print(x)", '<div class="output stream"><pre>'
                                  + "x" * 300 + "</pre></div>"),
         "wider than the column", "scrolls sideways", {1280}),
        ("visible nan", cell("Table(...)", "<table><tr><td>nan ± nan</td></tr></table>"),
         "visible nan", "nan ± nan", {1280, 400}),
        ("bare name rendering nothing", cell("explorer = make()\nexplorer", None),
         "bare name renders nothing", "'explorer'", {1280, 400}),
        ("heading numbered twice", '<section id="twice"><h2><span class="section-number">1.2. '
                                   '</span>1. A claim</h2></section>',
         "heading numbered twice", "1.2. 1. A claim", {1280, 400}),
    ]


FAULT_IDS = ["squashed image", "inline height on a phone", "over-wide table", "over-wide output",
             "visible nan", "bare name rendering nothing", "heading numbered twice"]


@pytest.mark.parametrize("planted", FAULT_IDS)
def test_planted_fault_is_reported(browser, tmp_path: Path, planted: str):
    name, body, rule, says, widths = next(f for f in _faults(tmp_path) if f[0] == planted)
    write_page(tmp_path, "faulty", clean_body(tmp_path) + body)
    found = problems(browser, tmp_path)
    assert {int(p.split("@")[1].split(":")[0]) for p in found} == widths, found
    assert all(p.startswith("chapters/faulty.html @") and f": {rule}: " in p and says in p
               for p in found), found


def test_repeated_heading_number_across_pages(browser, tmp_path: Path):
    write_page(tmp_path, "first", clean_body(tmp_path), number=3)
    write_page(tmp_path, "second", clean_body(tmp_path), number=3)
    found = problems(browser, tmp_path)
    assert len(found) == 2 and all("heading number repeated" in p for p in found), found


def test_main_exit_codes(tmp_path: Path, capsys):
    assert check_layout.main(["check_layout", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.skipif(os.environ.get("MGPU_CHECK_BOOK") != "1",
                    reason="set MGPU_CHECK_BOOK=1 (make test does) to lay out the built book")
def test_built_book_layout(browser):
    build = ROOT / "_build" / "html"
    if not (build / "_sources").is_dir():  # tests/test_book.py builds it first in `make test`
        jb = Path(sys.executable).parent / "jupyter-book"
        run = subprocess.run([str(jb), "build", str(ROOT)], capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    found = problems(browser, build)
    assert not found, f"{len(found)} layout problems in the built book:\n" + "\n".join(found)
