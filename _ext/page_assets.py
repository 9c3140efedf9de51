"""What a page loads: MathJax from the built book, and each inline script once.

MathJax. Sphinx loads MathJax from a CDN by default, so the book opened from _build/html
without a network shows math as TeX source. `mathjax_path` in _config.yml names a path under
_static instead (``mathjax/tex-chtml.js``), and this copies MathJax there when the build
finishes, from the PyPI package django-static-mathjax (module ``mathjax``: MathJax 3.2.2,
Apache-2.0, no dependencies; a dev extra). Only what the pages can ask for is copied (about
7 MB): the TeX-to-HTML bundle, its fonts, the TeX extensions it autoloads, and the menu's
accessibility components and speech rules. A build without the package warns (and so fails
under `make book`'s -W). A `mathjax_path` that is a URL is left alone.

MathJax only where there is math. Sphinx's mathjax extension loads MathJax on a page when its
math domain says the page "has equations", and that counts the pages of the page's toctree too:
the root page (intro), whose toctree holds every chapter, loaded the 1.2 MB bundle and its fonts
with no equation of its own. Each page keeps MathJax (the bundle and its `window.MathJax`
configuration) only when the page itself has math; the others drop it.

Inline scripts once. Sphinx 7.4 writes an inline script twice when an extension adds it after
the builder started (sphinx-thebe's and sphinx-togglebutton's configuration): the builder keeps
it with filename None, then re-adds it from the registry as '' and the two do not compare
equal. The second `const THEBE_JS_URL` then throws "Identifier 'THEBE_JS_URL' has already been
declared" on every page. Each page's scripts are de-duplicated here.
"""
from __future__ import annotations

import importlib.util
import posixpath
import shutil
from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)

MATHJAX_PACKAGE = "django-static-mathjax"  # on PyPI; its module is `mathjax`
# Beside the bundle: its fonts, the TeX extensions it autoloads (\color, \cancel, ...), and what
# the MathJax menu loads (the accessibility explorer and its speech rules).
MATHJAX_PARTS = ("output/chtml/fonts/woff-v2", "input/tex/extensions", "a11y", "sre", "ui")


def mathjax_source() -> Path | None:
    """MathJax's es5 folder in the installed django-static-mathjax, or None."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        es5 = Path(location) / "static" / "mathjax" / "es5"
        if es5.is_dir():
            return es5
    return None


def copy_mathjax(app, exception) -> None:
    """Copy MathJax under _static where `mathjax_path` points (HTML builds only)."""
    path = app.config.mathjax_path or ""
    if exception is not None or app.builder.format != "html" or "://" in path:
        return
    source = mathjax_source()
    bundle = posixpath.basename(path)
    if source is None or not (source / bundle).is_file():
        logger.warning(f"page_assets: no MathJax {bundle} to copy (pip install "
                       f"{MATHJAX_PACKAGE}): math shows as TeX source without a network")
        return
    dest = Path(app.outdir) / "_static" / posixpath.dirname(path)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / bundle, dest / bundle)
    shutil.copy2(source.parent / "LICENSE", dest / "LICENSE")
    for part in MATHJAX_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, dest / part, dirs_exist_ok=True)


def _script_key(script) -> tuple:
    """What makes two scripts the same: file (None and '' alike) and attributes."""
    attributes = getattr(script, "attributes", {}) or {}
    return (getattr(script, "filename", script) or "",
            tuple(sorted((k, str(v)) for k, v in attributes.items())))


def page_has_math(app, pagename: str) -> bool:
    """Whether the page itself (not the pages of its toctree) has math."""
    try:
        domain = app.env.get_domain("math")
    except Exception:  # noqa: BLE001  (no math domain: nothing to judge, keep what Sphinx did)
        return True
    return bool(domain.data.get("has_equations", {}).get(pagename, False))


def is_mathjax(app, script) -> bool:
    """A script of Sphinx's mathjax extension: the bundle at `mathjax_path`, or its inline
    configuration (`window.MathJax = ...`, or MathJax 2's text/x-mathjax-config)."""
    attributes = getattr(script, "attributes", {}) or {}
    name = getattr(script, "filename", script) or ""
    path = app.config.mathjax_path or ""
    if path and name and name in (path, posixpath.join("_static", path)):
        return True
    body = str(attributes.get("body", "") or "")
    return (not name and (body.lstrip().startswith("window.MathJax")
                          or attributes.get("type") == "text/x-mathjax-config"))


def page_scripts(app, pagename, templatename, context, doctree) -> None:
    """Each of the page's scripts once, the first of each kept in place; MathJax's only where
    the page has math."""
    scripts = context.get("script_files")
    if not scripts:
        return
    math = page_has_math(app, pagename)
    seen, once = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen and (math or not is_mathjax(app, script)):
            seen.add(key)
            once.append(script)
    if len(once) < len(scripts):
        context["script_files"] = once


def setup(app):
    app.connect("build-finished", copy_mathjax)
    app.connect("html-page-context", page_scripts, priority=900)  # after those that add scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
