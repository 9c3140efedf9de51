r"""Check the built book's layout in a real browser, at desktop (1280 px) and phone (400 px) width.

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
  number of its own after Sphinx's, or a section number that two headings carry;
- ``page scrolls sideways``: the page is wider than the window (the reader pans the whole page);
- ``display math cut``: a display equation wider than its box that is clipped, or that scrolls
  with nothing showing that it does (no scroll shadow: _static/custom.css draws one);
- ``raw TeX``: TeX source a reader sees outside code (``\(``, ``\[``, ``$$``, ``\begin{``),
  i.e. math that MathJax did not typeset;
- ``path as alt text``: an ``img`` whose alt text is a file path (Sphinx's default: one word
  with a slash, or a name ending in .png, .svg, .jpg ...), which a screen reader reads out;
- ``figure not linked``: a figure's image not inside a link to its file (the reader's way to
  see it at full size, and to zoom it on a phone);
- ``sidebar toggle does nothing`` / ``contents toggle does nothing``: below the theme's
  breakpoint (992 px: at 400 and at 900, where only this is checked) clicking the visible
  toggle must show the chapter list (or the page's contents) with a link that can be clicked;
  at 1280 the sidebar toggle must hide the sidebar and show it again;
- ``drawer stays open after a tap``: below 992 px, a tap on a link of this page in the opened
  chapter list (or contents) must close the drawer (_static/sidebar-toggles.js);
- ``table scrolls unseen`` (phone widths): a table wider than its box that scrolls with
  nothing showing that it does (no fade or shadow: _static/scroll-cues.js and custom.css);
- ``no focus ring``: the article header's ☰ toggle, Launch, Source and Download buttons, each
  focused from the keyboard in light and in dark mode, must show an outline of at least 2 px
  with 3:1 contrast against what is behind it (WCAG 2.2's focus appearance);
- ``explorer text low contrast``: a label or line of text of an explorer
  (mgpu_lib/book/explore.py) under 4.5:1 against its background, in light or dark mode;
- ``MathJax without math``: a page that loads MathJax (1.2 MB and its fonts) and has no math;
- ``too long on a phone``: a page taller than MAX_SCREENS phone screens (400 x 800 px, every
  dropdown and hidden cell closed as a reader first sees it);
- ``console error``: an error in the console or an uncaught exception;
- ``request to another host`` / ``failed request``: every request to a host other than
  file:, data:, blob: and localhost is blocked and reported (the book must work offline, as
  opened from _build/html), and any local request that fails is reported.

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
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_book import toc_pages  # noqa: E402  (tools/ is not a package)

WIDTHS = (1280, 400)
# A tablet, a narrow window: there only the sidebar toggles are clicked, on the first page and
# on the pages with scripts of their own (the explorers'): the toggles are the theme's, the same
# on every page, and a page's script error is caught at every width (`logged`).
TOGGLE_WIDTHS = (900,)
ASPECT_TOLERANCE = 0.05
PHONE = (400, 800)    # a phone's window, in CSS px: the unit of "phone screens"
MAX_SCREENS = 15      # issue 49: a page at most 15 phone screens (d2l's own page: about 5)
NAV_BREAKPOINT = 992  # below it pydata-sphinx-theme moves both sidebars behind their toggles
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
LOCAL_HOSTS = {"localhost", "127.0.0.1", "[::1]"}
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


def is_local(url: str) -> bool:
    """A URL the built book may load: a file of the build, data:, blob:, or localhost."""
    if url.startswith(LOCAL_SCHEMES):
        return True
    try:
        host = urlsplit(url).netloc.rsplit("@", 1)[-1]
    except ValueError:
        return False
    return (host if host.startswith("[") else host.split(":")[0]) in LOCAL_HOSTS


# Resolves once MathJax has typeset the page (at once where MathJax did not load).
MATHJAX_DONE = """() => {
  const mj = window.MathJax;
  return mj && mj.startup && mj.startup.promise ? mj.startup.promise.then(() => true) : false;
}"""


def open_page(b, page: Path, width: int, log: dict | None = None):
    """A tab at `width` CSS px (a phone below 800) with `page` loaded, typeset and laid out.

    Every request to another host is blocked (the book must work offline). Given `log`, it
    collects {"errors": console errors and uncaught exceptions, "blocked": URLs of requests to
    other hosts, "failed": [url, reason] of local requests that failed}.
    """
    log = {} if log is None else log
    for key in ("errors", "blocked", "failed"):
        log.setdefault(key, [])
    tab = b.new_page(viewport={"width": width, "height": 900}, device_scale_factor=1,
                     is_mobile=width < 800, has_touch=width < 800)

    def route(r):
        if is_local(r.request.url):
            r.continue_()
        else:
            log["blocked"].append(r.request.url)
            r.abort("blockedbyclient")

    def console(msg):
        # a failed load is reported with its URL (blocked or failed), not as its console line
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            log["errors"].append(msg.text)

    def failed(req):
        if is_local(req.url):
            log["failed"].append([req.url, req.failure or "failed"])

    def response(resp):
        if resp.status >= 400:
            log["failed"].append([resp.url, f"HTTP {resp.status}"])

    tab.route("**/*", route)
    tab.on("console", console)
    tab.on("pageerror", lambda err: log["errors"].append(f"uncaught {err}"))
    tab.on("requestfailed", failed)
    tab.on("response", response)
    tab.goto(page.resolve().as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
    tab.evaluate("document.fonts.ready")
    tab.evaluate(MATHJAX_DONE)
    tab.evaluate("document.fonts.ready")  # MathJax's own fonts
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

  // the page wider than the window: the reader pans the whole page sideways
  const pageWidth = document.documentElement.scrollWidth;
  if (pageWidth > opts.width + 1) {
    const clipped = el => { for (let a = el.parentElement; a && a !== document.body;
                                 a = a.parentElement)
                              if (getComputedStyle(a).overflowX !== 'visible') return true;
                            return false; };
    let widest = null, right = opts.width;
    for (const el of document.body.querySelectorAll('*')) {
      // the innermost element that sticks out of the window, not inside a box that scrolls
      if (!shown(el) || el.children.length || clipped(el)) continue;
      const r = el.getBoundingClientRect().right + window.scrollX;
      if (r > right + 1) { right = r; widest = el; }
    }
    found.push(['page scrolls sideways', widest ? where(widest) : 'top',
      `the page is ${pageWidth} px wide in a ${opts.width} px window`
      + (widest ? `: <${widest.tagName.toLowerCase()}> '${short(widest.innerText || '')
                     .slice(0, 50)}' ends at ${Math.round(right)} px` : '')]);
  }

  // display math wider than its box: clipped, or scrolling with no sign of it
  for (const el of art.querySelectorAll('mjx-container[display="true"], div.math')) {
    if (!shown(el)) continue;
    const over = el.scrollWidth - el.clientWidth;
    if (over <= 1) continue;
    const cs = getComputedStyle(el);
    const scrolls = /auto|scroll/.test(cs.overflowX);
    if (scrolls && /gradient/.test(cs.backgroundImage)) continue;
    found.push(['display math cut', where(el), `'${short(el.textContent).slice(0, 40)}' is `
      + `${over} px wider than its ${el.clientWidth} px box`
      + (scrolls ? ', which scrolls with nothing showing that it does' : ' and is clipped')]);
  }

  // a table that scrolls in its box on a phone with nothing showing that it does
  if (!opts.columns) {
    const boxes = new Set();
    for (const t of art.querySelectorAll('table')) {
      let box = t.parentElement;
      while (box && box !== art && !/auto|scroll/.test(getComputedStyle(box).overflowX))
        box = box.parentElement;
      if (box && box !== art && shown(t)) boxes.add(box);
    }
    for (const box of boxes) {
      const over = box.scrollWidth - box.clientWidth;
      if (over <= 2) continue;
      const cs = getComputedStyle(box);
      const cue = [cs.maskImage, cs.webkitMaskImage, cs.backgroundImage]
        .some(v => /gradient/.test(v || ''));
      if (!cue) found.push(['table scrolls unseen', where(box),
        `'${short(box.innerText).slice(0, 40)}' is ${over} px wider than its `
        + `${box.clientWidth} px box, with no fade or shadow at the edge`]);
    }
  }

  // MathJax loaded by a page with no math to typeset
  const mathjax = [...document.scripts].some(s => /mathjax/i.test(s.getAttribute('src') || '')
                                                 || /window\.MathJax\s*=/.test(s.text));
  if (mathjax && !document.querySelector('.math, mjx-container, span.math, div.math'))
    found.push(['MathJax without math', 'top', 'the page loads MathJax and has no math']);

  // TeX source that MathJax did not typeset (code may show TeX as code)
  const tex = /\\\(|\\\[|\$\$|\\begin\{/;
  const texWalker = document.createTreeWalker(art, NodeFilter.SHOW_TEXT);
  for (let n = texWalker.nextNode(); n; n = texWalker.nextNode()) {
    if (!tex.test(n.data)) continue;
    const el = n.parentElement;
    if (!el || !shown(el)) continue;
    if (el.closest('code, pre, kbd, samp, script, style, textarea, div.highlight, '
                   + 'div.cell_input, mjx-container')) continue;
    const at = n.data.search(tex);
    found.push(['raw TeX', where(el), `'${short(n.data.slice(Math.max(0, at - 10)))}'`]);
  }

  // alt text that is a path, which a screen reader reads out; figures open at full size
  const file = s => (s || '').split(/[?#]/)[0];
  for (const img of document.querySelectorAll('img')) {
    const alt = (img.getAttribute('alt') || '').trim();
    if (/^\S*\/\S*$/.test(alt) || /\.(png|svg|jpe?g|gif|webp)$/i.test(alt))
      found.push(['path as alt text', where(img), `'${alt.length > 50 ? '...' + alt.slice(-47)
                                                                       : alt}'`]);
  }
  for (const img of art.querySelectorAll('figure img, div.figure img')) {
    const a = img.closest('a[href]');
    if (!a || file(a.href) !== file(img.src))
      found.push(['figure not linked', where(img),
                  `${file(img.getAttribute('src')).split('/').pop().slice(0, 16)}: `
                  + (a ? `links to ${file(a.getAttribute('href'))}` : 'no link to its file')]);
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
                                  "twice": TWICE.pattern, "width": width})


# Where a sidebar's navigation is: in the theme's <dialog> once a toggle moved it there (narrow
# windows), else in the sidebar itself. Returns the text of the first link of its <nav> (the
# chapter list, the page's contents) that a click would reach, or null.
REACHABLE_LINK = """(ids) => {
  for (const id of ids) {
    const box = document.getElementById(id);
    if (!box) continue;
    for (const a of box.querySelectorAll('nav a[href]')) {
      const r = a.getBoundingClientRect();
      if (r.width < 2 || r.height < 2) continue;
      const x = r.left + Math.min(r.width / 2, 20), y = r.top + r.height / 2;
      if (x < 0 || y < 0 || x >= window.innerWidth || y >= window.innerHeight) continue;
      const hit = document.elementFromPoint(x, y);
      if (hit && (hit === a || a.contains(hit))) return a.innerText.trim() || a.href;
    }
  }
  return null;
}"""
CLOSE_DIALOGS = "() => { for (const d of document.querySelectorAll('dialog[open]')) d.close(); }"
# Where to tap a link of this page (href "#..."), reachable in the opened drawer: [x, y, href].
IN_PAGE_LINK = """(id) => {
  const box = document.getElementById(id);
  if (!box || !box.open) return null;
  for (const a of box.querySelectorAll('a[href^="#"]')) {
    const r = a.getBoundingClientRect();
    if (r.width < 2 || r.height < 2) continue;
    const x = r.left + Math.min(r.width / 2, 20), y = r.top + r.height / 2;
    if (x < 0 || y < 0 || x >= window.innerWidth || y >= window.innerHeight) continue;
    const hit = document.elementFromPoint(x, y);
    if (hit && (hit === a || a.contains(hit))) return [x, y, a.getAttribute('href')];
  }
  return null;
}"""
SIDEBARS = {"primary": ["pst-primary-sidebar-modal", "pst-primary-sidebar"],
            "secondary": ["pst-secondary-sidebar-modal", "pst-secondary-sidebar"]}
TOGGLE_NAMES = {"primary": "sidebar toggle", "secondary": "contents toggle"}


def screens(tab) -> float:
    """How many phone screens the loaded page is tall (call it on a tab at PHONE's width)."""
    return tab.evaluate("document.documentElement.scrollHeight") / PHONE[1]


def check_toggles(tab, width: int) -> list[list[str]]:
    """Click the visible sidebar toggles as a reader would: [rule, where, detail] for each that
    does nothing. Pages without the theme's sidebar (planted test pages) have nothing to check.
    """
    if not tab.evaluate("!!document.getElementById('pst-primary-sidebar')"):
        return []
    found = []
    kinds = ("primary", "secondary") if width < NAV_BREAKPOINT else ("primary",)
    for kind in kinds:
        rule = f"{TOGGLE_NAMES[kind]} does nothing"
        button = tab.locator(f".{kind}-toggle:visible").first
        if not button.count():
            if kind == "primary":
                found.append([rule, "top", "no visible .primary-toggle button"])
            continue  # a page without sections has no contents toggle
        tab.evaluate(CLOSE_DIALOGS)
        before = tab.evaluate(REACHABLE_LINK, SIDEBARS[kind])
        button.click(timeout=5_000)
        tab.wait_for_timeout(400)  # the theme's transitions take 0.25 s
        after = tab.evaluate(REACHABLE_LINK, SIDEBARS[kind])
        if width < NAV_BREAKPOINT and after is None:
            found.append([rule, "top", f"at {width} px clicking it shows no link that can be "
                                       "clicked"])
        elif width < NAV_BREAKPOINT:
            found += tap_drawer_link(tab, kind, width)
        elif width >= NAV_BREAKPOINT and (before is None or after is not None):
            found.append([rule, "top", f"at {width} px clicking it does not hide the sidebar"
                          if before else f"at {width} px the sidebar shows no link to click"])
        elif width >= NAV_BREAKPOINT:
            button.click(timeout=5_000)
            tab.wait_for_timeout(400)
            if tab.evaluate(REACHABLE_LINK, SIDEBARS[kind]) is None:
                found.append([rule, "top", f"at {width} px a second click does not show the "
                                           "sidebar again"])
        tab.evaluate(CLOSE_DIALOGS)
    return found


def tap_drawer_link(tab, kind: str, width: int) -> list[list[str]]:
    """Tap a link of this page in the opened drawer, as a reader picks a section: the drawer
    must close ([rule, where, detail] if it stays open)."""
    dialog = SIDEBARS[kind][0]
    spot = tab.evaluate(IN_PAGE_LINK, dialog)
    if spot is None:
        return []  # no link of this page in view in the drawer: nothing to tap here
    x, y, href = spot
    if width < 800:
        tab.touchscreen.tap(x, y)
    else:
        tab.mouse.click(x, y)
    tab.wait_for_timeout(400)
    if tab.evaluate(f"!!(document.getElementById('{dialog}') || {{}}).open"):
        return [["drawer stays open after a tap", "top",
                 f"at {width} px the {TOGGLE_NAMES[kind].split()[0]} drawer is still open after "
                 f"a tap on its link '{href}'"]]
    return []


# Colours: a colour's WCAG contrast against what lies behind an element (the first opaque
# background among it and its ancestors, semi-transparent ones blended in), in light and dark.
COLOURS = r"""
(opts) => {
  const rgba = c => { const m = (c || '').match(/[\d.]+/g) || [0, 0, 0, 0];
                      return [+m[0], +m[1], +m[2], m.length > 3 ? +m[3] : 1]; };
  const over = (top, below) => [0, 1, 2].map(i => top[i] * top[3] + below[i] * (1 - top[3]))
                                         .concat([1]);
  const behind = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let colour = [255, 255, 255, 1];
    for (const c of layers.reverse()) colour = over(c, colour);
    return colour;
  };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92
                                                  : Math.pow((v + 0.055) / 1.055, 2.4); };
                     return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); };
  const contrast = (fg, bg) => { const c = over(fg, bg), a = lum(c), b = lum(bg);
                                 return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); };
  const shown = el => el.getClientRects().length > 0 &&
                      getComputedStyle(el).visibility !== 'hidden';
  const found = [];
  const text = el => (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 30);

  if (opts.part === 'explorers') {
    const seen = new Set();
    for (const el of document.querySelectorAll(opts.explorerText)) {
      if (!shown(el) || !text(el)) continue;
      const c = contrast(rgba(getComputedStyle(el).color), behind(el));
      const key = text(el).slice(0, 12);
      if (c < opts.minText && !seen.has(key)) {
        seen.add(key);
        found.push(['explorer text low contrast', 'explorer',
                    `${opts.mode} mode: '${text(el)}' at ${c.toFixed(2)}:1 (at least `
                    + `${opts.minText}:1)`]);
      }
    }
    return found;
  }
  // one focused button (document.activeElement): its outline against what is behind it
  const el = document.activeElement, cs = getComputedStyle(el);
  const width = parseFloat(cs.outlineWidth) || 0;
  if (!el.matches(':focus-visible') || cs.outlineStyle === 'none' || width < 2)
    return [['no focus ring', 'header', `${opts.mode} mode: ${opts.name} focused from the `
             + `keyboard shows no outline of 2 px or more`]];
  const c = contrast(rgba(cs.outlineColor), behind(el.parentElement || el));
  if (c < opts.minRing)
    found.push(['no focus ring', 'header', `${opts.mode} mode: ${opts.name}'s outline at `
                + `${c.toFixed(2)}:1 against its background (at least ${opts.minRing}:1)`]);
  return found;
}"""
HEADER_BUTTONS = {"the ☰ toggle": ".bd-header-article .primary-toggle",
                  "Launch": ".bd-header-article .dropdown-launch-buttons > .dropdown-toggle",
                  "Source": ".bd-header-article .btn-source-repository-button",
                  "Download": ".bd-header-article .dropdown-download-buttons > .dropdown-toggle"}
EXPLORER_TEXT = (".mgpu-explorer .mgpu-title, .mgpu-explorer legend, .mgpu-explorer "
                 ".mgpu-field > span, .mgpu-explorer fieldset label, .mgpu-explorer select, "
                 ".mgpu-explorer .mgpu-panel p, .mgpu-explorer .mgpu-legend li")
MIN_TEXT, MIN_RING = 4.5, 3.0   # WCAG AA for text; for a focus indicator and other UI parts
MODES = ("light", "dark")


def check_colours(tab) -> list[list[str]]:
    """The header buttons' focus rings and the explorers' text, in light and dark mode (the
    theme's `data-theme` on <html>, as its switch sets it); the page's mode is put back."""
    found = []
    before = tab.evaluate("document.documentElement.dataset.theme || ''")
    has_explorer = tab.evaluate("!!document.querySelector('.mgpu-explorer')")
    try:
        for mode in MODES:
            tab.evaluate(f"document.documentElement.dataset.theme = '{mode}'")
            opts = {"mode": mode, "minText": MIN_TEXT, "minRing": MIN_RING,
                    "explorerText": EXPLORER_TEXT}
            if has_explorer:
                found += tab.evaluate(COLOURS, {**opts, "part": "explorers"})
            for name, selector in HEADER_BUTTONS.items():
                button = tab.locator(f"{selector}:visible").first
                if not button.count():
                    continue
                button.focus()  # then away and back with the keyboard, as a reader tabs
                tab.keyboard.press("Shift+Tab")
                tab.keyboard.press("Tab")
                if not button.evaluate("b => b === document.activeElement"):
                    button.focus()
                found += tab.evaluate(COLOURS, {**opts, "part": "focus", "name": name})
                tab.evaluate("document.activeElement && document.activeElement.blur()")
    finally:
        tab.evaluate("(m) => { if (m) document.documentElement.dataset.theme = m; "
                     "else delete document.documentElement.dataset.theme; }", before)
    return found


def logged(log: dict) -> list[list[str]]:
    """A page's console errors, blocked and failed requests: [rule, where, detail]."""
    found = [["console error", "console", " ".join(e.split())[:160]]
             for e in dict.fromkeys(log["errors"])]
    found += [["request to another host", "network", url[:120]]
              for url in dict.fromkeys(log["blocked"])]
    found += [["failed request", "network", f"{url[:120]} ({why})"]
              for url, why in dict.fromkeys(tuple(f) for f in log["failed"])]
    return found


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
        name, scripted = page.relative_to(build_root).as_posix(), False
        for width in WIDTHS:
            log: dict = {}
            tab = open_page(b, page, width, log)
            try:
                result = measure(tab, width)
                found = result["found"]
                if width == PHONE[0] and (tall := screens(tab)) > MAX_SCREENS:
                    found.append(["too long on a phone", "page",
                                  f"{tall:.1f} screens of {PHONE[1]} px (at most {MAX_SCREENS})"])
                found += check_colours(tab)
                found += check_toggles(tab, width)
                scripted = scripted or tab.evaluate("!!document.querySelector('.mgpu-explorer')")
            finally:
                tab.close()
            problems += [f"{name} @{width}: {rule}: {at}: {detail}"
                         for rule, at, detail in found + logged(log)]
            headings.setdefault(name, result["headings"])
        if page != pages[0] and not scripted:
            continue
        for width in TOGGLE_WIDTHS:
            tab = open_page(b, page, width)
            try:
                found = check_toggles(tab, width)
            finally:
                tab.close()
            problems += [f"{name} @{width}: {rule}: {at}: {detail}" for rule, at, detail in found]
    return problems + repeated_numbers(headings)


def check_build(build_root: Path) -> list[str]:
    """Every problem on every page of the table of contents (raises BrowserMissing)."""
    build_root = Path(build_root)
    pages = [p for p in toc_pages(build_root) if p.is_file()]
    if not pages:
        return [f"{build_root}: no pages (no _sources/ in the build)"]
    with browser() as b:
        return check_pages(b, build_root, pages)


# The explorers (mgpu_lib/book/explore.py): what a view shows, and a reader's keys on a control.
EXPLORER_SHOWS = """(name) => {
  const view = document.querySelector(`.mgpu-explorer[data-explorer="${name}"]`);
  if (!view) return null;
  const shown = {};
  for (const el of view.querySelectorAll('[data-k]')) shown[el.dataset.k] = el.textContent;
  return shown;
}"""


def explorer_shows(tab, explorer: str) -> dict | None:
    """{data-k: text} of the explorer's view on the page (None where the page has none)."""
    return tab.evaluate(EXPLORER_SHOWS, explorer)


def press(tab, explorer: str, control: str, *keys: str) -> dict | None:
    """Focus the explorer's control named `control` and press `keys` as a reader would (End,
    ArrowRight ...); returns what the view shows then."""
    tab.locator(f'.mgpu-explorer[data-explorer="{explorer}"] [name="{control}"]').first.focus()
    for key in keys:
        tab.keyboard.press(key)
    return explorer_shows(tab, explorer)


def page_screens(build_root: Path) -> dict[str, float]:
    """{page: phone screens} for every chapter and exercise page of a build."""
    build_root = Path(build_root)
    out = {}
    with browser() as b:
        for page in sorted(build_root.glob("chapters/*.html")) + sorted(
                build_root.glob("exercises/*.html")):
            tab = open_page(b, page, PHONE[0])
            try:
                out[page.relative_to(build_root).as_posix()] = round(screens(tab), 1)
            finally:
                tab.close()
    return out


def main(argv: list[str]) -> int:
    """Print the layout problems of the build named on the command line (default _build/html);
    with --screens, each page's height in phone screens instead."""
    only_screens = "--screens" in argv
    argv = [a for a in argv if a != "--screens"]
    default = Path(__file__).resolve().parent.parent / "_build" / "html"
    root = Path(argv[1]) if len(argv) > 1 else default
    if not root.is_dir():
        print(f"check_layout: no build at {root}; run `make book` first")
        return 2
    try:
        if only_screens:
            for page, n in page_screens(root).items():
                print(f"{page}: {n} phone screens")
            return 0
        problems = check_build(root)
    except BrowserMissing as e:
        print(f"check_layout: {e}")
        return 2
    print("\n".join(problems) if problems else f"check_layout: {root}: no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
