"""Check the built book as a reader gets it: every page of the table of contents, in the HTML.

    make book && .venv/bin/python tools/check_book.py [_build/html]

Prints one line per problem, ``PAGE:LINE: what: 'offending text'`` (LINE is the line in the
HTML file), and exits 1 if there are any, 0 if none, 2 if the build folder is missing.

One function per rule, each ``(soup, page, build_root) -> list[str]``:

- ``harness_text``: no test-harness marker (``NBVAL``) anywhere in the page's content;
- ``wide_output_lines``: no cell-output line wider than MAX_COLUMNS characters;
- ``wide_code_lines``: no code line wider than MAX_COLUMNS, in code cells and in Markdown
  code blocks alike (the reader scrolls sideways in both);
- ``missing_images``: every ``<img>`` src is a file in the build, or a data: URI;
- ``widget_reprs``: no widget text repr (``interactive(children=...``) in a cell output;
- ``launch_button``: every notebook page has a Colab or Binder link that opens that notebook;
- ``broken_links``: every internal href names a file in the build and its #fragment an id there;
- ``unnumbered_figures``: every ``<figure>`` / ``div.figure`` has a caption numbered "Fig. N".
  Plot images that a cell outputs without a figure directive are not figures; only their
  files are checked (by ``missing_images``);
- ``long_short_answer``: a page's "In short" box (the answer a learner reads first) holds at
  most SHORT_ANSWER_WORDS words and SHORT_ANSWER_NUMBERS numbers, glued ones included;
- ``hard_prose`` (chapter and exercise pages): the prose a reader sees without clicking (not
  code, outputs, tables, captions or dropdowns) has no sentence over LONGEST_SENTENCE words, a
  mean sentence of at most MEAN_SENTENCE words, and none of the statistics apparatus (``±``,
  Holm, ``r =``, "could call", standard error, Welch, "t cut") outside the page that teaches it;
- ``too_many_words`` (the whole build): visible words at most MAIN_PATH_WORDS on the main path
  (01-05, the exercises), GOING_FURTHER_WORDS on each going-further page (06-09), BOOK_WORDS in all;
- ``unnumbered_tables``: every table a cell outputs (``mgpu_lib.book.tables.Table``) has a caption
  numbered "Table N" (the book's ``_ext/numbering.py`` makes one from the Table's caption).

Pages are those of the table of contents: the ones Sphinx copied a source for into
``_sources/`` (so not genindex, search, or the index.html redirect).
"""
from __future__ import annotations

import functools
import posixpath
import re
import sys
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote, urlsplit

from bs4 import BeautifulSoup, Comment, Tag

MAX_COLUMNS = 88
SHOWN = 60  # characters of offending text quoted in a problem
HARNESS = re.compile(r"NBVAL")
WIDGET_REPR = re.compile(r"\b\w+\(children=\(|_dom_classes=\(")
LAUNCH_HOSTS = ("https://colab.research.google.com/", "https://mybinder.org/")
FIG_NUMBER = re.compile(r"^\s*(Fig(ure)?\.?)\s*(E\d+\.)?\d")  # E1.3: the exercises' own
TABLE_NUMBER = re.compile(r"^\s*Table\s*(E\d+\.)?\d")
OUTPUTS = "div.cell_output, .output"
# Issue 49, "the lesson in an hour": ceilings on what a reader sees without clicking
SHORT_ANSWER_WORDS, SHORT_ANSWER_NUMBERS = 70, 3
LONGEST_SENTENCE, MEAN_SENTENCE, MIN_SENTENCES = 40, 20, 5   # a mean over fewer says little
MAIN_PATH_WORDS, GOING_FURTHER_WORDS, BOOK_WORDS = 5000, 1200, 10000
GOING_FURTHER = ("chapters/06_", "chapters/07_", "chapters/08_", "chapters/09_")
TEACHES_THE_RULE = "chapters/09_"
HIDDEN = ("div.cell_output, div.cell_input, pre, table, figcaption, details, script, style, "
          ".dropdown, .toggle-hidden, span.caption-text")
SENTENCE_END = re.compile(r"(?<=[.!?])[\"”')\]]*\s+(?=[A-Z0-9(“\"'`])")
NUMBER = re.compile(r"(?<![\w\[])[-−+]?\d[\d,]*(?:\.\d+)?\s*(?:%|x|×)?")
APPARATUS = re.compile(r"±|\bHolm\b|\br\s*=\s*[-−+]?\d|could call|standard errors?\b|\bWelch|t cut",
                       re.I)

Rule = Callable[[BeautifulSoup, str, Path], "list[str]"]


def _quote(text: str) -> str:
    """The offending text, stripped and truncated for a one-line message."""
    text = text.strip()
    return repr(text if len(text) <= SHOWN else text[:SHOWN] + "...")


def _content(soup: BeautifulSoup) -> Tag:
    """The page's article (what the reader reads), without the theme's navigation."""
    return soup.select_one("article.bd-article") or soup


def _pre_lines(pre: Tag) -> Iterator[tuple[int, str]]:
    """(HTML line number, text) for each line of a <pre> block."""
    start = pre.sourceline or 0
    for i, line in enumerate(pre.get_text().splitlines()):
        yield start + i, line.expandtabs().rstrip()


def _outputs(soup: BeautifulSoup) -> list[Tag]:
    """The outermost cell-output elements of the page."""
    found = _content(soup).select(OUTPUTS)
    ids = {id(t) for t in found}
    return [t for t in found if not any(id(p) in ids for p in t.parents)]


def _text_lines(scope: Tag) -> Iterator[tuple[int, str]]:
    """(HTML line, text) for every line a reader sees in scope: <pre> lines, then other text."""
    for pre in scope.find_all("pre"):
        yield from _pre_lines(pre)
    for s in scope.find_all(string=True):
        if not isinstance(s, Comment) and s.strip() and s.find_parent("pre") is None:
            if s.parent.name not in ("script", "style"):
                yield s.parent.sourceline or 0, str(s)


def harness_text(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Test-harness markers (``# NBVAL_IGNORE_OUTPUT``) that reach the reader."""
    return [f"{page}:{n}: harness text: {_quote(line)}"
            for n, line in _text_lines(_content(soup)) if HARNESS.search(line)]


RAW_DIRECTIVE = re.compile(r"(```|:::)\{[\w-]+\}")


def raw_directives(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """A MyST directive that did not parse and reaches the reader as its source text (a fence
    whose title holds backticks, say)."""
    return [f"{page}:{n}: directive shown as text: {_quote(line)}"
            for n, line in _text_lines(_content(soup)) if RAW_DIRECTIVE.search(line)]


def wide_output_lines(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Cell-output lines (stream, text/plain, stderr) wider than the column."""
    return [f"{page}:{n}: output line {len(line)} chars: {_quote(line)}"
            for out in _outputs(soup) for pre in out.find_all("pre")
            for n, line in _pre_lines(pre) if len(line) > MAX_COLUMNS]


def wide_code_lines(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Code lines wider than the column: code-cell sources and Markdown code blocks."""
    problems = []
    outputs = {id(t) for t in _outputs(soup)}
    for pre in _content(soup).find_all("pre"):
        if any(id(p) in outputs for p in pre.parents):
            continue
        kind = "code-cell line" if pre.find_parent(class_="cell_input") else "code-block line"
        problems += [f"{page}:{n}: {kind} {len(line)} chars: {_quote(line)}"
                     for n, line in _pre_lines(pre) if len(line) > MAX_COLUMNS]
    return problems


def _resolve(page: str, path: str) -> str | None:
    """The build-relative path that a relative URL path on page names; None if outside."""
    target = posixpath.normpath(posixpath.join(posixpath.dirname(page), unquote(path)))
    if path.endswith("/"):
        target = posixpath.join(target, "index.html")
    return None if target.startswith("..") else target


def missing_images(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """<img> elements whose src is neither a data: URI, a remote URL, nor a file in the build."""
    problems = []
    for img in soup.find_all("img"):
        src = img.get("src", "")
        if src.startswith("data:") or urlsplit(src).scheme or src.startswith("//"):
            continue
        target = _resolve(page, urlsplit(src).path) if src else None
        if target is None or not (build_root / target).is_file():
            problems.append(f"{page}:{img.sourceline}: missing image: {_quote(src or str(img))}")
    return problems


def widget_reprs(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Widget text reprs in cell outputs: a widget whose live view could not be shown."""
    return [f"{page}:{n}: widget repr: {_quote(line)}"
            for out in _outputs(soup) for n, line in _text_lines(out) if WIDGET_REPR.search(line)]


def launch_button(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """A notebook page without a Colab/Binder launch link that names its own .ipynb."""
    notebook = posixpath.splitext(page)[0] + ".ipynb"
    if not (build_root / "_sources" / notebook).is_file():
        return []  # a Markdown page: nothing to launch
    links = [a["href"] for a in soup.find_all("a", href=True) if a["href"].startswith(LAUNCH_HOSTS)]
    if any(notebook in href for href in links):
        return []
    seen = f"; launch links: {_quote(' '.join(links))}" if links else ""
    return [f"{page}:1: no launch button (Colab/Binder) for {notebook}{seen}"]


@functools.lru_cache(maxsize=None)
def _ids(html_file: Path) -> frozenset[str]:
    """Every id (and <a name>) in an HTML file."""
    soup = BeautifulSoup(html_file.read_text(encoding="utf-8"), "html.parser")
    return frozenset([t["id"] for t in soup.find_all(id=True)]
                     + [t["name"] for t in soup.find_all("a", attrs={"name": True})])


def broken_links(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Internal links to a file that is not in the build, or to an id the target lacks."""
    problems = []
    for a in soup.find_all("a", href=True):
        url = urlsplit(a["href"])
        if url.scheme or url.netloc or a["href"] in ("", "#"):
            continue
        target = _resolve(page, url.path) if url.path else page
        where = f"{page}:{a.sourceline}: broken link {_quote(a['href'])}"
        if target is None or not (build_root / target).is_file():
            problems.append(f"{where}: no file {target}")
        elif url.fragment and target.endswith(".html") \
                and unquote(url.fragment) not in _ids((build_root / target).resolve()):
            problems.append(f"{where}: no id #{url.fragment} in {target}")
    return problems


def unnumbered_figures(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Figures (figure directive) without a numbered caption ("Fig. N")."""
    problems = []
    for fig in _content(soup).select("figure, div.figure"):
        caption = fig.select_one("figcaption, p.caption")
        number = caption.select_one("span.caption-number") if caption else None
        if number is None or not FIG_NUMBER.match(number.get_text()):
            img = fig.find("img")
            what = caption.get_text() if caption else (img.get("src", "") if img else str(fig))
            state = "an unnumbered caption" if caption else "no caption"
            problems.append(f"{page}:{fig.sourceline}: figure with {state}: {_quote(what)}")
    return problems


def unnumbered_tables(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Tables in cell outputs without a caption numbered "Table N"."""
    problems = []
    for table in _content(soup).select("div.cell_output table"):
        number = table.select_one("caption span.caption-number")
        if number is None or not TABLE_NUMBER.match(number.get_text()):
            head = " | ".join(th.get_text(strip=True) for th in table.select("th"))
            problems.append(f"{page}:{table.sourceline}: table without a numbered caption: "
                            f"{_quote(head)}")
    return problems


def _visible(soup: BeautifulSoup) -> list[Tag]:
    """The paragraphs and list items a reader sees without clicking (in the page as parsed, so
    each keeps its source line)."""
    content = _content(soup)
    hidden = {id(tag) for tag in content.select(HIDDEN)}
    return [el for el in content.find_all(["p", "li", "dd"])
            if not (el.name == "p" and el.find_parent("li"))
            and "admonition-title" not in (el.get("class") or [])
            and id(el) not in hidden and not any(id(a) in hidden for a in el.parents)]


def sentences(text: str) -> list[str]:
    """Sentences of at least 3 words (abbreviations such as "Fig." and "e.g." kept whole)."""
    text = re.sub(r"\b(e\.g|i\.e|etc|vs|cf|Fig|Eq|Sec|et al)\.", lambda m: m.group(0)[:-1], text)
    return [x for x in SENTENCE_END.split(text) if len(x.split()) >= 3]


def visible_words(soup: BeautifulSoup) -> int:
    """Words a reader sees without clicking (headings not counted)."""
    return sum(len(el.get_text(" ").split()) for el in _visible(soup))


def long_short_answer(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """An "In short" admonition over SHORT_ANSWER_WORDS words or SHORT_ANSWER_NUMBERS numbers
    (its title and code spans not counted)."""
    problems = []
    for box in _content(soup).select("div.admonition"):
        title = box.select_one(".admonition-title")
        if title is None or title.get_text(strip=True) != "In short":
            continue
        words = len(box.get_text().split()) - len(title.get_text().split())
        plain = BeautifulSoup(str(box), "html.parser")
        for tag in plain.select(".admonition-title, code"):
            tag.decompose()
        numbers = len(NUMBER.findall(" ".join(plain.get_text(" ").split())))
        if words > SHORT_ANSWER_WORDS or numbers > SHORT_ANSWER_NUMBERS:
            problems.append(f"{page}:{box.sourceline}: 'In short' box of {words} words and "
                            f"{numbers} numbers (at most {SHORT_ANSWER_WORDS} and "
                            f"{SHORT_ANSWER_NUMBERS}): {_quote(box.get_text(' '))}")
    return problems


def hard_prose(soup: BeautifulSoup, page: str, build_root: Path) -> list[str]:
    """Visible prose of a chapter or exercise page that reads as machinery (module docstring)."""
    if not page.startswith(("chapters/", "exercises/")):
        return []
    problems, lengths = [], []
    for el in _visible(soup):
        text = " ".join(el.get_text(" ").split())
        for sentence in sentences(text):
            lengths.append(len(sentence.split()))
            if lengths[-1] > LONGEST_SENTENCE:
                problems.append(f"{page}:{el.sourceline}: sentence of {lengths[-1]} words (at "
                                f"most {LONGEST_SENTENCE}): {_quote(sentence)}")
        if not page.startswith(TEACHES_THE_RULE):
            problems += [f"{page}:{el.sourceline}: statistics in visible prose ({m.group(0)!r}; "
                         f"put it in a table or a How-we-know dropdown): {_quote(text)}"
                         for m in APPARATUS.finditer(text)]
    if len(lengths) >= MIN_SENTENCES and sum(lengths) / len(lengths) > MEAN_SENTENCE:
        problems.append(f"{page}:1: sentences of {sum(lengths) / len(lengths):.1f} words on "
                        f"average (at most {MEAN_SENTENCE})")
    return problems


def too_many_words(build_root: Path, pages: list[Path]) -> list[str]:
    """The book's word ceilings (module docstring) over the chapter and exercise pages."""
    words = {}
    for p in pages:
        page = p.relative_to(build_root).as_posix()
        if page.startswith(("chapters/", "exercises/")):
            words[page] = visible_words(BeautifulSoup(p.read_text(encoding="utf-8"),
                                                      "html.parser"))
    main = sum(n for page, n in words.items() if not page.startswith(GOING_FURTHER))
    problems = [f"{page}:1: {n} visible words (at most {GOING_FURTHER_WORDS} on a going-further "
                f"page)" for page, n in words.items()
                if page.startswith(GOING_FURTHER) and n > GOING_FURTHER_WORDS]
    if main > MAIN_PATH_WORDS:
        problems.append(f"the main path: {main} visible words (at most {MAIN_PATH_WORDS})")
    if sum(words.values()) > BOOK_WORDS:
        problems.append(f"the book: {sum(words.values())} visible words (at most {BOOK_WORDS})")
    return problems


RULES: list[Rule] = [harness_text, raw_directives, wide_output_lines, wide_code_lines, missing_images,
                     widget_reprs, launch_button, broken_links, unnumbered_figures,
                     unnumbered_tables, long_short_answer, hard_prose]


def check_page(path: Path, build_root: Path) -> list[str]:
    """Every rule's problems on one HTML page of the build."""
    page = path.relative_to(build_root).as_posix()
    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    return [problem for rule in RULES for problem in rule(soup, page, build_root)]


def toc_pages(build_root: Path) -> list[Path]:
    """The built pages of the book's own sources (not genindex, search, or redirects)."""
    sources = build_root / "_sources"
    names = [src.relative_to(sources).as_posix().removesuffix(".txt") for src in sources.rglob("*")]
    return sorted(build_root / Path(name).with_suffix(".html")
                  for name in names if name.endswith((".ipynb", ".md", ".rst")))


def check_build(build_root: Path) -> list[str]:
    """Every rule's problems on every page of the table of contents."""
    build_root = Path(build_root)
    pages = toc_pages(build_root)
    if not pages:
        return [f"{build_root}: no pages (no _sources/ in the build)"]
    problems = [f"{p.relative_to(build_root).as_posix()}: page missing from the build"
                for p in pages if not p.is_file()]
    pages = [p for p in pages if p.is_file()]
    return (problems + [x for p in pages for x in check_page(p, build_root)]
            + too_many_words(build_root, pages))


def main(argv: list[str]) -> int:
    """Print the problems of the build named on the command line (default _build/html)."""
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parent.parent / "_build/html")
    if not root.is_dir():
        print(f"check_book: no build at {root}; run `make book` first")
        return 2
    problems = check_build(root)
    print("\n".join(problems) if problems else f"check_book: {root}: no problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
