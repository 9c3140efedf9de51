"""The house rules of mgpu_lib (see README, "Architecture"): floors whose imports only point down,
no package import hidden in a function, and no print outside the command line."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mgpu_lib"
FLOORS = [
    {"model", "devices", "data", "split", "scaling", "results", "supervise",    # ground
     "style", "settings", "published"},
    {"switches", "chapter", "profiles", "verdict", "record",
     "events", "evidence"},                                                     # the loop's parts
    {"train", "runtime"},                                                       # the loop
    {"ddp", "hetero"},                                                          # engines
    {"sweep", "bench", "accuracy", "pipeline", "dataparallel", "pages",
     "trace"},                                                                  # experiments
    {"plots", "figures", "tables", "plan", "timeline", "diagnose"},             # faces
    {"__main__"},                           # the command line: over the faces it prints
]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def package_imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, module name) for every import of an mgpu_lib module in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.append((node, node.module.split(".")[0]))
            elif node.level == 1:                  # from . import results
                found += [(node, a.name) for a in node.names]
            elif (node.module or "").startswith("mgpu_lib"):
                found.append((node, (node.module.split(".") + [""])[1]))
        elif isinstance(node, ast.Import):
            found += [(node, a.name.split(".")[1]) for a in node.names
                      if a.name.startswith("mgpu_lib.")]
    return found


def test_every_module_has_a_floor():
    assert {p.stem for p in modules()} == set(FLOOR)


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.stem)
def test_imports_point_down_and_none_hides_in_a_function(path):
    tree = ast.parse(path.read_text())
    for node, name in package_imports(tree):
        assert FLOOR[name] < FLOOR[path.stem], \
            f"{path.stem} (floor {FLOOR[path.stem]}) imports {name} (floor {FLOOR[name]})"
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hidden = package_imports(fn)
            assert not hidden, f"{path.stem}:{hidden[0][0].lineno} imports inside {fn.name}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.stem)
def test_library_code_does_not_print(path):
    if path.stem == "__main__":
        return
    calls = [n.lineno for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
    assert not calls, f"{path.stem} prints at lines {calls}"
