"""tools/gpu_check.py on this machine: every stage reports, every record is well-formed, a failed
stage does not stop the next ones, and the plan fits its budget. On a CPU the CUDA stages are
recorded as skipped; under smoke a tiny CPU calibration runs, so something real is measured.
The GPU is hidden from the script (CUDA_VISIBLE_DEVICES=""), so it behaves the same everywhere;
on a GPU, run the script itself (see its docstring)."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from helpers import make_result, one_line

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "gpu_check.py"
STAGES = ("facts", "overheads", "cuda_tests", "full_run", "accuracy_drop", "bench",
          "calibration", "exercise2", "exercise1")
KEYS = {"schema", "mgpu_lib", "config", "stage", "status", "seconds", "device", "hardware", "torch", "profile", "figures"}
STAGE_LINE = re.compile(rf"^\[(\d)/{len(STAGES)}\] (\w+): (ok|failed|skipped) in [\d.]+ s")
# What the GPU machine lacks: importing the script must not need any of them.
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torchvision", "ipywidgets", "IPython", "matplotlib"):
            raise ImportError(f"{name} is blocked for this test")
sys.meta_path.insert(0, Block())
sys.argv = [sys.argv[1]] + sys.argv[2:]
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run(*args: str, block: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable] + (["-c", BLOCK] if block else []) + [str(SCRIPT), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=REPO, env=env)


def stage_lines(stdout: str) -> list:
    return [m.groups() for m in map(STAGE_LINE.match, stdout.splitlines()) if m]


def check_records(path: Path) -> dict:
    """Every record well-formed; returns them by stage."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["stage"] for r in records] == list(STAGES)
    for r in records:
        assert KEYS <= set(r), r["stage"]
        assert r["status"] in ("ok", "failed", "skipped") and r["seconds"] >= 0
        assert r["profile"] == "smoke" and r["torch"] == torch.__version__
        if r["status"] == "skipped":
            assert r["reason"]
        if r["stage"] not in ("facts", "calibration"):
            assert (r["status"], r["reason"]) == ("skipped", "no CUDA device")
    return {r["stage"]: r for r in records}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "gpu.jsonl"
    return run("--profile", "smoke", "--out", str(out)), out


@pytest.mark.slow
def test_smoke_run_reports_every_stage(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = stage_lines(proc.stdout)
    assert [(i, name) for i, name, _ in lines] == [(str(k), s) for k, s in enumerate(STAGES, 1)]
    records = check_records(out)
    facts = records["facts"]
    assert facts["status"] == "ok" and facts["figures"]["precision_auto"] in ("bf16", "fp32")
    cal = records["calibration"]
    assert cal["status"] == "ok"
    assert cal["figures"]["images_per_second"] > 0 and len(cal["figures"]["rows"]) >= 2


def load_tool():
    """The script as a module, to plant failures in it (the product has no flag for that)."""
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool          # dataclasses look their module up there
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.slow
def test_a_failed_stage_is_recorded_and_the_next_ones_still_run(tmp_path, monkeypatch, capsys):
    tool = load_tool()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def planted(check):
        raise RuntimeError("planted failure\nacross two lines")
    monkeypatch.setattr(tool, "STAGES", tuple(replace(s, run=planted) if s.name == "facts"
                                              else s for s in tool.STAGES))
    out = tmp_path / "gpu.jsonl"
    assert tool.main(["--profile", "smoke", "--out", str(out)]) == 1
    assert len(stage_lines(capsys.readouterr().out)) == len(STAGES)
    records = check_records(out)
    facts = records["facts"]
    assert facts["status"] == "failed"
    assert "planted failure" in facts["error"] and "\n" not in facts["error"]
    assert records["calibration"]["status"] == "ok"         # a later stage still ran


def test_the_budget_counts_from_the_call_or_from_when_the_caller_says(tmp_path, monkeypatch,
                                                                      capsys):
    """Called from a long-lived process (pytest), main() counts from its call; CI once failed
    when the budget counted from pytest's own start, 330 s earlier, and skipped every stage."""
    tool = load_tool()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(tool, "STAGES", tuple(s for s in tool.STAGES if s.name == "facts"))
    out = tmp_path / "gpu.jsonl"
    assert tool.main(["--profile", "smoke", "--out", str(out), "--budget-s", "60"],
                     started=time.time() - 3600) == 0
    first = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert (first["status"], first["reason"]) == ("skipped", "budget")
    out.unlink()
    assert tool.main(["--profile", "smoke", "--out", str(out), "--budget-s", "60"]) == 0
    assert json.loads(out.read_text(encoding="utf-8").splitlines()[0])["status"] == "ok"


@pytest.mark.slow
def test_dry_run_plans_within_the_budget_and_needs_no_optional_package(tmp_path):
    out = tmp_path / "never.jsonl"
    for args in (["--profile", "smoke"], ["--profile", "full", "--spec", "H200 SXM"]):
        proc = run("--dry-run", "--budget-s", "270", "--out", str(out), *args, block=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        total = float(re.search(r"predicted total: ([\d.]+) s of 270 s", proc.stdout).group(1))
        assert 0 < total <= 270
        assert len(re.findall(rf"^plan \[\d/{len(STAGES)}\]", proc.stdout, re.M)) == len(STAGES)
    assert "full_run: " in proc.stdout and "no CUDA" not in proc.stdout   # the H200 plan
    assert not out.exists()


@pytest.mark.parametrize("bad", ["-5", "0", "nan", "inf", "soon"])
def test_a_bad_budget_is_one_line_and_exit_2(bad, capsys):
    """The CLI's front end refuses it, with the settings' own check (a positive number)."""
    with pytest.raises(SystemExit) as e:
        load_tool().main(["--dry-run", "--budget-s", bad])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpu_check: error: argument --budget-s: must be a positive number, got '{bad}'"]


@pytest.mark.parametrize("argv, says", [(["--only", "facts,magic"], "unknown stage(s) magic"),
                                        (["--profile", "huge"], "argument --profile: invalid"),
                                        (["--frobnicate"], "unrecognized arguments")])
def test_every_bad_argument_is_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        load_tool().main(["--dry-run", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in one_line(err) and err.startswith("gpu_check: error:")


def test_a_bad_profile_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("MGPU_PROFILE", "bogus")
    assert load_tool().main(["--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bogus" in err[0]


def test_without_out_the_records_never_go_into_the_package(tmp_path, monkeypatch):
    tool = load_tool()
    monkeypatch.chdir(tmp_path)
    out = tool.make_check(tool.parse_args(["--profile", "smoke"])).out.resolve()
    assert out.parent == tmp_path / "runs"
    assert REPO / "mgpu_lib" not in out.parents


def test_the_tool_and_the_pages_share_one_predictor():
    """Loading the tool leaves sys.path alone (it imports the installed package), and the step
    time comes from mgpu_lib.perf.runtime."""
    path = list(sys.path)
    tool = load_tool()
    assert sys.path == path
    from mgpu_lib.perf import runtime
    from mgpu_lib.perf.scaling import DEVICES
    check = tool.make_check(tool.parse_args(["--profile", "smoke", "--spec", "T4"]))
    assert isinstance(check.speed, runtime.StepModel)
    assert check.speed.step_s(256) == pytest.approx(
        runtime.step_seconds(DEVICES["T4"], 256, check.profile.width))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX (Windows has none)")
def test_a_fifo_as_the_record_store_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Before: a FIFO or a device passed the first check, and stage 1's append then raised a
    traceback (rc 1)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert load_tool().main(["--profile", "smoke", "--only", "facts", "--out", str(fifo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_check: error:") and "FIFO" in err[0]


@pytest.mark.parametrize("what", ["notes", "sweep store", "ex1 store notes"])
def test_a_store_that_is_not_one_of_its_kind_is_refused_before_any_stage(tmp_path, monkeypatch,
                                                                          capsys, what):
    """Before: `--out notes.txt` ran a stage, then died with a ResultsError traceback."""
    from mgpu_lib.book import store
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.jsonl"
    if what == "notes":
        out.write_text("my notes\n", encoding="utf-8")
    elif what == "sweep store":
        store.append(out, make_result().to_dict())
    else:                                   # exercise 1's store beside the records
        (tmp_path / "ex1_cpu.jsonl").write_text("my notes\n", encoding="utf-8")
    tool = load_tool()
    monkeypatch.setattr(tool, "STAGES", tuple(replace(s, run=lambda c: 1 / 0)
                                              for s in tool.STAGES))
    assert tool.main(["--profile", "smoke", "--only", "facts", "--out", str(out)]) == 2
    out_, err = capsys.readouterr()
    assert one_line(err).startswith("gpu_check: error:") and f"[1/{len(STAGES)}]" not in out_
