"""Every text file is opened with an explicit encoding (issue 32): Windows reads and writes
cp1252 by default, and this repository's files hold text that cp1252 cannot (Chinese in the
study notes' sources, "±" and "×" in outputs)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for d in ("mgpu_lib", "tools", "tests", "_ext") for p in (ROOT / d).rglob("*.py"))


def unencoded(tree: ast.AST) -> list[int]:
    """Lines of text-mode `open(...)`, `Path.open(...)`, `.read_text()` and `.write_text()`
    calls that name no encoding."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else \
            node.func.id if isinstance(node.func, ast.Name) else None
        keywords = {k.arg for k in node.keywords}
        if "encoding" in keywords:
            continue
        if name in ("read_text", "write_text"):
            found.append(node.lineno)
        elif name == "open" and not (isinstance(node.func, ast.Attribute) and
                                     isinstance(node.func.value, ast.Name) and
                                     node.func.value.id in ("os", "gzip", "tarfile", "zipfile")):
            mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
            args = node.args[1:] if isinstance(node.func, ast.Name) else node.args
            if mode is None and args:
                mode = args[0]
            text = mode is None or (isinstance(mode, ast.Constant) and "b" not in str(mode.value))
            if text:
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_text_file_is_opened_with_an_encoding(path):
    lines = unencoded(ast.parse(path.read_text(encoding="utf-8")))
    assert not lines, f"{path.relative_to(ROOT)}: no encoding= at line(s) {lines}"


def test_the_check_finds_what_it_looks_for():
    found = unencoded(ast.parse("open('a')\nopen('a', 'rb')\nopen('a', 'w', encoding='utf-8')\n"
                                "p.read_text()\np.open('w')\nos.open('a', 1)\n"))
    assert found == [1, 4, 5]
