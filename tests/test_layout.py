"""The book as laid out: tools/check_layout.py in headless Chromium on planted pages, then
(MGPU_CHECK_BOOK=1, as `make test` sets it) on the real build.

The planted pages copy the markup that matters of jupyter-book 1.x: an ``article.bd-article``
column, sections with ``span.section-number`` headings, cells as ``div.cell > div.cell_input /
div.cell_output``, and each page's source under ``_sources/`` (how check_book finds the pages).
The sidebar tests copy the theme's toggles and the way pydata-sphinx-theme 0.17.1 binds them
(the first ``.primary-toggle`` only), with and without the book's _static/sidebar-toggles.js.
Without Chromium or Playwright every test here is skipped with one line saying so.
"""
from __future__ import annotations

import importlib.util
import os
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
    src.write_text("{}", encoding="utf-8")
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


# A display equation as MathJax writes it, `width` px wide; `style` is its box's.
EQUATION = ('<div class="math notranslate nohighlight"><mjx-container class="MathJax" jax="CHTML" '
            'display="true" style="display: block; overflow-x: auto; {style}"><span '
            'style="display: inline-block; width: {width}px">n_i = N s_i / sum_j s_j</span>'
            '</mjx-container></div>')
SHADOW = "background: linear-gradient(to left, white, transparent) right / 1rem 100% no-repeat;"


FADE = "mask-image: linear-gradient(to left, rgba(0, 0, 0, 0.15), #000 2.5rem);"


def clean_body(root: Path) -> str:
    """What a good page holds: a scaled-down retina plot, a table, a value shown by a bare name,
    a captioned figure that links to its file, TeX shown as code, a wide equation that scrolls
    and shows it, and a long name in inline code that may wrap."""
    src = png(root / "_images" / "plot.png", 1200, 600)
    return "\n".join([
        cell("plot()", f'<img alt="plot" src="{src}" style="width: 600px; height: 300px;" />'),
        cell("plot()", f'<figure><a class="reference internal image-reference" href="{src}">'
                       f'<img alt="Accuracy per epoch." src="{src}" /></a>'
                       '<figcaption>Fig. 1.1 Accuracy per epoch.</figcaption></figure>'),
        "<p>Typed as <code>\\(N(0, 0.01^2)\\)</code> or <code>$$x$$</code> in Markdown.</p>",
        EQUATION.format(style=SHADOW, width=560),
        '<p>The cap is <code class="docutils literal" style="overflow-wrap: anywhere">'
        f'{"torch.distributed._DEFAULT_FIRST_BUCKET_BYTES" * 2}</code>.</p>',
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
        ("over-wide table", f'<div class="pst-scrollable-table-container" style="{FADE}">'
                            f'{wide_table}</div>',
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
        ("unbreakable name", '<p>The cap is <code class="docutils literal"><span class="pre" '
                             'style="white-space: nowrap">'
                             + "torch.distributed.algorithms._DEFAULT_FIRST_BUCKET_BYTES_x2"
                             + "</span></code>"
                             "</p>",
         "page scrolls sideways", "torch.distributed.algorithms", {400}),
        ("clipped equation", EQUATION.format(style="overflow-x: hidden;", width=560),
         "display math cut", "and is clipped", {400}),
        ("equation scrolling unseen", EQUATION.format(style="", width=560),
         "display math cut", "nothing showing that it does", {400}),
        ("raw TeX", r"<p>Weights drawn from \(N(0, 0.01^2)\), as MathJax would show them.</p>",
         "raw TeX", r"\(N(0, 0.01^2)\)", {1280, 400}),
        ("path as alt text", f'<img alt="../_images/{Path(fixed).name}" src="{fixed}" />',
         "path as alt text", "fixed.png", {1280, 400}),
        ("figure without a link", f'<figure><img alt="A plot." src="{fixed}" /><figcaption>Fig. '
                                  '1.2 A plot.</figcaption></figure>',
         "figure not linked", "no link to its file", {1280, 400}),
        ("console error", '<script>console.error("boom: widget state missing")</script>',
         "console error", "boom: widget state missing", {1280, 400}),
        ("script included twice", '<script>const THEBE_JS_URL = "x";</script>'
                                  '<script>const THEBE_JS_URL = "x";</script>',
         "console error", "THEBE_JS_URL", {1280, 400}),
        ("script from a CDN", '<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/'
                              'tex-mml-chtml.js"></script>',
         "request to another host", "cdn.jsdelivr.net", {1280, 400}),
        ("missing file", '<img alt="gone" src="../_images/gone.png" />',
         "failed request", "gone.png", {1280, 400}),
        ("table scrolling unseen",   # fits the 1280 column, not a phone's
         '<div class="pst-scrollable-table-container"><table><tr>'
         + "".join(f"<td>column_{i}_wide</td>" for i in range(6)) + "</tr></table></div>",
         "table scrolls unseen", "no fade or shadow", {400}),
    ]


FAULT_IDS = ["squashed image", "inline height on a phone", "over-wide table", "over-wide output",
             "visible nan", "bare name rendering nothing", "heading numbered twice",
             "unbreakable name", "clipped equation", "equation scrolling unseen", "raw TeX",
             "path as alt text", "figure without a link", "console error",
             "script included twice", "script from a CDN", "missing file",
             "table scrolling unseen"]


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


# The theme's sidebar as jupyter-book 1.x writes it: the top bar's toggle first (hidden), the
# article header's visible one, the <dialog> the sidebar moves into below 992 px; and the way
# pydata-sphinx-theme 0.17.1 (and sphinx-book-theme 1.3.0 on wide screens) bind the toggle:
# document.querySelector(".primary-toggle"), the hidden one (pydata-sphinx-theme issue 2451).
SIDEBAR = """
<style>#pst-primary-sidebar {{ position: fixed; left: 0; top: 0; width: 240px; }}
@media (max-width: 991px) {{ #pst-primary-sidebar {{ left: -300px; }} }}
.pst-sidebar-hidden {{ visibility: hidden; }} .bd-header button {{ display: none; }}
.bd-header-article button:focus-visible {{ outline: 3px solid #c132af; }}</style>
<header class="bd-header"><button class="sidebar-toggle primary-toggle">top bar</button></header>
<div class="bd-header-article"><button class="sidebar-toggle primary-toggle"
  title="Toggle primary sidebar">&#9776;</button></div>
<dialog id="pst-primary-sidebar-modal"></dialog>
<div id="pst-primary-sidebar"><nav><ul><li><a href="#part">1. Part</a></li></ul></nav></div>
<div style="height: 3000px"></div>
<script>{fix}</script>
<script>
  const toggle = document.querySelector("{bound}");
  const dialog = document.getElementById("pst-primary-sidebar-modal");
  const sidebar = document.getElementById("pst-primary-sidebar");
  toggle.addEventListener("click", (event) => {{
    event.preventDefault();
    event.stopPropagation();
    if (window.matchMedia("(min-width: 992px)").matches) {{
      sidebar.classList.toggle("pst-sidebar-hidden");
    }} else {{
      Array.from(sidebar.childNodes).forEach((node) => dialog.appendChild(node));
      dialog.showModal();
    }}
  }});
</script>
"""


def test_sidebar_toggle_bound_by_the_theme_alone_is_reported(browser, tmp_path: Path):
    write_page(tmp_path, "nav",
               clean_body(tmp_path) + SIDEBAR.format(fix="", bound=".primary-toggle"))
    found = problems(browser, tmp_path)
    assert len(found) == 3 and all(": sidebar toggle does nothing: " in p for p in found), found
    assert any("@400" in p and "shows no link" in p for p in found), found
    assert any("@900" in p and "shows no link" in p for p in found), found
    assert any("@1280" in p and "does not hide" in p for p in found), found


def test_sidebar_toggles_script_opens_the_sidebar(browser, tmp_path: Path):
    """_static/sidebar-toggles.js makes the visible toggle work at 400, 900 and 1280 px."""
    fix = (ROOT / "_static" / "sidebar-toggles.js").read_text(encoding="utf-8")
    write_page(tmp_path, "nav",
               clean_body(tmp_path) + SIDEBAR.format(fix=fix, bound=".primary-toggle"))
    assert problems(browser, tmp_path) == []


def test_drawer_left_open_after_a_tap_is_reported(browser, tmp_path: Path):
    """A theme that binds the visible toggle opens the drawer, which a tap on a link leaves open
    (pydata-sphinx-theme's dialog closes on its backdrop and Escape only)."""
    body = SIDEBAR.format(fix="", bound=".bd-header-article .primary-toggle")
    write_page(tmp_path, "nav", clean_body(tmp_path) + body)
    found = problems(browser, tmp_path)
    assert {p.split(":")[0] for p in found} == {"chapters/nav.html @400", "chapters/nav.html @900"}
    assert all(": drawer stays open after a tap: " in p and "'#part'" in p for p in found), found


def test_drawer_closes_after_a_tap(browser, tmp_path: Path):
    """_static/sidebar-toggles.js closes the drawer on a tap of its link, and the page goes to
    the link's section."""
    fix = (ROOT / "_static" / "sidebar-toggles.js").read_text(encoding="utf-8")
    body = SIDEBAR.format(fix=fix, bound=".bd-header-article .primary-toggle")
    page = write_page(tmp_path, "nav", clean_body(tmp_path) + body)
    assert problems(browser, tmp_path) == []
    tab = check_layout.open_page(browser, page, 400)
    try:
        tab.locator(".bd-header-article .primary-toggle").tap()
        tab.locator("#pst-primary-sidebar-modal a").tap()
        tab.wait_for_timeout(300)
        assert not tab.evaluate("document.getElementById('pst-primary-sidebar-modal').open")
        assert tab.evaluate("location.hash") == "#part"
        assert tab.evaluate("document.querySelector('#part').getBoundingClientRect().top") < 100
    finally:
        tab.close()


# The article header's buttons as sphinx-book-theme writes them, the theme's colours in both
# modes, and Bootstrap's rule that takes the outline off a focused .btn.
THEME = """<style>
html[data-theme=light] {{ --pst-color-background: #fff; --pst-color-text-base: #222832;
  --pst-color-text-muted: #48566b; --pst-color-border: #d1d5da; --pst-color-surface: #f3f4f5;
  --pst-color-primary: #0a7d91; --pst-color-accent: #c132af; --pst-color-on-background: #fff;
  color-scheme: light; }}
html[data-theme=dark] {{ --pst-color-background: #121212; --pst-color-text-base: #ced6dd;
  --pst-color-text-muted: #9ca4af; --pst-color-border: #48566b; --pst-color-surface: #29313d;
  --pst-color-primary: #3fb1c5; --pst-color-accent: #e47fd7; --pst-color-on-background: #222832;
  color-scheme: dark; }}
body {{ background: var(--pst-color-background); color: var(--pst-color-text-base); }}
.btn:focus-visible {{ box-shadow: none; outline: 0; }}
html[data-theme=dark] .bd-content div.cell_output .text_html:not(:has(table.dataframe)) {{
  background-color: var(--pst-color-text-base); border-radius: .25rem;
  color: var(--pst-color-on-background); padding: .5rem; }}
</style>{css}"""
HEADER = """<div class="bd-header-article"><button class="sidebar-toggle primary-toggle btn btn-sm">
<span>&#9776;</span></button><div class="article-header-buttons">
<div class="dropdown dropdown-launch-buttons"><button class="btn dropdown-toggle" type="button"
  aria-label="Launch interactive content">Launch</button></div>
<a href="#part" class="btn btn-sm btn-source-repository-button" title="Source">Source</a>
<div class="dropdown dropdown-download-buttons"><button class="btn dropdown-toggle" type="button"
  aria-label="Download this page">Download</button></div></div></div>"""


def _css(name: str) -> str:
    return "<style>" + (ROOT / "_static" / name).read_text(encoding="utf-8") + "</style>"


def test_header_buttons_without_a_focus_ring_are_reported(browser, tmp_path: Path):
    write_page(tmp_path, "header", THEME.format(css="") + HEADER + clean_body(tmp_path))
    found = problems(browser, tmp_path)
    assert all(": no focus ring: " in p for p in found), found
    for width in (400, 1280):
        for mode in ("light", "dark"):
            named = {name for name in ("☰", "Launch", "Source", "Download")
                     if any(f"@{width}:" in p and f"{mode} mode" in p and name in p
                            for p in found)}
            assert named == {"☰", "Launch", "Source", "Download"}, (width, mode, found)


def test_header_buttons_show_a_focus_ring(browser, tmp_path: Path):
    """custom.css: a 3 px ring in the theme's accent, 3:1 or more in light and dark mode."""
    write_page(tmp_path, "header",
               THEME.format(css=_css("custom.css")) + HEADER + clean_body(tmp_path))
    assert problems(browser, tmp_path) == []


def test_page_assets_keeps_mathjax_only_where_the_page_has_math():
    """_ext/page_assets.py: Sphinx counts a page's toctree in "has equations" (the intro loaded
    MathJax for its chapters); each page keeps MathJax's two scripts only for its own math."""
    from types import SimpleNamespace
    from sphinx.builders.html._assets import _JavaScript
    sys.path.insert(0, str(ROOT / "_ext"))
    import page_assets
    math = SimpleNamespace(data={"has_equations": {"intro": False, "chapters/08": True}})
    app = SimpleNamespace(config=SimpleNamespace(mathjax_path="mathjax/tex-chtml.js"),
                          env=SimpleNamespace(get_domain=lambda name: math))

    def scripts(page: str) -> list[str]:
        context = {"script_files": [
            _JavaScript("_static/doctools.js"), _JavaScript("", body="window.MathJax = {}"),
            _JavaScript("_static/mathjax/tex-chtml.js", defer="defer"),
            _JavaScript("", body="const X = 1;"), _JavaScript(None, body="const X = 1;")]}
        page_assets.page_scripts(app, page, "page.html", context, None)
        return [js.filename or js.attributes["body"] for js in context["script_files"]]

    assert scripts("intro") == ["_static/doctools.js", "const X = 1;"]
    assert scripts("chapters/08") == ["_static/doctools.js", "window.MathJax = {}",
                                      "_static/mathjax/tex-chtml.js", "const X = 1;"]


def test_is_local():
    assert check_layout.is_local("file:///work/_build/html/intro.html")
    assert check_layout.is_local("data:image/png;base64,iVBORw0KGgo=")
    assert check_layout.is_local("http://localhost:8000/intro.html")
    assert check_layout.is_local("http://127.0.0.1/x.js")
    assert not check_layout.is_local("https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js")
    assert not check_layout.is_local("https://localhost.example.org/x.js")


def test_main_exit_codes(tmp_path: Path, capsys):
    assert check_layout.main(["check_layout", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.skipif(os.environ.get("MGPU_CHECK_BOOK") != "1",
                    reason="set MGPU_CHECK_BOOK=1 (make test does) to lay out the built book")
def test_built_book_layout(browser, built_book):
    found = problems(browser, built_book)
    assert not found, f"{len(found)} layout problems in the built book:\n" + "\n".join(found)


# The explorers (mgpu_lib/book/explore.py, issue 38): their view works offline, driven from the
# keyboard, and shows the library's prediction for the setting the controls name.
EXPLORER_CPUS = {"the slower recorded CPU": 60.0, "the faster recorded CPU": 110.0}


def pcie_sync_s(spec) -> float:
    """ex2's sync: the gradients in and the weights out over the GPU's PCIe link."""
    from mgpu_lib.perf.evidence import workload
    from mgpu_lib.perf.scaling import LINKS
    w = workload(64)
    return 2 * w.bytes_per_param * w.params / (LINKS[spec.pcie].gbs * 1e9)


def _shown_time(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def k80_epoch(n: int) -> str:
    """The library's middle for ex1's default: K80 dies, DataParallel, 256 images per die."""
    from mgpu_lib.perf.evidence import band, epoch_time
    from mgpu_lib.perf.scaling import DEVICES
    k80 = DEVICES["K80 (one GK210 die)"]
    return _shown_time(band(epoch_time(n, 256 * n, k80, strategy="dp"), k80)[1])


def split_step(share: int, cpu_ips: float) -> str:
    """The library's step (ms) for ex2's default: a V100 and a CPU at `cpu_ips`, batch 256."""
    from mgpu_lib.perf.runtime import step_seconds
    from mgpu_lib.perf.scaling import DEVICES
    from mgpu_lib.perf.split_time import predict_hetero_step
    v100 = DEVICES["V100 SXM2"]
    speeds = [256 / step_seconds(v100, 256), cpu_ips]
    return _shown_time(1e3 * predict_hetero_step(speeds, [256 - share, share], pcie_sync_s(v100)))


def gpus_at(tab) -> int:
    """How many GPUs ex1's explorer on the page is set to (its range's output)."""
    return int(tab.locator('.mgpu-explorer[data-explorer="gpus"] output').first.inner_text())


def moved_gpus(tab) -> list[str]:
    """ex1's GPUs from where it opens to 16 with the keyboard: what disagrees with the library."""
    n = gpus_at(tab)
    before = check_layout.explorer_shows(tab, "gpus")
    after = check_layout.press(tab, "gpus", "n", "End")
    if (before["mid"], after["mid"]) == (k80_epoch(n), k80_epoch(16)):
        return []
    return [f"ex1 shows {before['mid']} then {after['mid']} s per epoch, the library "
            f"{k80_epoch(n)} then {k80_epoch(16)}"]


def moved_split(tab, cpu_ips: float) -> list[str]:
    """ex2's share one step up with the keyboard: what disagrees with the library."""
    before = check_layout.explorer_shows(tab, "split")
    after = check_layout.press(tab, "split", "share", "ArrowRight")
    share = int(after["share"])
    if share > int(before["share"]) and after["mid"] == split_step(share, cpu_ips):
        return []
    return [f"ex2 at share {share} shows {after['mid']} ms, the library "
            f"{split_step(share, cpu_ips)}"]


def explorers_move(browser, pages: dict, width: int, cpu_ips: float) -> list[str]:
    """Open each page of {explorer: page} at `width`, other hosts blocked, and move its
    explorer; what disagrees with the library, and each page's errors and requests."""
    found = []
    for explorer, page in pages.items():
        log: dict = {}
        tab = check_layout.open_page(browser, page, width, log)
        try:
            if check_layout.explorer_shows(tab, explorer) is None:
                found.append(f"{page.name}: no {explorer} explorer")
                continue
            found += moved_gpus(tab) if explorer == "gpus" else moved_split(tab, cpu_ips)
        finally:
            tab.close()
        found += [f"{page.name}: " + ": ".join(p) for p in check_layout.logged(log)]
    return found


def explorer_page(root: Path, css: str | None = None) -> Path:
    """A planted page with both views as myst-nb writes an HTML output, the theme's colours in
    both modes with its dark-mode box behind HTML outputs, its Bootstrap rule that hides every
    [hidden], and the book's _static/explorer.css (or `css`) and explorer.js."""
    import shutil
    from mgpu_lib.book.explore import gpus_explorer, split_explorer
    (root / "_static").mkdir(parents=True, exist_ok=True)
    for name in ("explorer.css", "explorer.js"):
        shutil.copy(ROOT / "_static" / name, root / "_static" / name)
    if css is not None:
        (root / "_static" / "explorer.css").write_text(css, encoding="utf-8")
    views = [gpus_explorer().view, split_explorer(EXPLORER_CPUS, pcie_sync_s).view]
    return write_page(root, "explore", THEME.format(css="")
                      + "<style>[hidden] { display: none !important; }</style>"
                      '<link rel="stylesheet" href="../_static/explorer.css">'
                      '<div class="bd-content">'
                      + "".join(cell("explorer()", f'<div class="output text_html">{v}</div>')
                                for v in views)
                      + '</div><script src="../_static/explorer.js"></script>')


@pytest.fixture(scope="module")
def planted_explorers(tmp_path_factory) -> Path:
    return explorer_page(tmp_path_factory.mktemp("explorers"))


@pytest.mark.parametrize("width", check_layout.WIDTHS)
def test_explorers_follow_their_controls_offline(browser, planted_explorers, width):
    slower = EXPLORER_CPUS["the slower recorded CPU"]
    pages = dict.fromkeys(("gpus", "split"), planted_explorers)
    assert explorers_move(browser, pages, width, slower) == []


def test_explorers_lay_out_cleanly(browser, planted_explorers):
    """Among the rules: every label and line of text at 4.5:1 or more in light and dark mode."""
    assert problems(browser, planted_explorers.parent.parent) == []


def test_explorers_read_in_dark_mode(browser, planted_explorers):
    """Dark mode: a label on the page's own dark background at WCAG AA, the radios drawn for
    the same dark scheme as the box they sit in (not dark radios in the theme's light box)."""
    tab = check_layout.open_page(browser, planted_explorers, 400)
    try:
        tab.evaluate("document.documentElement.dataset.theme = 'dark'")
        legend = tab.locator('.mgpu-explorer[data-explorer="gpus"] legend').first
        ratio = legend.evaluate("""(el) => {
          const rgb = c => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
          const lum = c => c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92
                                       : Math.pow((v + 0.055) / 1.055, 2.4); })
                            .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
          let bg = el;
          while (getComputedStyle(bg).backgroundColor === 'rgba(0, 0, 0, 0)') bg = bg.parentElement;
          const a = lum(rgb(getComputedStyle(el).color));
          const b = lum(rgb(getComputedStyle(bg).backgroundColor));
          return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }""")
        assert ratio >= 4.5, ratio
        radio = tab.locator('.mgpu-explorer[data-explorer="gpus"] input[type="radio"]').first
        assert radio.evaluate("r => getComputedStyle(r).colorScheme") == "dark"
        behind = radio.evaluate("""(r) => { let e = r;
          while (getComputedStyle(e).backgroundColor === 'rgba(0, 0, 0, 0)') e = e.parentElement;
          return getComputedStyle(e).backgroundColor; }""")
        assert behind == "rgb(18, 18, 18)", behind   # the page's dark background
    finally:
        tab.close()


def test_explorer_in_the_themes_light_box_is_reported(browser, tmp_path: Path):
    """Without explorer.css's colours (the page's own, in the explorer and in the output that
    holds it) the theme's light box behind HTML outputs holds the explorer's muted labels, grey
    on light grey (1.71:1 in the book)."""
    css = (ROOT / "_static" / "explorer.css").read_text(encoding="utf-8")
    own = "  color: var(--pst-color-text-base);\n  background: var(--pst-color-background);\n"
    assert own in css
    css = css[:css.index("/* Dark mode:")].replace(own, "")
    explorer_page(tmp_path, css=css)
    found = problems(browser, tmp_path)
    assert found and all(": explorer text low contrast: explorer: dark mode: " in p
                         for p in found), found
    assert any("'GPU' at 1.71:1" in p for p in found), found


def test_mathjax_only_with_math(browser, tmp_path: Path):
    """A page that loads MathJax has math to typeset (_ext/page_assets.py drops it elsewhere)."""
    config = '<script>window.MathJax = {"options": {}}</script>'
    write_page(tmp_path, "plain", cell("x = 1\nx", '<pre>1</pre>') + config)
    found = problems(browser, tmp_path)
    assert len(found) == 2 and all(": MathJax without math: " in p for p in found), found
    write_page(tmp_path, "plain", clean_body(tmp_path) + config)   # its equation: math
    assert problems(browser, tmp_path) == []


@pytest.mark.skipif(os.environ.get("MGPU_CHECK_BOOK") != "1",
                    reason="set MGPU_CHECK_BOOK=1 (make test does) to drive the built book")
@pytest.mark.parametrize("width", check_layout.WIDTHS)
def test_built_book_explorers_follow_their_controls(browser, built_book, width):
    """ex1's and ex2's pages as built: the keyboard moves each explorer to the library's value,
    with every other host blocked."""
    from mgpu_lib.book.pages import recorded_cpu_rates
    from mgpu_lib.perf.evidence import workload
    build = built_book / "exercises"
    flops = workload(64).train_flops
    slower = min(r[min(r, key=lambda k: abs(k - 64))] / flops
                 for r in recorded_cpu_rates().values())
    pages = {"gpus": build / "ex1_hyperparameters.html", "split": build / "ex2_cpu_gpu_split.html"}
    assert explorers_move(browser, pages, width, slower) == []


@pytest.mark.skipif(os.environ.get("MGPU_CHECK_BOOK") != "1",
                    reason="set MGPU_CHECK_BOOK=1 (make test does) to drive the built book")
def test_built_book_ex1_explorer_opens_at_two_gpus(browser, built_book):
    """At 1 GPU ex1's Strategy, Batch and Link change nothing: the page opens at 2, as the
    widget does (mgpu_lib/book/explore.py; the page's stored output, once re-executed)."""
    from mgpu_lib.book.explore import GPUS_DEFAULT_N
    page = built_book / "exercises" / "ex1_hyperparameters.html"
    tab = check_layout.open_page(browser, page, 400)
    try:
        assert gpus_at(tab) == GPUS_DEFAULT_N == 2
    finally:
        tab.close()


def test_explorer_view_shows_what_the_widget_shows(browser, planted_explorers):
    """After a reader changes the GPU, the strategy, what the batch counts and the GPUs, the
    book's view shows, word for word, what the live widget shows for the same setting."""
    from mgpu_lib.book.explore import gpus_explorer
    tab = check_layout.open_page(browser, planted_explorers, 400)
    try:
        view = tab.locator('.mgpu-explorer[data-explorer="gpus"]')
        view.locator('select[name="gpu"]').select_option(label="V100 SXM2")
        view.get_by_label("DDP").check()
        view.get_by_label("global").check()
        view.locator('select[name="batch"]').select_option(label="1024")
        shown = check_layout.press(tab, "gpus", "n", "End", "ArrowLeft")   # 15 GPUs
    finally:
        tab.close()
    widget = gpus_explorer()
    c = widget.controls
    c["gpu"].value, c["strategy"].value, c["mode"].value = "V100 SXM2", "DDP", "global"
    c["batch"].value, c["n"].value = 1024, 15
    assert shown == {k: widget.shown(k) for k in shown}
