"""The book as read: tools/check_book.py on planted pages, then (MGPU_CHECK_BOOK=1) on the real build.

The planted pages copy the markup of jupyter-book 1.x (sphinx-book-theme, myst-nb): an
``article.bd-article``, cells as ``div.cell > div.cell_input / div.cell_output``, launch links in
``div.dropdown-launch-buttons``, and each page's source under ``_sources/``.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_book", ROOT / "tools" / "check_book.py")
check_book = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_book)

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8" /><title>{name}</title></head>
<body>
<div id="pst-skip-link" class="skip-link d-print-none"><a href="#main-content">Skip to main content</a></div>
<main id="main-content" class="bd-main" role="main">
<div class="dropdown dropdown-launch-buttons"><ul class="dropdown-menu">
{launch}
</ul></div>
<article class="bd-article">
<section class="tex2jax_ignore mathjax_ignore" id="{name}">
<h1>A page<a class="headerlink" href="#{name}" title="Link to this heading">#</a></h1>
<p>Text with a <a class="reference internal" href="target.html#section-a">link</a>.</p>
{body}
</section>
</article>
</main>
</body></html>
"""
LAUNCH = """<li><a href="https://colab.research.google.com/github/o/r/blob/main/chapters/{name}.ipynb"
   class="btn btn-sm dropdown-item" title="Launch on Colab"><span class="btn__icon-container">
<img alt="Colab logo" src="../_static/images/logo_colab.png"></span></a></li>
<li><a href="https://mybinder.org/v2/gh/o/r/main?urlpath=tree/chapters/{name}.ipynb"
   class="btn btn-sm dropdown-item" title="Launch on Binder"></a></li>"""


def cell(source: str, output: str) -> str:
    """A myst-nb code cell: highlighted source, then its outputs."""
    return f"""<div class="cell docutils container">
<div class="cell_input docutils container">
<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>{source}
</pre></div>
</div>
</div>
<div class="cell_output docutils container">
{output}
</div>
</div>"""


def stream(text: str, kind: str = "stream") -> str:
    """A stream (or text_plain) output block."""
    return (f'<div class="output {kind} highlight-myst-ansi notranslate"><div class="highlight">'
            f"<pre><span></span>{text}\n</pre></div>\n</div>")


FIGURE = """<figure class="align-default" id="fig-speed">
<img alt="../_images/plot.png" src="../_images/plot.png" />
<figcaption>
<p>{number}<span class="caption-text">Throughput by devices</span><a class="headerlink" href="#fig-speed" title="Link to this image">#</a></p>
</figcaption>
</figure>"""
OUTPUT_TABLE = """<div class="pst-scrollable-table-container">
<table class="table">{caption}
<thead><tr><th class="head"><p>lr</p></th><th class="head"><p>acc</p></th></tr></thead>
<tbody><tr><td><p>0.1</p></td><td><p>0.812</p></td></tr></tbody>
</table>
</div>"""
NUMBERED = ('<caption><span class="caption-number">Table 1 </span>'
            '<span class="caption-text">Accuracy by lr</span></caption>')
CLEAN_BODY = "\n".join([
    cell('<span class="c1"># train on the devices</span>\n<span class="nb">print</span>(<span class="s2">"ok"</span>)',
         stream("epoch 1: loss 0.52, test acc 0.81")
         + '\n<img alt="../_images/plot.png" src="../_images/plot.png" />'),
    FIGURE.format(number='<span class="caption-number">Fig. 1 </span>'),
    cell("Table(...)", OUTPUT_TABLE.format(caption=NUMBERED)),
    FIGURE.format(number='<span class="caption-number">Fig. E1.2 </span>'),
    '<p><img alt="dot" src="data:image/png;base64,iVBORw0KGgo=" /></p>',
    '<div class="highlight-bash notranslate"><div class="highlight"><pre><span></span>make book\n</pre></div></div>',
])
LONG = "reference:  935.2 images/s median (935.2, 869.1, 935.3); 0.160 TFLOP/s, 21% of the peak 0.76"


def write_page(root: Path, name: str, body: str, launch: bool = True, source: str = ".ipynb") -> Path:
    """Write chapters/<name>.html and its _sources/ copy, as jupyter-book does."""
    page = root / "chapters" / f"{name}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(PAGE.format(name=name, body=body, launch=LAUNCH.format(name=name) if launch else ""), encoding="utf-8")
    src = root / "_sources" / "chapters" / f"{name}{source}"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("{}", encoding="utf-8")
    return page


@pytest.fixture
def build(tmp_path: Path) -> Path:
    """A planted build: a clean page `target`, the image, and the theme's logos."""
    for f in ("_images/plot.png", "_static/images/logo_colab.png"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"\x89PNG")
    write_page(tmp_path, "target", CLEAN_BODY + '\n<section id="section-a"><h2>A</h2></section>')
    (tmp_path / "genindex.html").write_text("<html><body><a href='nowhere.html'>x</a></body></html>", encoding="utf-8")
    return tmp_path


def test_clean_pages_have_no_problems(build: Path):
    write_page(build, "prose", '<div class="admonition tip">\n<p class="admonition-title">In short</p>\n'
               "<p>" + "A short plain answer. " * 17 + "</p>\n</div>", launch=False, source=".md")
    assert check_book.check_build(build) == []
    assert check_book.main(["check_book", str(build)]) == 0


# (what is planted, the page body, the text that locates the problem's line, words it must say)
FAULTS = [
    ("long output line", cell("print(x)", stream(LONG)), "reference:", f"output line {len(LONG)} chars"),
    ("long code line", cell("x = " + "1 + " * 30 + "1", stream("ok")), "x = 1 +", "code-cell line"),
    ("harness comment", cell('<span class="c1"># NBVAL_IGNORE_OUTPUT</span>\nx = 1', stream("1")),
     "NBVAL", "'# NBVAL_IGNORE_OUTPUT'"),
    ("missing image", cell("plot()", '<img alt="p" src="../_images/gone.png" />'),
     "gone.png", "missing image: '../_images/gone.png'"),
    ("widget repr", cell("interact(f, n=3)", stream(
        "interactive(children=(IntSlider(value=3), Output()), _dom_classes=('widget-interact',))",
        "text_plain")), "interactive(", "widget repr: 'interactive(children="),
    ("link to a missing page", '<p><a class="reference internal" href="gone.html">x</a></p>',
     "gone.html", "no file chapters/gone.html"),
    ("link to a missing anchor", '<p><a class="reference internal" href="target.html#nope">x</a></p>',
     "#nope", "no id #nope in chapters/target.html"),
    ("figure without a number", FIGURE.format(number=""), "<figure", "unnumbered caption: 'Throughput"),
    ("table without a numbered caption", cell("Table(...)", OUTPUT_TABLE.format(caption="")),
     "<table", "table without a numbered caption: 'lr | acc'"),
    ("directive shown as text", '<pre><code>```{table} d2l\'s `train` against ours\n</code></pre>',
     "{table}", "directive shown as text: "),
    ("long short answer",
     '<div class="admonition tip">\n<p class="admonition-title">In short</p>\n<p>'
     + "Short words here. " * 24 + "</p>\n</div>", 'class="admonition tip"',
     "'In short' box of 72 words"),
    ("short answer with too many numbers",
     '<div class="admonition tip">\n<p class="admonition-title">In short</p>\n<p>It ran 1.5 '
     "times faster on 2 GPUs at batch 512 in 10 s.</p>\n</div>", 'class="admonition tip"',
     "'In short' box of 14 words and 4 numbers"),
    ("sentence too long", "<p>" + "word " * 41 + "end.</p>", "word word", "sentence of 42 words"),
    ("statistics in the lesson layer", "<p>Run 4 is ahead by 12.8 ± 2.6 points here.</p>",
     "ahead by", "statistics in visible prose ('±'"),
    ("figure without a caption",
     '<figure class="align-default">\n<img alt="p" src="../_images/plot.png" />\n</figure>',
     "<figure", "no caption: '../_images/plot.png'"),
]


@pytest.mark.parametrize("planted, body, locate, says", FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_fault_is_reported_with_page_and_line(build: Path, planted, body, locate, says):
    page = write_page(build, "faulty", body)
    line = next(i for i, text in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if locate in text)
    problems = check_book.check_build(build)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"chapters/faulty.html:{line}: "), problems
    assert says in problems[0], problems
    assert check_book.main(["check_book", str(build)]) == 1


def test_the_word_ceilings_hold_for_the_main_path_and_each_going_further_page(build: Path):
    sentence = "A plain sentence of six words. "
    write_page(build, "06_more", "<p>" + sentence * 201 + "</p>")           # 1,206 words
    write_page(build, "01_first", "<p>" + sentence * 850 + "</p>")          # 5,100 words
    problems = check_book.check_build(build)
    assert any(p.startswith("chapters/06_more.html:1: 12") and p.endswith(
        "visible words (at most 1200 on a going-further page)") for p in problems), problems
    assert any(p.startswith("the main path: 5") for p in problems), problems


def test_notebook_page_without_launch_button(build: Path):
    write_page(build, "faulty", CLEAN_BODY, launch=False)
    write_page(build, "prose", CLEAN_BODY, launch=False, source=".md")  # Markdown: no button needed
    assert check_book.check_build(build) == [
        "chapters/faulty.html:1: no launch button (Colab/Binder) for chapters/faulty.ipynb"]


def test_missing_build_exits_2(tmp_path: Path, capsys):
    assert check_book.main(["check_book", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.skipif(os.environ.get("MGPU_CHECK_BOOK") != "1",
                    reason="set MGPU_CHECK_BOOK=1 (make test does) to build the book and "
                           "check every page as read")
def test_built_book(built_book):
    problems = check_book.check_build(built_book)
    assert not problems, f"{len(problems)} problems in the built book:\n" + "\n".join(problems)
