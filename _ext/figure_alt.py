"""Alt text for the book's figures, from their captions.

The figures are cell outputs captioned through myst-nb's cell metadata
(``"mystnb": {"figure": {"caption": ..., "name": ...}}``). myst-nb gives their images no alt
text, so Sphinx writes the image's path as the alt (``../_images/7c0d5b...png``), which a
screen reader reads out. This gives each image in a captioned figure the caption's first
sentence (what the figure shows; the figcaption beside it is read too, so the rest is not
repeated). An alt set explicitly (``"mystnb": {"image": {"alt": ...}}``) is kept.

Each figure already links to its full-size image: Sphinx wraps an image with a width or
height in a link to its file (html_scaled_image_link). tools/check_layout.py checks both.
"""
from __future__ import annotations

import re

from docutils import nodes

# A sentence ends at a full stop (or ! ?) before a space and a capital, unless the word before
# it is an abbreviation: "Fig. 3", "e.g. This", "vs. DDP".
SENTENCE_END = re.compile(r"(\S*)[.!?](?=\s+[A-Z(])")
ABBREVIATIONS = {"e.g", "i.e", "vs", "etc", "fig", "eq", "cf", "approx", "no"}


def first_sentence(text: str) -> str:
    """The first sentence of a caption, whitespace collapsed (the whole text if it has one)."""
    text = " ".join(text.split())
    for end in SENTENCE_END.finditer(text):
        if end.group(1).lower() not in ABBREVIATIONS:
            return text[:end.end()]
    return text


def needs_alt(image: nodes.image) -> bool:
    """Whether an image has no alt text of its own: none, or its path (Sphinx's fallback)."""
    alt = (image.get("alt") or "").strip()
    return not alt or alt == image.get("uri") or bool(re.fullmatch(r"\S*/\S*", alt)) or \
        bool(re.search(r"\.(png|svg|jpe?g|gif|webp)$", alt, re.I))


def alt_from_captions(app, doctree: nodes.document, docname: str) -> None:
    """Each image of a captioned figure without alt text gets the caption's first sentence."""
    for figure in doctree.findall(nodes.figure):
        caption = next((c for c in figure.children if isinstance(c, nodes.caption)), None)
        if caption is None or not caption.astext().strip():
            continue
        alt = first_sentence(caption.astext())
        for image in figure.findall(nodes.image):
            if needs_alt(image):
                image["alt"] = alt


def setup(app):
    app.connect("doctree-resolved", alt_from_captions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
