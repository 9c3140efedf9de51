"""No hand-typed result in the book's prose.

Every markdown cell of every notebook, intro.md and appendix/*.md is read as a reader sees it
minus what is exempt (glue roles, math, code, link targets, citations and other roles, HTML
comments). What is left must hold no measured-looking number: a decimal, or a number followed
by s, ms, min, %, x/×, images/s or points. A run's result, a record, a prediction or a published
figure belongs in a cell and is glued (`{glue:text}`name:.2f``). The few numbers that look
measured but are not sit in ALLOWED, each with the reason.
"""
import functools
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each entry: one number in its context (a regular expression), and why it is no result. Settings,
# names of hardware generations and versions look measured to the pattern but measure nothing.
ALLOWED = [
    (r"\b([Ss]ection|D2L) 12\.6\b", "D2L's section number for this chapter"),
    (r"\bPython 3\.9\b", "the oldest Python the package supports, a version"),
    (r"\blr 0\.1\b", "the chapter's learning rate on one GPU, a setting"),
    (r"\blr 0\.2\b", "the chapter's learning rate on two GPUs, a setting"),
    (r"\blr 0\.4\b", "the lr the study notes called best, a setting the claim runs were given"),
    (r"compute capability 3\.7\b", "the K80's CUDA generation, a name"),
    (r"compute capability 8\.0\b", "the first generation with bf16 tensor cores, a name"),
    (r"\bCUDA 12\.6\b", "a CUDA version, as pytorch#157517 names it"),
]

# "s" and "sec" only after a space: "4090s" names cards, "3 s" is a time. x is matched below.
UNIT = r"(?:\s(?:s|sec)|\s?(?:ms|min|%)|\s(?:images/s|images per second|points?))"
MEASURED = re.compile(
    r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?[x×](?=[\s,.;:)]|$)"       # 4x, 1.34x, 2×
    rf"|(?<![\w.\-/])\d[\d,]*(?:\.\d+)?{UNIT}(?![\w/])"        # 3 s, 488 ms, 30%, 2 points
    r"|(?<![\w.\-/])\d[\d,]*\.\d+(?![\d.]*\d)"                  # a decimal (not 2.14.1)
)
EXEMPT = [
    re.compile(r"```.*?```", re.S),                    # fenced code and directives
    re.compile(r"\$\$.*?\$\$", re.S),                  # display math
    re.compile(r"\$[^$\n]+\$"),                        # inline math
    re.compile(r"\{[\w:.-]+\}`[^`]*`"),                # roles: glue, cite, numref, math, ...
    re.compile(r"`[^`\n]*`"),                          # code spans
    re.compile(r"<!--.*?-->", re.S),                   # HTML comments
    re.compile(r"\]\([^)]*\)"),                        # link targets
    re.compile(r"https?://\S+"),                       # bare addresses
]


def pages() -> list[Path]:
    return sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("exercises/*.ipynb"),
                   ROOT / "intro.md", *ROOT.glob("appendix/*.md")])


def cells(path: Path) -> list[tuple[str, str]]:
    """(cell label, markdown text) for each markdown cell; a .md file is one cell."""
    if path.suffix == ".md":
        return [("the page", path.read_text(encoding="utf-8"))]
    nb = nbformat.read(path, as_version=4)
    return [(f"cell {i} ({c.get('id', 'no id')})", c.source)
            for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def strip(text: str) -> str:
    for pattern in EXEMPT:
        text = pattern.sub(" ", text)
    for pattern, _why in ALLOWED:
        text = re.sub(pattern, " ", text)
    return text


def typed_numbers(text: str) -> list[str]:
    """The measured-looking numbers left in `text` once the exempt parts are gone."""
    found = []
    for m in MEASURED.finditer(strip(text)):
        found.append(m.group(0).strip())
    return found


def offences(paths, root: Path = ROOT) -> list[str]:
    """'page, cell: number' for every typed number on the pages."""
    return [f"{path.relative_to(root)}, {label}: {number!r}"
            for path in paths for label, text in cells(path)
            for number in typed_numbers(text)]


def test_no_result_is_typed_into_the_prose():
    found = offences(pages())
    assert not found, ("numbers typed into the prose (glue them from the cell that computes "
                       "them, or add a reason to ALLOWED):\n  " + "\n  ".join(found))


def test_every_allowed_phrase_is_still_on_a_page():
    """An allowance no page uses any more is a stale hole in the typed-number check: remove it.
    (Before, this test asserted the list's length, a constant of its own.)"""
    texts = [text for path in pages() for _, text in cells(path)]
    unused = [why for pattern, why in ALLOWED if not any(re.search(pattern, t) for t in texts)]
    assert not unused, unused


@pytest.mark.parametrize("typed", [
    "batch 512 ended at 0.79 against 0.83",            # a stale accuracy
    "about 440 against 480 images/s",                  # a throughput
    "an epoch takes 3 s",                              # seconds
    "the fast loop ran 1.34x faster",                  # a speed-up
    "a gap of 2 points",                               # points
    "30% efficiency",                                  # a percent
    "it took 488 ms per step",                         # milliseconds
    "4× faster",
    "it took 488ms",
])
def test_a_typed_result_is_caught(typed):
    assert typed_numbers(typed), typed


@pytest.mark.parametrize("fine", [
    "{glue:text}`acc_1:.3f` against {glue:text}`acc_2:.3f`",  # glued
    "$\\tau = 0.5 N / \\sum_j s_j$ and $$T = 1.5 s$$",          # math
    "`TrainConfig(lr=0.1)` and `1e-5`",                       # code spans
    "[the release notes](https://example.com/v2.14.0/notes-1.5x)",    # a link target
    "{cite}`goyal2017accurate`",
    "batch 256 and lr 0.1 on one GPU, 512 and lr 0.2 on two",
    "compute capability 8.0 (A100)",
    "ResNet-18 on Fashion-MNIST, 60,000 images, 28 x 28, 16 dies",
    "section 12.6 of the PyTorch edition",
    "four RTX 4090s",
])
def test_exempt_text_passes(fine):
    assert not typed_numbers(fine), typed_numbers(fine)


def test_a_stale_number_in_a_markdown_cell_fails(tmp_path):
    """Planted fault: a notebook whose prose still quotes an old result."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("The run ended at {glue:text}`acc:.2f`."),
                nbformat.v4.new_code_cell("print(0.93)"),
                nbformat.v4.new_markdown_cell("Two processes ran 0.93x as fast.")]
    path = tmp_path / "stale.ipynb"
    nbformat.write(nb, path)
    assert offences([path], tmp_path) == [f"stale.ipynb, cell 2 ({nb.cells[2].id}): '0.93x'"]


GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`(?:([^`:]+?)::)?([\w.]+)(?::[^`]*)?`")
STRING = re.compile(r"""(f?)(["'])([^"'\n]*?)\2""")


@functools.lru_cache(maxsize=None)
def glued_keys(path: Path) -> list[re.Pattern]:
    """A pattern for every string in the code cells that call glue: a key is glued by name
    (`glue("acc", ...)`), from a dict of names, or from an f-string, whose fields match any
    name (`f"{name}_acc1"` glues d2l_acc1 and neu_acc1)."""
    nb = nbformat.read(path, as_version=4)
    keys = []
    for c in nb.cells:
        if c.cell_type == "code" and "glue(" in c.source:
            for f, _, text in STRING.findall(c.source):
                parts = re.split(r"\{[^}]*\}", text) if f else [text]
                keys.append(re.compile(r"\w*".join(map(re.escape, parts)) + r"$"))
    return keys


def unglued(path: Path, root: Path = ROOT) -> list[str]:
    """Keys the page's prose pastes that no code cell of the page it names glues."""
    missing = []
    for label, text in cells(path):
        for doc, key in GLUE_ROLE.findall(text):
            source = (path.parent / doc) if doc else path
            stems = (key, key[:-4]) if key.endswith("_how") else (key,)   # a Verdict's two
            if not any(k.match(stem) for k in glued_keys(source) for stem in stems):
                missing.append(f"{path.relative_to(root)}, {label}: {key!r}")
    return missing


def test_every_pasted_key_is_glued_by_its_page():
    missing = [m for path in pages() for m in unglued(path)]
    assert not missing, "pasted but never glued:\n  " + "\n  ".join(missing)


def test_a_pasted_key_nobody_glues_is_caught(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("{glue:text}`acc:.2f` and {glue:text}`ac:.2f`"),
                nbformat.v4.new_code_cell('glue("acc", 0.9)\nglue(f"{n}_s1", 3.0)'),
                nbformat.v4.new_code_cell('x = "ac"  # a string in a cell that glues nothing'),
                nbformat.v4.new_markdown_cell("{glue:text}`d2l_s1:.1f`"),
                nbformat.v4.new_markdown_cell("{glue:text}`acc_how` {glue:text}`ac_how`")]
    nbformat.write(nb, tmp_path / "p.ipynb")   # glue(NAME, verdict) stores NAME and NAME_how
    assert [m.split(": ")[1] for m in unglued(tmp_path / "p.ipynb", tmp_path)] == [
        "'ac'", "'ac_how'"]


UNDECIDED_AS_NONE = re.compile(r"\bno (effect|difference)\b|ahead(:| by) -", re.I)


def test_an_undecided_verdict_is_never_read_as_no_effect():
    """Issue 31: "cannot be told apart" never becomes "no effect" or "no difference", and a
    winner's margin is never negative ("ahead: -"), in the prose or in anything a cell glues
    or prints. (A sentence that names the phrase to rule it out quotes it.)"""
    found = []
    for path in pages():
        texts = [text for _, text in cells(path)]
        if path.suffix == ".ipynb":
            texts += [str(out) for c in nbformat.read(path, as_version=4).cells
                      if c.cell_type == "code" for out in c.outputs]
        for text in texts:
            found += [f"{path.name}: {m.group(0)!r}" for m in UNDECIDED_AS_NONE.finditer(
                text.replace('"no effect"', "").replace("“no effect”", ""))]
    assert not found, found


GLOSSARY = ROOT / "appendix" / "glossary.md"
TERM_ROLE = re.compile(r"\{term\}`(?:[^`<]*<)?([^`>]+)>?`")
# What a reader does not see as prose, or sees as a link already: never a term's first use.
PROTECTED = re.compile(r"```.*?```|\$\$.*?\$\$|\$[^$\n]+\$|\{[\w:.-]+\}`[^`]*`|`[^`\n]*`"
                       r"|\[[^\]]*\]\([^)]*\)|<!--.*?-->|https?://\S+|^#[^\n]*$|^\([^\n]*\)=$"
                       r"|^>[^\n]*$", re.S | re.M)   # a quotation is the source's words


def glossary_terms() -> list[str]:
    text = GLOSSARY.read_text(encoding="utf-8")
    block = text[text.index("```{glossary}"):]
    return [line for line in block.splitlines()[1:] if line and not line.startswith((" ", "`"))]


def first_uses(text: str, terms: list[str]) -> dict[str, tuple[int, bool]]:
    """{term: (position, linked)} of each term's first use in `text`: linked when that use is
    a {term} role, plain when it is prose outside code, math, links and headings."""
    found = {}
    for m in TERM_ROLE.finditer(text):
        found.setdefault(m.group(1).strip().lower(), (m.start(), True))
    plain = PROTECTED.sub(lambda m: " " * len(m.group(0)), text)
    for term in terms:
        m = re.search(rf"(?<![\w-]){re.escape(term)}(?:s|es)?(?![\w-])", plain, re.I)
        if m and (term.lower() not in found or m.start() < found[term.lower()][0]):
            found[term.lower()] = (m.start(), False)
    return found


def test_each_glossary_term_is_linked_where_a_page_first_uses_it():
    """Issue 31: a term's first use on each page links the glossary through {term}."""
    terms = [t for t in glossary_terms() if t != "MB and MiB"]
    unlinked = []
    for path in pages():
        if path.parent.name == "appendix":
            continue
        text = "\n\n".join(t for _, t in cells(path)[1:])       # after the title
        unlinked += [f"{path.name}: {term}" for term, (_, linked) in
                     first_uses(text, terms).items() if not linked]
    assert not unlinked, unlinked
