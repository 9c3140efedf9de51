"""The house rules of mgpu_lib (README, "Architecture"): a small core in sight, layers kept by
import-linter's contracts (pyproject.toml), no package import hidden in a function, and no
print outside the command line."""
import ast
import io
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mgpu_lib"
LINT = Path(sys.executable).with_name("lint-imports")
# Issue 50: the core (mgpu_lib/*.py but __init__ and __main__) is counted in lines of code, not
# docstrings, comments or blank lines (docstrings are what a learner keeps). The issue asked for
# 800; what the later issues (51: the GPU defaults a GPU measured; 52: no rank outlives torchrun,
# the bar never costs a result) and the design card (exercise 2's split in the core) put there
# keeps it above that, so the ceiling is this ratchet: lowered with each move, never raised
# without a demand that names the lines (README, "Architecture").
CORE_MODULES, CORE_CODE_LINES = 9, 951
PACKAGE_LINES = 6462      # a ratchet; the package only grows by raising it on purpose


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


def code_line_set(src: str) -> set:
    """The lines of `src` with a token other than a comment, less docstrings."""
    docs = set()
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - docs


def code_lines(path: Path) -> int:
    """Lines of code in `path`: lines with a token other than a comment, less docstrings."""
    return len(code_line_set(path.read_text(encoding="utf-8")))


def core() -> list[Path]:
    return [p for p in sorted(PACKAGE.glob("*.py")) if p.stem not in ("__init__", "__main__")]


def test_the_core_is_small():
    code = sum(code_lines(p) for p in core())
    assert len(core()) <= CORE_MODULES, [p.stem for p in core()]
    assert code <= CORE_CODE_LINES, f"{code} lines of code in the core, ratchet {CORE_CODE_LINES}"


# README's "The core's lines": each row's top-level definitions, as "module:name" ("module:*":
# the whole module). A definition that enters the core goes into a row, or this test says so.
LEDGER = {
    "the chapter: network, step, epoch loop, evaluation, result, devices, timer, loader": (
        "model:* training:make_model training:make_step training:fit training:train "
        "training:evaluate_accuracy training:_prepare training:sgd training:load_data "
        "training:diverged training:DIVERGED_LOSS training:TrainResult training:METRICS "
        "training:BN_METRICS training:evaluate training:counted training:progress_bar "
        "data:DeviceLoader data:load_fashion_mnist data:load_subsets data:balanced_subset "
        "data:shard_indices devices:num_gpus devices:try_gpu devices:try_all_gpus "
        "devices:resolve_devices devices:DeviceError devices:_describe_available "
        "devices:_mps_available devices:synchronize devices:timed devices:describe_devices"),
    "DDP as page 05 teaches it: process group, shards, `DDP(...)`, rank 0's evaluation": (
        "ddp:setup ddp:load_shards ddp:train ddp:choose_backend ddp:local_batch_size "
        "ddp:cpu_threads ddp:describe_job ddp:main ddp:save_and_print ddp:LOG"),
    "the DDP snapshot, its resume and what differs": (
        "ddp:save_checkpoint ddp:write_atomic ddp:check_fresh ddp:differences ddp:restore "
        "ddp:CKPT_NAME ddp:CKPT_KEYS ddp:COLLECTIVE_TIMEOUT_S training:PARTIAL"),
    "the fast path: switches, channels_last, autocast, TF32 and cuDNN": (
        "config:Switches config:resolve_switches config:prepare_model config:channels_last_safe "
        "config:AUTO config:REFERENCE config:EVAL_BATCH training:backends training:_autocast "
        "training:replicated"),
    "the GPU defaults a GPU measured, autocast in each replica, CUDA graphs": (
        "devices:autocast_dtype devices:precision_records devices:measured_precision "
        "training:Autocast config:GRAPHS"),
    "no rank outlives torchrun, the bar never costs a result, `--out` checked": (
        "ddp:exit_with_parent ddp:PARENT_POLL_S training:_Stderr training:check_out"),
    "the trust boundary: `TrainConfig` and the DDP program's arguments": (
        "config:TrainConfig config:setting config:_int config:is_number config:SEED_MAX "
        "config:OPTIONAL ddp:on_off ddp:READ ddp:kind ddp:flag_name ddp:add_flags ddp:Parser "
        "ddp:parse_args ddp:RankInputError ddp:__main__"),
    "the data: a named folder, torchvision's reader and download, synthetic data": (
        "data:read_folder data:FILES data:data_root data:download data:synthetic_fashion_mnist "
        "data:load_raw data:DataError data:SOURCES data:NUM_CLASSES"),
    "exercise 2: the split and the engine": "hetero:* split:*",
    "imports": "",
}


def ledger() -> tuple[dict, list]:
    """Lines of code in each of LEDGER's rows, and the top-level statements in none."""
    owner = {name: row for row, names in LEDGER.items() for name in names.split()}
    counts, unplaced = dict.fromkeys(LEDGER, 0), []
    for path in core():
        src = path.read_text(encoding="utf-8")
        lines = code_line_set(src)
        for node in ast.parse(src).body:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            n = len({line for line in lines if first <= line <= node.end_lineno})
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                counts["imports"] += n
                continue
            name = ("__main__" if isinstance(node, ast.If)          # if __name__ == "__main__"
                    else ast.unparse(node.targets[0]) if isinstance(node, ast.Assign)
                    else getattr(node, "name", None))
            row = owner.get(f"{path.stem}:{name}") or owner.get(f"{path.stem}:*")
            if row:
                counts[row] += n
            elif n:
                unplaced.append(f"{path.stem}:{name}")
    return counts, unplaced


def test_every_line_of_the_core_is_in_the_readmes_ledger():
    """Issue 50's ceiling became the ratchet; README says where each line goes, and by whose
    demand. A new definition belongs to a row, and the README's figures are the counted ones."""
    counts, unplaced = ledger()
    assert not unplaced, f"top-level definitions in no row of LEDGER: {unplaced}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for row, n in counts.items():
        assert f"| {row} | {n} |" in readme, (row, n)
    total = sum(counts.values())
    assert total == sum(code_lines(p) for p in core())
    assert f"It holds {total}," in readme
    assert f"({len(core())} modules besides __init__.py, {total} lines" in readme


def test_code_lines_leave_out_docstrings_comments_and_blanks(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""Doc\nstring."""\n\n# a comment\ndef f(x):\n    """Doc."""\n'
                 '    return (x +\n            1)  # why\n', encoding="utf-8")
    assert code_lines(f) == 3


def test_argparse_is_imported_only_by_the_cli_and_programs():
    for path in library():
        text = path.read_text(encoding="utf-8")
        if "import argparse" in text:
            assert path.name in ("cli.py", "flags.py") or '__name__ == "__main__"' in text, path


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


def test_one_atomic_writer_and_one_header_builder():
    """Issue 50: one function replaces a file atomically (`ddp.write_atomic`; data.py's
    `os.replace` moves a finished download's folder), and one builds a record's header
    (`lab.files.record_header`, which the store's `stamp` adds to a run)."""
    replaces, headers = [], []
    for path in library():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
            if any(getattr(c.func, "attr", None) == "replace" and
                   getattr(c.func.value, "id", None) == "os" for c in calls):
                replaces.append(f"{path.name}:{fn.name}")
            if any(isinstance(k, ast.Constant) and k.value == "schema"
                   for d in ast.walk(fn) if isinstance(d, ast.Dict) for k in d.keys):
                headers.append(f"{path.name}:{fn.name}")
    assert sorted(replaces) == ["data.py:download", "ddp.py:write_atomic"]
    assert headers == ["files.py:record_header"]
