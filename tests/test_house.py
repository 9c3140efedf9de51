"""The house rules of mgpu_lib (README, "Architecture"): a small core in sight, layers kept by
import-linter's contracts (pyproject.toml), no package import hidden in a function, and no
print outside the command line."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mgpu_lib"
LINT = Path(sys.executable).with_name("lint-imports")
CORE_MODULES, CORE_LINES = 10, 1673       # issues 29, 37: the core a learner opens shrinks
PACKAGE_LINES = 7355      # issue 37: a ratchet; the package only grows by raising it on purpose


def library() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter over the `mgpu_lib` found in `root`, with `root`'s pyproject.toml."""
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(root), "PATH": str(LINT.parent)}, timeout=120)


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")
def test_the_import_contracts_are_kept():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "BROKEN" not in done.stdout and done.stdout.count("KEPT") >= 2


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")
def test_a_core_module_importing_the_machinery_breaks_a_contract(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "mgpu_lib",
                    ignore=shutil.ignore_patterns("__pycache__", "recorded"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    train = tmp_path / "mgpu_lib" / "training.py"
    train.write_text(train.read_text(encoding="utf-8") + "\nfrom .book import store\n",
                     encoding="utf-8")
    done = lint(tmp_path)
    assert done.returncode == 1
    assert "mgpu_lib.training -> mgpu_lib.book.store" in done.stdout


def test_the_core_is_small():
    core = [p for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    lines = sum(len(p.read_text(encoding="utf-8").splitlines())
                for p in PACKAGE.glob("*.py"))
    assert len(core) <= CORE_MODULES, sorted(p.stem for p in core)
    assert lines <= CORE_LINES


def test_the_package_does_not_grow():
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in library())
    assert lines <= PACKAGE_LINES, f"{lines} lines, more than the {PACKAGE_LINES:,} allowed"


def package_imports(tree: ast.AST) -> list[ast.AST]:
    """Every import of an mgpu_lib module in `tree`."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (
        n.level > 0 or (n.module or "").startswith("mgpu_lib"))
        or isinstance(n, ast.Import) and any(a.name.startswith("mgpu_lib") for a in n.names)]


@pytest.mark.parametrize("path", library(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_package_import_hides_in_a_function(path):
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hidden = package_imports(fn)
            assert not hidden, f"{path.name}:{hidden[0].lineno} imports inside {fn.name}"


@pytest.mark.parametrize("path", library(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_library_code_does_not_print(path):
    # The programs print: the command line, and the DDP program a torchrun job runs (its rank 0
    # prints each epoch and the result, as the DDP tutorial's programs do).
    if path.name in ("cli.py", "__main__.py") or path == PACKAGE / "ddp.py":
        return
    calls = [n.lineno for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
    assert not calls, f"{path.name} prints at lines {calls}"


def test_the_epoch_loop_is_small_and_the_step_has_one_path():
    """Issue 37: `fit` takes at most 6 parameters (engines do their own work on what it yields),
    and `make_step` has one path: a GradScaler that is off, not an `if scaler is None` fork."""
    import inspect
    from mgpu_lib import training
    assert len(inspect.signature(training.fit).parameters) <= 6
    step = inspect.getsource(training.make_step)
    assert "GradScaler" in step
    assert not [n for n in ast.walk(ast.parse(step)) if isinstance(n, (ast.If, ast.IfExp))]
