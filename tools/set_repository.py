"""Stamp the book's repository, set once in `_config.yml`, and the version of mgpu_lib its
pages were written for into every notebook's setup cell.

    python tools/set_repository.py                                 # _config.yml's URL
    python tools/set_repository.py https://github.com/you/fork     # set it there first
    python tools/set_repository.py --ref 3e2b09a                   # a commit, not the tag

The launch buttons (Colab, Kaggle, Binder) read `_config.yml` when the book is built; a notebook
opened in Colab or Kaggle has no `_config.yml`, so its setup cell carries the URL it installs
mgpu_lib from, and the git ref it installs (`REPO_REF`, by default the tag `v<version>` of the
package's version in pyproject.toml: push that tag when the book is published), so that a reader
who opens a page later gets the library the page was written for, not whatever `main` holds.
tests/test_notebooks.py checks that every copy agrees with `_config.yml` and the version.
It also sets the book's published address (`html.baseurl`, the GitHub Pages URL of the
repository: the canonical link search engines and link previews follow) from the URL.

A ref follows git's own rules (`git check-ref-format`), in ASCII letters, digits and `._/+-`
(what the setup cell's string and pip's `git+URL@REF` carry as written). A notebook that is a
symbolic link has its target stamped, and stays a link.

All or nothing: the URL is checked (a GitHub owner and repository name), every file is read,
parsed and checked writable first, and only then written, each through a temporary file
renamed over it. Anything wrong is one line and exit 2, with no file changed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import yaml

from mgpu_lib.book.cli import Parser
from mgpu_lib.book.store import plural

sys.path.insert(0, str(Path(__file__).resolve().parent))
from release_check import REF_LINE, notebooks, version  # noqa: E402  (tools/ is not a package)

ROOT = Path(__file__).resolve().parent.parent
# The setup cell's line: REPO_URL = "https://github.com/..."  # _config.yml's repository
REPO_LINE = re.compile(r'^REPO_URL = "[^"]*"', re.M)
# What a ref may hold here, before git's rules: no '-' first (git would read an option).
REF = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9_+./-]{0,99}")
# GitHub's rules: an owner is 1 to 39 letters, digits and single hyphens, not at either end; a
# repository name is ASCII letters, digits, '.', '-' and '_', and never only dots ('.', '..').
URL = re.compile(r"https://github\.com/(?P<owner>[A-Za-z0-9](?:-?[A-Za-z0-9]){0,38})/"
                 r"(?P<name>(?!\.+$)[A-Za-z0-9_.-]{1,100})")
CONFIG_URL = re.compile(r"^(repository:\n  url: ).*$", re.M)
CONFIG_BASEURL = re.compile(r"^(html:\n(?:  .*\n)*?  baseurl: ).*$", re.M)


class Refused(ValueError):
    """What keeps the repository from being stamped, in one line; nothing was written."""


def check_url(url: str) -> str:
    m = URL.fullmatch(url)
    if not m or len(m["owner"]) > 39:
        raise Refused(f"expected https://github.com/OWNER/REPO (GitHub's names), got {url!r}")
    return url


def pages_url(url: str) -> str:
    """Where GitHub Pages publishes the repository at `url`: OWNER.github.io/NAME/, or the
    domain's root for the repository named OWNER.github.io."""
    m = URL.fullmatch(url)
    host, name = f"{m['owner'].lower()}.github.io", m["name"]
    return f"https://{host}/" if name.lower() == host else f"https://{host}/{name}/"


def default_ref(root: Path) -> str:
    """`v<version>`, the version in pyproject.toml."""
    try:
        return f"v{version(root)}"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise Refused(f"pyproject.toml: {e}") from None


def check_ref(ref: str) -> str:
    """`ref` if git accepts it as a tag, branch or commit name (`git check-ref-format`)."""
    try:
        ok = REF.fullmatch(ref) and subprocess.run(
            ["git", "check-ref-format", "--allow-onelevel", ref],
            capture_output=True).returncode == 0
    except OSError:
        raise Refused("git is needed to check the ref (git check-ref-format)") from None
    if not ok:
        raise Refused(f"expected a git tag, branch or commit that git accepts, in ASCII letters, "
                      f"digits and '._/+-', got {ref!r}")
    return ref


def _real(path: Path) -> Path:
    """The file a notebook's path names: a symbolic link's target, so that the link stays."""
    return Path(os.path.realpath(path))


def _writable(path: Path) -> None:
    path = _real(path)
    if not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)):
        raise Refused(f"{path}: not writable")


def stamped_config(root: Path, url: str = "") -> tuple[str, str]:
    """(_config.yml's text with `url` and its Pages address set, the URL it then names)."""
    config = root / "_config.yml"
    try:
        text = config.read_text(encoding="utf-8")
        if url:
            text, n = CONFIG_URL.subn(rf"\g<1>{url}", text, count=1)
            if n != 1:
                raise Refused(f"{config}: no 'repository:' block with 'url:' first")
        named = check_url(str(yaml.safe_load(text)["repository"]["url"]))
        text = CONFIG_BASEURL.sub(rf"\g<1>{pages_url(named)}", text, count=1)
        if (yaml.safe_load(text).get("html") or {}).get("baseurl") != pages_url(named):
            raise Refused(f"{config}: no 'baseurl:' under 'html:' for the published address")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise Refused(f"{config}: cannot read its repository url ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return text, named


def stamped_notebook(path: Path, url: str, ref: str):
    """`path`'s text with `url` and `ref` in its setup cell, or None if it is stamped already."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:          # OSError, not UTF-8, not JSON, not a notebook
        raise Refused(f"{path}: cannot read it as a notebook ({type(e).__name__})") from None
    cell = next((c for c in nb.cells if c.cell_type == "code" and REPO_LINE.search(c.source)),
                None)
    if cell is None or not REF_LINE.search(cell.source):
        raise Refused(f"{path.name} has no REPO_URL and REPO_REF lines in a code cell")
    source = REPO_LINE.sub(f'REPO_URL = "{url}"', cell.source, count=1)
    source = REF_LINE.sub(f'REPO_REF = "{ref}"', source, count=1)
    if source == cell.source:
        return None
    cell.source = source
    return nbformat.writes(nb).rstrip("\n") + "\n"       # as nbformat.write ends a file


def plan(root: Path, url: str = "", ref: str = "") -> tuple[str, dict[Path, str]]:
    """The URL, and every file to write with its new text: all read and checked, none written."""
    ref = check_ref(ref or default_ref(root))
    text, url = stamped_config(root, url and check_url(url))
    writes = {root / "_config.yml": text} if text != (root / "_config.yml").read_text(
        encoding="utf-8") else {}
    for path in notebooks(root):
        new = stamped_notebook(path, url, ref)
        if new is not None:
            writes[path] = new
    for path in writes:
        _writable(path)
    return url, writes


def write_all(writes: dict[Path, str]) -> None:
    """Each file's new text to a temporary file beside it first, then every one renamed into
    place: a failure before the renames leaves every file as it was."""
    staged = {}
    try:
        for path, text in writes.items():
            path = _real(path)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            staged[path] = tmp
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            os.chmod(tmp, path.stat().st_mode & 0o777)
        for path, tmp in staged.items():
            os.replace(tmp, path)
    except OSError as e:
        raise Refused(f"cannot write {e.filename or 'a file'}: {e.strerror or e}") from None
    finally:
        for tmp in staged.values():
            if os.path.exists(tmp):
                os.unlink(tmp)


def main(argv: list[str], root: Path = ROOT) -> int:
    p = Parser(prog="set_repository", description=__doc__.splitlines()[0])
    p.add_argument("url", nargs="?", default="",
                   help="https://github.com/OWNER/REPO, written to _config.yml first")
    p.add_argument("--ref", default="",
                   help="the git tag or commit the pages install (default: v<version>)")
    args = p.parse_args(argv)
    try:
        url, writes = plan(root, args.url, args.ref)
        write_all(writes)
    except Refused as e:
        print(f"set_repository: error: {e}", file=sys.stderr)
        return 2
    changed = [p.name for p in writes if p.suffix == ".ipynb"]
    names = f" ({', '.join(changed)})" if changed else ""
    print(f"{url}: {plural(len(changed), 'notebook')} updated{names}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
