"""Stamp the book's repository, set once in `_config.yml`, into every notebook's setup cell.

    python tools/set_repository.py                                 # _config.yml's URL
    python tools/set_repository.py https://github.com/you/fork     # set it there first

The launch buttons (Colab, Kaggle, Binder) read `_config.yml` when the book is built; a notebook
opened in Colab or Kaggle has no `_config.yml`, so its setup cell carries the URL it installs
mgpu_lib from. tests/test_notebooks.py checks that every copy agrees with `_config.yml`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "_config.yml"
NOTEBOOKS = sorted(p for d in ("chapters", "exercises") for p in (ROOT / d).glob("*.ipynb"))
# The setup cell's line: REPO_URL = "https://github.com/..."  # _config.yml's repository
REPO_LINE = re.compile(r'^REPO_URL = "[^"]*"', re.M)
URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+")


def set_config_url(url: str) -> None:
    """Write `url` as `repository: url:` in _config.yml, leaving the rest of the file as it is."""
    text = CONFIG.read_text()
    new, n = re.subn(r"^(repository:\n  url: ).*$", rf"\g<1>{url}", text, count=1, flags=re.M)
    if n != 1:
        sys.exit("set_repository: no 'repository:' block with 'url:' first in _config.yml")
    CONFIG.write_text(new)


def stamp(url: str) -> list[str]:
    """Write `url` into each notebook's setup cell; the notebooks changed."""
    changed = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        cell = next((c for c in nb.cells if c.cell_type == "code" and REPO_LINE.search(c.source)),
                    None)
        if cell is None:
            sys.exit(f"set_repository: {path.name} has no REPO_URL line in a code cell")
        source = REPO_LINE.sub(f'REPO_URL = "{url}"', cell.source, count=1)
        if source != cell.source:
            cell.source = source
            nbformat.write(nb, path)
            changed.append(path.name)
    return changed


def main(argv: list[str]) -> int:
    if argv:
        if not URL.fullmatch(argv[0]):
            sys.exit(f"set_repository: expected https://github.com/OWNER/REPO, got {argv[0]!r}")
        set_config_url(argv[0])
    url = yaml.safe_load(CONFIG.read_text())["repository"]["url"]
    changed = stamp(url)
    names = f" ({', '.join(changed)})" if changed else ""
    print(f"{url}: {len(changed)} notebook(s) updated{names}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
