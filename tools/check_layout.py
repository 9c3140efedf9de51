"""Check the built book's layout in a real browser, at desktop (1280 px) and phone (400 px) width.

    make book && .venv/bin/python tools/check_layout.py [_build/html]

tools/check_book.py reads the HTML as text; this opens every page of the table of contents in
headless Chromium (Debian's ``chromium``, driven by Playwright) and measures what a reader sees:

- ``distorted image``: an image whose rendered aspect ratio differs from its file's by more
  than ASPECT_TOLERANCE (an inline height that does not shrink with the width);
- ``wider than the column`` (1280 px only): a table, cell output or output block that is wider
  than the article's column, or scrolls sideways inside it;
- ``visible nan``: Python's ``nan`` anywhere a reader sees it except in code, and ``NaN``
  in cell outputs too (the prose may name NaN as a concept);
- ``bare name renders nothing``: a code cell whose last line is a bare name (its value is
  the cell's output) and that shows no output;
- ``heading numbered twice`` / ``heading number repeated``: a heading whose text starts with a
  number of its own after Sphinx's, or a section number that two headings carry.

Prints one line per problem, ``PAGE @WIDTH: what: detail``, and exits 1 if there are any, 0 if
none, 2 if the build or the browser is missing. Chromium: MGPU_CHROMIUM, else /usr/bin/chromium,
else ``chromium`` on PATH. Playwright only drives it; never run ``playwright install``.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_book import toc_pages  # noqa: E402  (tools/ is not a package)

WIDTHS = (1280, 400)
ASPECT_TOLERANCE = 0.05
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOAD_TIMEOUT_MS = 30_000
TWICE = re.compile(r"^\s*\d+(\.\d+)*[.)]\s")  # "1. Data is ..." after Sphinx's "4.1. "


class BrowserMissing(RuntimeError):
    """No Chromium, or no Playwright, on this machine."""


def chromium_path() -> str | None:
    """The Chromium to drive: MGPU_CHROMIUM, /usr/bin/chromium, or one on PATH."""
    for exe in (os.environ.get("MGPU_CHROMIUM"), "/usr/bin/chromium",
                shutil.which("chromium"), shutil.which("chromium-browser")):
        if exe and os.access(exe, os.X_OK):
            return exe
    return None


@contextlib.contextmanager
def browser() -> Iterator:
    """Headless Chromium through Playwright; raises BrowserMissing when either is absent."""
    exe = chromium_path()
    if exe is None:
        raise BrowserMissing("no chromium (apt-get install chromium, or set MGPU_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BrowserMissing("no Playwright (pip install playwright)") from None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(b, page: Path, width: int):
    """A tab at `width` CSS px (a phone below 800) with `page` loaded and laid out."""
    tab = b.new_page(viewport={"width": width, "height": 900}, device_scale_factor=1,
                     is_mobile=width < 800, has_touch=width < 800)
    tab.goto(page.resolve().as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
    tab.evaluate("document.fonts.ready")
    return tab


# One pass over a loaded page; returns [rule, where, detail] triples and the headings.
MEASURE = r"""
(opts) => {
  const art = document.querySelector('article.bd-article') || document.body;
  const found = [];
  const px = v => parseFloat(v) || 0;
  const short = s => { s = (s || '').replace(/\s+/g, ' ').trim();
                       return s.length > 60 ? s.slice(0, 60) + '...' : s; };
  const where = el => { const sec = el.closest('section[id]');
                        return sec ? '#' + sec.id : 'top'; };
  const shown = el => el.getClientRects().length > 0 &&
                      getComputedStyle(el).visibility !== 'hidden';

  for (const img of art.querySelectorAll('img')) {
    if (!img.complete || !img.naturalWidth || !shown(img)) continue;
    const cs = getComputedStyle(img), w = px(cs.width), h = px(cs.height);
    if (w < 2 || h < 2) continue;
    const err = Math.abs((w / h) / (img.naturalWidth / img.naturalHeight) - 1);
    if (err > opts.tolerance)
      found.push(['distorted image', where(img),
        `${(img.getAttribute('src') || '').split('/').pop().slice(0, 16)}`
        + ` shown ${Math.round(w)}x${Math.round(h)}`
        + `, file ${img.naturalWidth}x${img.naturalHeight}`
        + `, aspect error ${err.toFixed(2)}`]);
  }

  if (opts.columns) {
    const cs = getComputedStyle(art), box = art.getBoundingClientRect();
    const col = box.width - px(cs.paddingLeft) - px(cs.paddingRight)
                - px(cs.borderLeftWidth) - px(cs.borderRightWidth);
    const wide = art.querySelectorAll('table, div.cell_output, div.output, div.cell_output pre, '
                                      + 'div.output pre, .pst-scrollable-table-container');
    const seen = new Set();
    for (const el of wide) {
      if (!shown(el)) continue;
      const w = el.getBoundingClientRect().width, scroll = el.scrollWidth - el.clientWidth;
      const what = el.tagName === 'TABLE' || el.classList.contains('pst-scrollable-table-container')
                   ? 'table' : el.tagName === 'PRE' ? 'output block' : 'output';
      const text = short(el.innerText).slice(0, 40);
      if (w > col + 1) found.push(['wider than the column', where(el),
        `${what} ${Math.round(w)} px in a ${Math.round(col)} px column: '${text}'`]);
      else if (scroll > 1 && !seen.has(text)) {
        seen.add(text);
        found.push(['wider than the column', where(el),
                    `${what} scrolls sideways by ${scroll} px: '${text}'`]);
      }
    }
  }

  const walker = document.createTreeWalker(art, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || !shown(el)) continue;
    const output = el.closest('div.cell_output, div.output');
    // Python's nan anywhere; NaN too in cell outputs (prose may name NaN as a concept)
    if (!(output ? /\bnan\b/i : /\bnan\b/).test(n.data)) continue;
    if (!output && el.closest('div.cell_input, script, style, code, div.highlight')) continue;
    found.push(['visible nan', where(el), `'${short(el.innerText || n.data)}'`]);
  }

  for (const cell of art.querySelectorAll('div.cell')) {
    const pre = cell.querySelector('div.cell_input pre');
    if (!pre) continue;
    const lines = pre.innerText.split('\n').map(s => s.trim())
                     .filter(s => s && !s.startsWith('#'));
    const last = lines.length ? lines[lines.length - 1] : '';
    if (!/^[A-Za-z_][\w.]*$/.test(last)) continue;
    if (/^(pass|break|continue|return|None)$/.test(last)) continue;
    const out = cell.querySelector('div.cell_output');
    const visible = out && shown(out) && (out.innerText.trim() ||
        [...out.querySelectorAll('img, svg, canvas, iframe, video, table')].some(shown));
    if (!visible) found.push(['bare name renders nothing', where(cell), `'${last}'`]);
  }

  const headings = [];
  for (const h of art.querySelectorAll('h1, h2, h3, h4')) {
    const num = h.querySelector('span.section-number');
    const text = h.innerText.replace(/#$/, '').trim();
    const rest = num ? text.slice(num.innerText.length).trim() : text;
    headings.push([num ? num.innerText.trim() : '', short(rest)]);
    if (num && new RegExp(opts.twice).test(rest + ' '))
      found.push(['heading numbered twice', where(h), `'${short(text)}'`]);
  }
  return {found, headings};
}
"""


def measure(tab, width: int) -> dict:
    """Run MEASURE on a loaded tab; widths of tables and outputs are checked at 1280 only."""
    return tab.evaluate(MEASURE, {"tolerance": ASPECT_TOLERANCE, "columns": width >= 1280,
                                  "twice": TWICE.pattern})


def repeated_numbers(headings: dict[str, list]) -> list[str]:
    """Section numbers that two headings of the book carry: {page: [[number, text], ...]}."""
    owner: dict[str, str] = {}
    problems = []
    for page, items in headings.items():
        for number, text in items:
            if not number:
                continue
            if number in owner:
                problems.append(f"{page} @1280: heading number repeated: '{number} {text}' "
                                f"(also {owner[number]})")
            else:
                owner[number] = f"{page}: '{number} {text}'"
    return problems


def check_pages(b, build_root: Path, pages: list[Path]) -> list[str]:
    """Every problem on `pages` (HTML files under build_root), at every width."""
    problems, headings = [], {}
    for page in pages:
        name = page.relative_to(build_root).as_posix()
        for width in WIDTHS:
            tab = open_page(b, page, width)
            try:
                result = measure(tab, width)
            finally:
                tab.close()
            problems += [f"{name} @{width}: {rule}: {at}: {detail}"
                         for rule, at, detail in result["found"]]
            headings.setdefault(name, result["headings"])
    return problems + repeated_numbers(headings)


def check_build(build_root: Path) -> list[str]:
    """Every problem on every page of the table of contents (raises BrowserMissing)."""
    build_root = Path(build_root)
    pages = [p for p in toc_pages(build_root) if p.is_file()]
    if not pages:
        return [f"{build_root}: no pages (no _sources/ in the build)"]
    with browser() as b:
        return check_pages(b, build_root, pages)


def main(argv: list[str]) -> int:
    """Print the layout problems of the build named on the command line (default _build/html)."""
    default = Path(__file__).resolve().parent.parent / "_build" / "html"
    root = Path(argv[1]) if len(argv) > 1 else default
    if not root.is_dir():
        print(f"check_layout: no build at {root}; run `make book` first")
        return 2
    try:
        problems = check_build(root)
    except BrowserMissing as e:
        print(f"check_layout: {e}")
        return 2
    print("\n".join(problems) if problems else f"check_layout: {root}: no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
