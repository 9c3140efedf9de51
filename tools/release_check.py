"""Refuse a release whose tag is not the version that the package and every notebook name.

    python tools/release_check.py v0.2.0     # .github/workflows/release.yml passes the pushed tag

A page opened in Colab or Kaggle installs mgpu_lib at the `REPO_REF` of its setup cell
(tools/set_repository.py stamps it, `v<version>` by default), so a release is the tag that every
notebook installs: the tag must be `v` + pyproject.toml's version and every notebook's REPO_REF.
Prints one line: exit 0 if all agree, 1 naming each mismatch, 2 if a file cannot be read.
Standard library only, so that it runs before anything is installed.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.compile(r'^version = "([^"]+)"', re.M)
# The setup cell's line: REPO_REF = "v0.2.0"  # the version this page was written for
REF_LINE = re.compile(r'^REPO_REF = "([^"]*)"', re.M)


class Mismatch(ValueError):
    """The tag differs from the version or from a notebook's REPO_REF, in one line."""


def version(root: Path) -> str:
    """pyproject.toml's version; ValueError if it names none."""
    m = VERSION.search((root / "pyproject.toml").read_text(encoding="utf-8"))
    if not m:
        raise ValueError("pyproject.toml names no version")
    return m[1]


def notebooks(root: Path) -> list[Path]:
    """The book's notebooks: every page with a setup cell."""
    return sorted(p for d in ("chapters", "exercises") for p in (root / d).glob("*.ipynb"))


def repo_refs(path: Path) -> list[str]:
    """Every REPO_REF that `path`'s code cells set (ValueError if it is not a notebook)."""
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells")
    if not isinstance(cells, list):
        raise ValueError(f"{path.name}: not a notebook")
    sources = ("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "code")
    return [ref for source in sources for ref in REF_LINE.findall(source)]


def check(tag: str, root: Path) -> str:
    """The agreement in one line, or Mismatch naming everything that differs from `tag`."""
    wanted = f"v{version(root)}"
    problems = [] if tag == wanted else [f"pyproject.toml's version is {wanted[1:]}"]
    pages = notebooks(root)
    off: dict[str, list[str]] = {}
    for path in pages:
        for ref in repo_refs(path) or ["nothing"]:
            if ref != tag:
                off.setdefault(ref, []).append(path.name)
    for ref, names in off.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        problems.append(f"REPO_REF is {ref} in {len(names)} of {len(pages)} notebooks ({shown})")
    if not pages:
        problems.append("no notebooks under chapters/ or exercises/")
    if problems:
        raise Mismatch(f"tag {tag} refused: " + "; ".join(problems) +
                       "; tag the version, or stamp the tag (tools/set_repository.py --ref)")
    return f"tag {tag}: pyproject.toml's version and the REPO_REF of all {len(pages)} notebooks"


def main(argv: list[str], root: Path = ROOT) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: release_check.py TAG   (e.g. v0.2.0)", file=sys.stderr)
        return 2
    try:
        print(f"release_check: {check(argv[0].removeprefix('refs/tags/'), root)}")
    except Mismatch as e:
        print(f"release_check: {e}", file=sys.stderr)
        return 1
    except (OSError, UnicodeDecodeError, ValueError) as e:   # json's errors are ValueErrors
        print(f"release_check: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
