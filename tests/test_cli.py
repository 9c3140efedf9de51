"""The command line, in-process: flags generated from TrainConfig's declarations, and every
user error one line with exit code 2 (issues 23 and 26). Nothing here trains or downloads."""
import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
import torch

from mgpu_lib.book import cli as cli
from mgpu_lib.data import DataError, load_raw
from mgpu_lib.config import NONNEGATIVE_NUMBER, declared, flag_name, setting
from mgpu_lib.book.sweep import MAX_POINTS, expand
from mgpu_lib.training import TrainConfig

REPO = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `python -m mgpu_lib *argv`, run in this process."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:          # argparse refusals
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def planned(monkeypatch):
    """`sweep` replaced by a recorder: what the command line would have swept."""
    calls = []

    def fake(base, vary, *, seeds, store, log=None):
        calls.append(dict(base=base, vary=vary, seeds=seeds))
        return []
    monkeypatch.setattr(cli, "sweep", fake)
    return calls


def sweep_args(tmp_path, *extra):
    return ["sweep", "--profile", "smoke", "--data-source", "synthetic",
            "--store", str(tmp_path / "s.jsonl"), *extra]


# ---- issue 23: one declaration per setting -----------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WithMomentum(TrainConfig):
    """TrainConfig plus one setting: the one edit a new setting takes."""
    momentum: float = setting(0.0, NONNEGATIVE_NUMBER, "SGD momentum")


def test_a_new_field_is_a_validated_flag_and_a_vary_key(capsys):
    parser = cli.build_parser(WithMomentum)
    args = parser.parse_args(["train", "--profile", "smoke", "--momentum", "0.9"])
    config = cli.config_from_args(args)
    assert isinstance(config, WithMomentum) and config.momentum == 0.9
    assert config.width == 8                           # the profile's, not overridden
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["train", "--momentum", "-1"])
    assert e.value.code == 2
    assert "argument --momentum: must be a finite number >= 0, got '-1'" in one_line(
        capsys.readouterr().err)
    with pytest.raises(ValueError, match="momentum must be a finite number >= 0"):
        WithMomentum(momentum=float("nan"))
    args = parser.parse_args(["sweep", "--vary", "momentum=0,0.9", "--store", "x.jsonl"])
    assert args.vary == [("momentum", [0.0, 0.9])]


def test_every_config_flag_comes_from_its_field():
    flags = {a.dest: a for a in subcommand("train")._actions}
    for f in declared(TrainConfig):
        if f.metadata["cli"]:
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
    """Every `python -m mgpu_lib ...` command in the README, the notebooks and the docstrings."""
    texts = [p.read_text() for p in [REPO / "README.md", *REPO.glob("mgpu_lib/*.py")]]
    for nb in [*REPO.glob("chapters/*.ipynb"), *REPO.glob("exercises/*.ipynb")]:
        texts += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"]]
    for text in texts:
        text = text.replace("\\\n", " ")
        for m in re.finditer(r"-m mgpu_lib ((?:train|sweep|worker|bench)"
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
    ("seed=1,2", "use --seeds"),
    ("seeds=1,2", "use --seeds"),
    ("momentum=0.9", "unknown key 'momentum'; known keys: devices, batch_size, lr"),
    ("lr=fast", "lr: must be a positive number, got 'fast'"),
    ("nprocs=-1", "nprocs: must be an integer >= 0"),
    ("fast=maybe", "fast: must be true or false"),
])
def test_a_bad_vary_key_or_value_is_one_line(tmp_path, capsys, planned, vary, message):
    """Before: seed=1,2 was a TypeError traceback; momentum said 'must be a positive integer'."""
    code, _, err = run(capsys, *sweep_args(tmp_path, "--vary", vary))
    assert code == 2 and message in one_line(err) and not planned


@pytest.mark.parametrize("argv, message", [
    (["train", "--seed", "1e23"], "argument --seed: must be an integer from 0 to 2**63 - 1"),
    (["train", "--seed", str(10 ** 23)], "argument --seed: must be an integer"),
    (["train", "--seed", "-1"], "argument --seed: must be an integer"),
    (["train", "--data-source", "web"], "argument --data-source: must be one of auto, local"),
])
def test_bad_flag_values_name_the_flag(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in one_line(err)


def test_bad_seeds_name_the_flag(tmp_path, capsys, planned):
    """Before: --seeds 10**23 trained, then died with 'Overflow when unpacking long long'."""
    code, _, err = run(capsys, *sweep_args(tmp_path, "--vary", "lr=0.1",
                                           "--seeds", f"0,{10 ** 23}"))
    assert code == 2 and "--seeds: must be an integer from 0" in one_line(err) and not planned


def test_sweep_refuses_out(tmp_path, capsys, planned):
    """Before: sweep --out was accepted and ignored."""
    code, _, err = run(capsys, *sweep_args(tmp_path, "--vary", "lr=0.1",
                                           "--out", str(tmp_path / "r.json")))
    assert code == 2 and "sweep has no --out" in one_line(err) and not planned


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
    code, out, _ = run(capsys, *sweep_args(tmp_path, "--vary", "lr=0.05,0.1",
                                           "--vary", "epochs=1,2", "--seeds", "0,1"))
    assert code == 0 and len(planned) == 1
    plan = out.splitlines()[0]
    assert plan.startswith("plan: 8 points (lr 2 x num_epochs 2 x seeds 2)"), plan
    assert "predicted" in plan


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
    assert re.search(r"predicted to take up to [\d.]+ h, more than 2 h; pass --yes",
                     one_line(err))
    assert run(capsys, *argv, "--yes")[0] == 0 and len(planned) == 1


def test_a_huge_sweep_is_refused_before_its_list_is_built(tmp_path, capsys, planned):
    """Before: 10**7 points hung for 40 s while the list was built."""
    values = ",".join(str(i) for i in range(1, 101))
    argv = sweep_args(tmp_path, "--seeds", ",".join(str(s) for s in range(10)), "--yes",
                      "--vary", f"batch_size={values}", "--vary", f"width={values}",
                      "--vary", f"test_limit={values}")
    t0 = time.perf_counter()
    code, _, err = run(capsys, *argv)
    assert code == 2 and "10,000,000 points is more than a sweep can hold" in one_line(err)
    assert time.perf_counter() - t0 < 5 and not planned
    with pytest.raises(ValueError, match="more than a sweep can hold"):
        expand(TrainConfig(), {"lr": [0.1] * (MAX_POINTS + 1)}, seeds=(0,))
