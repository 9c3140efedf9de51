"""The command line, in-process: flags generated from TrainConfig's declarations, and every
user error one line with exit code 2 (issues 23 and 26). Nothing here trains or downloads."""
import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from mgpu_lib.book import cli as cli
from mgpu_lib.book import store as results
from mgpu_lib.book import sweep as sweeps
from mgpu_lib.data import DataError, load_raw
from mgpu_lib.config import setting
from mgpu_lib.ddp import flag_name
from mgpu_lib.book.sweep import load_store
from mgpu_lib.training import TrainConfig

from helpers import FakeTrain, make_result, one_line, run_cli as run

REPO = Path(__file__).resolve().parent.parent
TRAINED = "<the sweep trained here>"


@pytest.fixture
def planned(monkeypatch):
    """`sweep` replaced by a recorder: what the command line would have swept. It prints
    TRAINED where training would print its first line."""
    calls = []

    def fake(base, vary, *, seeds, store, log=None):
        calls.append(dict(base=base, vary=vary, seeds=seeds))
        print(TRAINED)
        return []
    monkeypatch.setattr(cli, "sweep", fake)
    return calls


def sweep_args(tmp_path, *extra):
    return ["sweep", "--profile", "smoke", "--data-source", "synthetic",
            "--store", str(tmp_path / "s.jsonl"), *extra]


# ---- issue 23: one declaration per setting -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WithMomentum(TrainConfig):
    """TrainConfig plus one setting: the field, and its range where settings are checked."""
    momentum: float = setting(0.0, "SGD momentum")

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be from 0 to below 1, got {self.momentum!r}")


def test_a_new_field_is_a_checked_flag_and_a_vary_key(capsys):
    parser = cli.build_parser(WithMomentum)
    args = parser.parse_args(["train", "--profile", "smoke", "--momentum", "0.9"])
    config = cli.config_from_args(args)
    assert isinstance(config, WithMomentum) and config.momentum == 0.9
    assert config.width == 8                           # the profile's, not overridden
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["train", "--momentum", "abc"])
    assert e.value.code == 2 and "--momentum" in one_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match="momentum must be"):
        cli.config_from_args(parser.parse_args(["train", "--momentum", "-1"]))
    args = parser.parse_args(["sweep", "--vary", "momentum=0,0.9", "--store", "x.jsonl"])
    assert args.vary == [("momentum", [0.0, 0.9])]


def test_every_config_flag_comes_from_its_field():
    flags = {a.dest: a for a in subcommand("train")._actions}
    for f in dataclasses.fields(TrainConfig):
        if f.metadata.get("cli", True):
            assert flag_name(f) in flags[f.name].option_strings, f.name
            assert flags[f.name].help == f.metadata["help"]
    for name in ("positive_int", "positive_float", "nonnegative_float"):   # the hand validators
        assert not hasattr(cli, name)


def subcommand(name: str):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


def test_true_false_flags_alone_mean_true():
    args = cli.build_parser().parse_args(["train", "--norm-fp32", "--fast", "off",
                                          "--bf16", "auto", "--compile", "on"])
    config = cli.config_from_args(args)
    assert (config.norm_fp32, config.fast, config.bf16, config.compile) == (True, False,
                                                                            "auto", True)


def documented_commands():
    """Every `python -m mgpu_lib ...` command in the README, the notebooks and the docstrings of
    the whole package (its subpackages' too: `book/cli.py`, `book/sweep.py`, `lab/bench.py`)."""
    texts = [p.read_text(encoding="utf-8")
             for p in [REPO / "README.md", *REPO.glob("mgpu_lib/**/*.py"), *REPO.glob("tools/*.py")]]
    for nb in [*REPO.glob("chapters/*.ipynb"), *REPO.glob("exercises/*.ipynb")]:
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]]
    for text in texts:
        text = text.replace("\\\n", " ")
        for m in re.finditer(r"-m mgpu_lib ((?:train|sweep|bench)"
                             r"(?:[ \t]+--[^\n#`\"]*)?)(?=[\s`\"]|$)", text):
            yield m.group(1).split()


@pytest.mark.parametrize("argv", sorted(set(map(tuple, documented_commands()))), ids=" ".join)
def test_documented_commands_still_parse(argv):
    cli.build_parser().parse_args(argv)


# ---- issue 26: the command line's faults ------------------------------------------------------

@pytest.mark.parametrize("varies, want", [
    (["lr=0.05", "lr=0.1"], {"lr": [0.05, 0.1]}),
    (["epochs=1", "num_epochs=2"], {"num_epochs": [1, 2]}),
    (["batch-size=32,64", "batch_size=64,128"], {"batch_size": [32, 64, 128]}),
    (["lr=0.1,0.1"], {"lr": [0.1]}),                   # once within one --vary, too
])
@pytest.mark.slow
def test_a_repeated_vary_key_merges_its_values(tmp_path, capsys, planned, varies, want):
    """Before: --vary lr=0.05 --vary lr=0.1 trained only lr 0.1."""
    argv = sweep_args(tmp_path, "--seeds", "0")
    for v in varies:
        argv += ["--vary", v]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and planned[0]["vary"] == want


@pytest.mark.parametrize("vary, message", [
    ("seed=1,2", "unknown key 'seed'"),
    ("momentum=0.9", "unknown key 'momentum'; known keys: devices, batch_size, lr"),
    ("lr=fast", "lr"),
    ("nprocs=-1", "nprocs"),
    ("fast=maybe", "fast"),
])
def test_a_bad_vary_key_or_value_is_one_line(tmp_path, capsys, planned, vary, message):
    """Before: seed=1,2 was a TypeError traceback; momentum said 'must be a positive integer'."""
    code, _, err = run(capsys, *sweep_args(tmp_path, "--vary", vary))
    assert code == 2 and message in one_line(err) and not planned


@pytest.mark.parametrize("argv, name", [
    (["train", "--seed", "1e23"], "seed"),
    (["train", "--seed", str(10 ** 23)], "seed"),
    (["train", "--seed", "-1"], "seed"),
    (["train", "--data-source", "web"], "data"),
])
def test_bad_flag_values_are_one_line_that_names_the_setting(capsys, argv, name):
    """Behaviour, not wording (issue 50): exit 2, one line, the setting named, nothing run."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and name in one_line(err) and not out


@pytest.mark.parametrize("extra, name", [(["--seeds", "0,x"], "--seeds"),
                                         (["--out", "r.json"], "--out")])
def test_bad_seeds_or_an_out_for_a_sweep_are_one_line(tmp_path, capsys, planned, extra, name):
    """Before: a bad seed trained, then died; sweep --out was accepted and ignored."""
    code, _, err = run(capsys, *sweep_args(tmp_path, "--vary", "lr=0.1", *extra))
    assert code == 2 and name in one_line(err) and not planned


def test_a_data_folder_that_is_a_file_says_so(tmp_path, monkeypatch, capsys):
    """Before: a file named as the data folder was reported as missing."""
    afile = tmp_path / "fashion.gz"
    afile.write_bytes(b"not a folder")
    with pytest.raises(DataError, match="named by root is not a folder"):
        load_raw("local", root=afile)
    with pytest.raises(DataError, match="does not exist"):
        load_raw("local", root=tmp_path / "missing")
    monkeypatch.setenv("MGPU_FASHION_MNIST_DIR", str(afile))
    code, _, err = run(capsys, "train", "--profile", "smoke", "--data-source", "local",
                       "--epochs", "1", "--width", "4")
    assert code == 2 and "MGPU_FASHION_MNIST_DIR is not a folder" in one_line(err)


def test_a_sweep_prints_its_plan_first(tmp_path, capsys, planned):
    """The plan is the first line, before anything trains (a plan printed after training would
    follow TRAINED)."""
    code, out, _ = run(capsys, *sweep_args(tmp_path, "--vary", "lr=0.05,0.1",
                                           "--vary", "epochs=1,2", "--seeds", "0,1"))
    assert code == 0 and len(planned) == 1
    lines = out.splitlines()
    assert lines[0].startswith("plan: 8 points (lr 2 x num_epochs 2 x seeds 2)"), lines
    assert "predicted" in lines[0] and lines.index(TRAINED) > 0


def test_a_large_sweep_needs_yes(tmp_path, capsys, planned):
    """Before: 10,000 points started training at once, with no plan."""
    lrs = ",".join(f"{0.001 * i:g}" for i in range(1, 101))
    argv = sweep_args(tmp_path, "--vary", f"lr={lrs}", "--seeds", "0,1,2")
    code, out, err = run(capsys, *argv)
    assert code == 2 and out.startswith("plan: 300 points") and not planned
    assert "300 points is more than 200; pass --yes" in one_line(err)
    assert run(capsys, *argv, "--yes")[0] == 0 and len(planned) == 1


def test_a_sweep_predicted_to_take_hours_needs_yes(tmp_path, capsys, planned, monkeypatch):
    """Before: the cap counted points only, so 2 runs of the full profile on a CPU (hours by the
    recorded rates) started without a word."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # predict for a CPU
    argv = ["sweep", "--profile", "full", "--data-source", "synthetic",
            "--store", str(tmp_path / "s.jsonl"), "--vary", "lr=0.05,0.1", "--seeds", "0"]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out.startswith("plan: 2 points") and not planned
    assert re.search(r"the plan may take about [\d.]+ (h|days), more than 2 h; pass --yes",
                     one_line(err))
    assert run(capsys, *argv, "--yes")[0] == 0 and len(planned) == 1


# ---- issue 33: the command line's faults, part 2 ----------------------------------------------

def no_training(*args, **kwargs):
    raise AssertionError("the work started")


@pytest.fixture
def fake_train(monkeypatch):
    """`train` and the sweep's trainer replaced by FakeTrain: fast, and counted."""
    fake = FakeTrain()
    monkeypatch.setattr(cli, "train", lambda config, progress=True, data=None: fake(config))
    monkeypatch.setattr(sweeps, "default_train", fake)
    return fake


TRAIN = ["train", "--profile", "smoke", "--epochs", "1", "--data-source", "synthetic"]


def test_train_out_never_replaces_a_store(tmp_path, capsys, monkeypatch):
    """Before: `train --out store.jsonl` onto an 18-record sweep store replaced it with one
    result (exit 0)."""
    store = tmp_path / "store.jsonl"
    for seed in range(18):
        results.append(store, make_result(config={"seed": seed}).to_dict())
    before = store.read_bytes()
    monkeypatch.setattr(cli, "train", no_training)
    code, _, err = run(capsys, *TRAIN, "--out", store)
    assert code == 2 and one_line(err) and store.read_bytes() == before


def test_ddp_out_never_replaces_the_checkpoint(tmp_path, capsys, monkeypatch):
    """Before: `train --strategy ddp --checkpoint ck --out ck/last.pt` replaced the checkpoint
    with the result."""
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save({"epoch": 1}, ck / "last.pt")
    before = (ck / "last.pt").read_bytes()
    monkeypatch.setattr(cli, "_train_ddp", no_training)
    code, _, err = run(capsys, *TRAIN, "--strategy", "ddp", "--checkpoint", ck,
                       "--out", ck / "last.pt")
    assert code == 2 and one_line(err) and (ck / "last.pt").read_bytes() == before


class ClosedPipe:
    """A standard output whose reader leaves after `lines` lines (`| head -1`)."""

    def __init__(self, lines: int) -> None:
        self.left, self.text = lines, ""

    def write(self, text: str) -> int:
        if self.left <= 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.text += text
        self.left -= text.count("\n")
        return len(text)

    def flush(self) -> None:
        if self.left <= 0:
            raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_never_loses_a_result(tmp_path, monkeypatch, fake_train):
    """Before: `train --out r.json | true` was a BrokenPipeError traceback, exit 1, and r.json
    was never written (the summary was printed before the result was saved)."""
    monkeypatch.setattr(sys, "stdout", ClosedPipe(0))
    assert cli.main([*TRAIN, "--out", str(tmp_path / "r.json")]) == 0
    assert results.load_result(tmp_path / "r.json").status == "ok"


def test_a_sweep_into_a_closed_pipe_stores_every_point(tmp_path, monkeypatch, fake_train):
    """Before: `sweep ... | head -1` was a traceback after the first point; 1 of 3 points
    stored. The sweep goes on, every point is stored, and it exits quietly."""
    pipe = ClosedPipe(1)
    monkeypatch.setattr(sys, "stdout", pipe)
    store = tmp_path / "s.jsonl"
    assert cli.main(sweep_args(tmp_path, "--vary", "lr=0.05,0.1,0.2", "--seeds", "0")) == 0
    assert pipe.text.startswith("plan: 3 points") and len(fake_train.calls) == 3
    assert sorted(r.config["lr"] for r in load_store(store)) == [0.05, 0.1, 0.2]


@pytest.mark.slow
def test_a_real_closed_pipe_keeps_the_result_and_exits_quietly(tmp_path):
    """The same through a real pipe whose reader is gone before the first line."""
    out = tmp_path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "mgpu_lib", *TRAIN, "--width", "4",
                             "--train-limit", "64", "--test-limit", "32", "--out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.stdout.close()                    # `| true`: the reader is gone at once
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 0 and "Traceback" not in err and "Error" not in err, err
    assert results.load_result(out).status == "ok"


def test_bench_out_is_checked_before_the_benchmark_runs(tmp_path, capsys, monkeypatch):
    """Before: `bench --out notes.toml` (not a store) ran the whole benchmark, then said "not
    a results store"; `bench --out` onto a sweep store appended a foreign record."""
    monkeypatch.setattr(cli, "bench", no_training)
    notes, store = tmp_path / "notes.toml", tmp_path / "sweep.jsonl"
    notes.write_text("[tool]\nname = 'x'\n", encoding="utf-8")
    results.append(store, make_result().to_dict())
    for path in (notes, store):
        before = path.read_bytes()
        code, _, err = run(capsys, "bench", "--width", "4", "--out", path)
        assert code == 2 and one_line(err) and path.read_bytes() == before


@pytest.mark.parametrize("flag", [["--timeout", "5"], ["--nprocs", "2"]])
def test_ddp_flags_without_ddp_are_refused_alike(capsys, monkeypatch, flag):
    """Before: `--timeout 5` without `--strategy ddp` was ignored, where --nprocs was refused."""
    monkeypatch.setattr(cli, "train", no_training)
    code, _, err = run(capsys, *TRAIN, *flag)
    assert code == 2 and "need --strategy ddp" in one_line(err)


def test_a_value_or_seed_given_twice_is_swept_once(tmp_path, capsys, fake_train):
    """Before: `--vary lr=0.05,0.05 --seeds 0,0` planned and reported 2 points and stored 1."""
    code, out, _ = run(capsys, *sweep_args(tmp_path, "--vary", "lr=0.05,0.05", "--seeds", "0,0"))
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("plan: 1 point (lr 1 x seeds 1)")
    assert lines[-1] == f"1 point in {tmp_path / 's.jsonl'}" and len(fake_train.calls) == 1


@pytest.mark.parametrize("vary, says", [("devices=1,2", "2 devices requested"),
                                        ("nprocs=0,2", "does not split evenly over 2")])
def test_every_sweep_point_is_checked_before_the_first_trains(tmp_path, capsys, monkeypatch,
                                                              fake_train, vary, says):
    """Before: `--vary devices=1,2` on a CPU, or `nprocs=0,2` with an odd batch, trained the
    first point, then refused the next."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(capsys, *sweep_args(tmp_path, "--vary", vary, "--seeds", "0",
                                           "--batch-size", "33"))
    assert code == 2 and says in one_line(err) and fake_train.calls == []


# ---- the tools' command lines ---------------------------------------------------------------

def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  REPO / "tools" / f"{name}.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.parametrize("case, says", [
    ("missing", "no such file"), ("folder", "not a file (a folder?)"),
    ("text", "not a notebook"), ("json", "not a notebook"), ("timeout 0", "--timeout: must be"),
    ("timeout -1", "--timeout: must be"), ("slowest -1", "--slowest: must be")])
def test_execute_notebook_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch, case,
                                                        says):
    """Before: a missing path, a text file, a folder or a malformed notebook was a traceback,
    and --timeout 0 or -1 meant "no timeout"."""
    tool = load_tool("execute_notebook")
    monkeypatch.setattr(tool, "execute", no_training)
    good = tmp_path / "good.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), good)
    (tmp_path / "text.ipynb").write_text("print(1)\n", encoding="utf-8")
    (tmp_path / "json.ipynb").write_text('{"cells": 3}', encoding="utf-8")
    arg = {"missing": [tmp_path / "nope.ipynb"], "folder": [tmp_path],
           "text": [tmp_path / "text.ipynb"], "json": [tmp_path / "json.ipynb"]}.get(case)
    argv = [str(good), *map(str, arg)] if arg else [str(good), f"--{case.split()[0]}",
                                                     case.split()[1]]
    with pytest.raises(SystemExit) as e:
        tool.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in one_line(err)


@pytest.fixture
def book(tmp_path):
    """A copy of the config and three notebooks: what set_repository stamps."""
    for rel in ("_config.yml", "pyproject.toml", "chapters/01_network.ipynb",
                "chapters/02_devices.ipynb", "exercises/ex2_cpu_gpu_split.ipynb"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes((REPO / rel).read_bytes())
    return tmp_path


def files(root: Path) -> dict:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_set_repository_stamps_the_ref_the_pages_install(book, capsys):
    """Issue 32: a page installs the library it was written for, not whatever main holds:
    REPO_REF defaults to v<version>; another ref is stamped on request, a bad one refused."""
    tool = load_tool("set_repository")

    def setup_cell() -> str:
        nb = nbformat.read(book / "chapters" / "01_network.ipynb", as_version=4)
        return next(c.source for c in nb.cells if c.cell_type == "code")

    assert tool.main(["--ref", "0123abc"], root=book) == 0
    assert 'REPO_REF = "0123abc"' in setup_cell()
    assert tool.main([], root=book) == 0
    version = tool.default_ref(book)
    assert version.startswith("v") and f'REPO_REF = "{version}"' in setup_cell()
    before = files(book)
    assert tool.main(["--ref", "../main"], root=book) == 2
    assert files(book) == before and "expected a git tag" in capsys.readouterr().err


@pytest.mark.parametrize("fault", ["not json", "read-only", "bad url"])
def test_set_repository_stamps_all_or_nothing(book, capsys, monkeypatch, fault):
    """Before: one notebook read-only or not JSON: _config.yml and some notebooks rewritten,
    then a traceback; `https://github.com/../..` was accepted."""
    tool = load_tool("set_repository")
    victim = book / "chapters" / "02_devices.ipynb"
    if fault == "not json":
        victim.write_text("{ not json", encoding="utf-8")
    if fault == "read-only":          # as root, chmod would not stop a write: os.access says so
        real = os.access
        monkeypatch.setattr(tool.os, "access",
                            lambda p, mode: False if Path(p) == victim else real(p, mode))
    url = "https://github.com/../.." if fault == "bad url" else "https://github.com/you/fork"
    before = files(book)
    assert tool.main([url], root=book) == 2
    assert one_line(capsys.readouterr().err).startswith("set_repository: error:")
    assert files(book) == before
    assert tool.main(["https://github.com/you/fork"], root=book) == (2 if fault != "bad url"
                                                                     else 0)


# ---- issue 39: outputs, streams, bounds, signals ----------------------------------------------

def test_train_out_never_replaces_a_notebook(tmp_path, capsys, monkeypatch):
    """Before (issue 39): `train --out nb.ipynb` replaced a chapter notebook with the result."""
    nb = tmp_path / "01_network.ipynb"
    nb.write_bytes((REPO / "chapters" / "01_network.ipynb").read_bytes())
    before = nb.read_bytes()
    monkeypatch.setattr(cli, "train", no_training)
    code, _, err = run(capsys, *TRAIN, "--out", nb)
    assert code == 2 and one_line(err) and nb.read_bytes() == before


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_sigterm_to_a_plain_run_says_terminated(tmp_path, command):
    """Before (issue 39): plain `train` and `sweep` died on SIGTERM without a word."""
    argv = [*TRAIN, "--out", tmp_path / "r.json"] if command == "train" else \
        ["sweep", *TRAIN[1:], "--vary", "lr=0.1", "--seeds", "0", "--store", tmp_path / "s.jsonl"]
    code = ("import os, signal, sys, time\nfrom mgpu_lib.book import cli, sweep\n"
            "def work(*a, **k):\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n"
            "cli.train = sweep.default_train = work\n"
            f"sys.exit(cli.main({[str(a) for a in argv]!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 143, proc.stderr
    assert "terminated (SIGTERM); stopped" in one_line(proc.stderr.splitlines()[-1])
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv", [["train", "--strategy", "ddp", "--timeout", "0"],
                                  ["trace", "--timeout", "inf"],
                                  ["sweep", "--vary", "lr=0.1", "--store", "s.jsonl",
                                   "--seeds", "-1"]])
def test_numbers_out_of_range_are_refused_when_parsed(capsys, monkeypatch, argv):
    monkeypatch.setattr(cli, "train", no_training)
    monkeypatch.setattr(cli, "launch", no_training)
    code, _, err = run(capsys, *argv)
    assert code == 2 and argv[-2] in one_line(err)


def test_sweep_seeds_take_ranges():
    assert sweeps.parse_seeds("0-3,7") == [0, 1, 2, 3, 7]


@pytest.mark.parametrize("argv, says", [
    (["--width", "100000"], "width 100,000 at batch"),
    (["--batch-size", "100000000"], "batch 100,000,000 needs about"),
])
def test_bench_is_bounded_like_train(capsys, monkeypatch, argv, says):
    """Before (issue 39): `bench --width 100000` and `--batch-size 10^8` were allocation
    tracebacks; the bound's message named the width when the batch was at fault."""
    from mgpu_lib.lab import bench as benches
    monkeypatch.setattr(benches, "measure", no_training)
    code, _, err = run(capsys, "bench", "--device", "cpu", *argv)
    assert code == 2 and says in one_line(err)


def test_train_names_the_batch_when_the_batch_is_too_big(capsys, monkeypatch):
    monkeypatch.setattr(cli, "train", no_training)
    code, _, err = run(capsys, *TRAIN, "--batch-size", "100000000")
    assert code == 2 and "largest batch that fits width" in one_line(err)


def test_the_bound_counts_the_process_address_space_limit(capsys, monkeypatch):
    """Before (issue 39): under `ulimit -v 4000000`, `train --width 300 --batch-size 64` passed
    the bound (the machine's memory) and died allocating, a traceback."""
    from types import SimpleNamespace
    from mgpu_lib.lab import bench as benches
    if not hasattr(benches.psutil, "RLIMIT_AS"):
        pytest.skip("no address-space limits on this platform")
    fake = SimpleNamespace(rlimit=lambda which: (4_000_000 * 1024, 4_000_000 * 1024),
                           memory_info=lambda: SimpleNamespace(vms=3_500_000_000))
    monkeypatch.setattr(benches.psutil, "Process", lambda: fake)
    monkeypatch.setattr(benches, "num_gpus", lambda: 0)
    monkeypatch.setattr(cli, "train", no_training)
    code, _, err = run(capsys, *TRAIN, "--width", "300", "--batch-size", "64")
    assert code == 2 and "width 300 at batch 64 needs about" in one_line(err)


@pytest.mark.parametrize("case, says", [
    ("foreign", "holds run records"), ("notes", "drop.jsonl"),
    ("read-only", "permission denied"), ("width 100000", "width 100,000 at batch 256")])
def test_record_drop_refuses_in_one_line(tmp_path, capsys, monkeypatch, case, says):
    """Before (issue 39): a foreign store, a notes file or a read-only --out was a ResultsError
    traceback, and `--width 100000` tried to allocate 40 GB."""
    if case == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    tool = load_tool("record_drop")
    monkeypatch.setattr(tool, "run_seed", no_training)
    out = tmp_path / "drop.jsonl"
    argv = ["--out", str(out)]
    if case == "foreign":
        results.append(out, make_result().to_dict())
    elif case == "notes":
        out.write_text("my notes\n", encoding="utf-8")
    elif case != "read-only":
        argv += [f"--{case.split()[0]}", case.split()[1]]
    assert _refused(tool, argv, tmp_path if case == "read-only" else None, capsys, says)


def _refused(tool, argv: list, read_only, capsys, says: str) -> bool:
    """Whether `tool.main(argv)` exits 2 with one line holding `says` (`read_only`: a folder
    made read-only meanwhile)."""
    if read_only:
        read_only.chmod(0o500)
    try:
        with pytest.raises(SystemExit) as e:
            tool.main(argv)
    finally:
        if read_only:
            read_only.chmod(0o700)
    return e.value.code == 2 and says in one_line(capsys.readouterr().err)


def test_record_accuracy_plans_and_caps_its_seeds(tmp_path, capsys, monkeypatch):
    """Before (issue 39): `record_accuracy --seeds 0-200` trained 402 points, no plan, no cap."""
    tool = load_tool("record_accuracy")
    monkeypatch.setattr(tool, "sweep", no_training)
    with pytest.raises(SystemExit) as e:
        tool.main(["--seeds", "0-200", "--store", str(tmp_path / "a.jsonl")])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out.startswith("plan: 402 points")
    assert "402 points is more than 200; pass --yes" in one_line(err)


def test_ex1_plan_refuses_a_folder_where_its_store_goes(tmp_path, monkeypatch):
    """Before (issue 39): `ex1_plan` where runs/ex1_smoke.jsonl is a folder was an
    IsADirectoryError traceback from its unlink."""
    from mgpu_lib.book import pages
    from mgpu_lib.book.profiles import get_profile
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "ex1_smoke.jsonl").mkdir(parents=True)
    with pytest.raises(results.ResultsError) as e:
        pages.ex1_plan(get_profile("smoke"))
    one_line(e)
    assert (tmp_path / "runs" / "ex1_smoke.jsonl").is_dir()
    (tmp_path / "runs" / "ex1_smoke.jsonl").rmdir()
    results.append(tmp_path / "runs" / "ex1_smoke.jsonl", make_result().to_dict())
    assert not pages.ex1_plan(get_profile("smoke")).runs.exists()     # its own store: emptied


def _notebook(path: Path, *sources: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]),
                   path)
    return path


class _FailingClient:
    """NotebookClient's stand-in: cell 1 starts, then fails (or SIGTERM arrives)."""
    sigterm = False

    def __init__(self, nb, on_cell_execute, **kw):
        self.nb, self.started = nb, on_cell_execute

    def execute(self, **kwargs):
        from nbclient.exceptions import CellExecutionError
        self.started(cell=self.nb.cells[1], cell_index=1)
        if self.sigterm:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        raise CellExecutionError("Traceback ...\nZeroDivisionError", "ZeroDivisionError",
                                 "division by zero\nmore")


def test_execute_notebook_says_the_failing_cell_in_one_line_and_keeps_no_copy(tmp_path, capsys,
                                                                               monkeypatch):
    """Before (issue 39): a failing cell was a traceback, and its unexecuted copy stayed in
    --out."""
    tool = load_tool("execute_notebook")
    monkeypatch.setattr(tool, "NotebookClient", _FailingClient)
    nb = _notebook(tmp_path / "book" / "01_page.ipynb", "x = 1", "1 / 0")
    with pytest.raises(SystemExit) as e:
        tool.main([str(nb), "--out", str(tmp_path / "out")])
    assert one_line(str(e.value)) == ("01_page.ipynb: cell 1 ('1 / 0') failed under profile cpu: "
                                      "ZeroDivisionError: division by zero")
    assert os.listdir(tmp_path / "out") == []


def test_execute_notebook_gives_the_profile_to_the_kernel_not_to_this_process(tmp_path,
                                                                              monkeypatch):
    """Issue 50: `_run` set MGPU_PROFILE=cpu in the test session itself, so every notebook
    kernel started after this test ran under `cpu` (no synthetic data without a data folder)."""
    tool = load_tool("execute_notebook")
    seen = {}

    class Client(_FailingClient):
        def execute(self, **kwargs):
            seen.update(kwargs.get("env", {}))
            return super().execute()

    monkeypatch.setattr(tool, "NotebookClient", Client)
    monkeypatch.setenv("MGPU_PROFILE", "smoke")
    nb = _notebook(tmp_path / "book" / "01_page.ipynb", "x = 1", "1 / 0")
    with pytest.raises(SystemExit):
        tool.main([str(nb), "--profile", "cpu", "--out", str(tmp_path / "out")])
    assert seen["MGPU_PROFILE"] == "cpu" and os.environ["MGPU_PROFILE"] == "smoke"


def test_execute_notebook_removes_its_copy_on_sigterm(tmp_path):
    """Before (issue 39): SIGTERM left the unexecuted copy in --out."""
    nb = _notebook(tmp_path / "book" / "01_page.ipynb", "x = 1", "import time; time.sleep(60)")
    code = ("import importlib.util, sys\n"
            f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
            "import test_cli\n"
            f"spec = importlib.util.spec_from_file_location('t', {str(REPO / 'tools' / 'execute_notebook.py')!r})\n"
            "tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool)\n"
            "test_cli._FailingClient.sigterm = True\n"
            "tool.NotebookClient = test_cli._FailingClient\n"
            f"tool.main([{str(nb)!r}, '--out', {str(tmp_path / 'out')!r}])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 143, proc.stderr
    assert "terminated (SIGTERM); stopped" in one_line(proc.stderr)
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("case, says", [("same name", "would share one copy"),
                                        ("read-only", "permission denied"),
                                        ("timeout 0", "--timeout")])
def test_execute_notebook_checks_out_before_running(tmp_path, capsys, monkeypatch, case, says):
    """Before (issue 39): a read-only --out was a traceback, and two notebooks of one name
    overwrote each other's copy."""
    if case == "read-only" and os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    tool = load_tool("execute_notebook")
    monkeypatch.setattr(tool, "execute", no_training)
    a = _notebook(tmp_path / "chapters" / "x.ipynb", "1")
    b = _notebook(tmp_path / "exercises" / "x.ipynb", "2")
    out = tmp_path / "out"
    out.mkdir()
    argv = {"same name": [str(a), str(b)], "read-only": [str(a)],
            "timeout 0": [str(a), "--timeout", "0"]}[case] + ["--out", str(out)]
    assert _refused(tool, argv, out if case == "read-only" else None, capsys, says)


def test_gpu_check_dry_run_says_a_foreign_out(tmp_path, capsys, monkeypatch):
    """Before (issue 39): `gpu_check --dry-run --out <a sweep store>` planned without a word of
    the store the real run would refuse."""
    spec = importlib.util.spec_from_file_location("gpu_check_dry", REPO / "tools" / "gpu_check.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool          # dataclasses look their module up there
    spec.loader.exec_module(tool)
    store = tmp_path / "sweep.jsonl"
    results.append(store, make_result().to_dict())
    code = tool.main(["--dry-run", "--spec", "H200 SXM", "--profile", "smoke", "--out", str(store)])
    out, err = capsys.readouterr()
    assert code == 2 and "predicted total" in out and "holds run records" in one_line(err)
    assert tool.main(["--dry-run", "--spec", "H200 SXM", "--profile", "smoke",
                      "--out", str(tmp_path / "new.jsonl")]) == 0
    assert not (tmp_path / "new.jsonl").exists()                 # a dry run makes nothing
