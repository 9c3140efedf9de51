"""tools/gpu_check.py on a machine without a GPU: the plan fits 8 minutes, every stage reports,
every record carries the one header, and bad input stops it in one line before any stage. The
GPU is hidden from the script, so it behaves the same everywhere; the stages' own code is run on
the CPU at a tiny size (slow), and on a GPU the script itself runs (see its docstring)."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import check_header, make_result, one_line

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "gpu_check.py"
STAGES = ("facts", "cuda_tests", "bench", "compile", "full_run", "drop", "exercise2")
PLAN_LINE = re.compile(r"^plan \[(\d)/7\] (\w+): (?:(\d+) s|skipped \((.+)\))", re.M)
# What a GPU machine may lack: importing the script and planning must need none of them.
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torchvision", "ipywidgets", "IPython", "matplotlib"):
            raise ImportError(f"{name} is blocked for this test")
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def load_tool():
    """The script as a module, to call main() and plant failures in it."""
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool          # dataclasses look their module up there
    spec.loader.exec_module(tool)
    return tool


@pytest.fixture
def tool(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return load_tool()


def plan(stdout: str) -> dict:
    """stage -> (seconds, None) or (None, why it is skipped), from --dry-run's lines."""
    rows = {name: (int(t) if t else None, why) for _, name, t, why in PLAN_LINE.findall(stdout)}
    assert list(rows) == list(STAGES), stdout
    total = int(re.search(r"^predicted total: (\d+) s of (\d+) s budget$", stdout, re.M)[1])
    assert total == sum(t for t, _ in rows.values() if t)
    return rows


def test_the_dry_run_plans_every_stage_of_an_h200_within_8_minutes(tool, tmp_path, capsys):
    out = tmp_path / "never.jsonl"
    assert tool.main(["--dry-run", "--spec", "H200 SXM", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    rows = plan(stdout)
    assert all(t and not why for t, why in rows.values()), stdout
    assert sum(t for t, _ in rows.values()) <= 480
    assert "(10 of 10 epochs)" in stdout and "(1 of 3 seeds)" in stdout
    assert not out.exists() and not list(tmp_path.iterdir())      # a dry run makes nothing


def test_a_smaller_budget_skips_what_does_not_fit_and_says_so(tool, capsys):
    assert tool.main(["--dry-run", "--spec", "H200 SXM", "--budget-s", "200"]) == 0
    rows = plan(capsys.readouterr().out)
    assert sum(t for t, _ in rows.values() if t) <= 200
    assert rows["drop"][1].startswith("budget: estimated 150 s")
    assert rows["exercise2"][0] is None and rows["facts"][0] == 5


def test_without_cuda_every_cuda_stage_is_skipped_and_every_record_has_the_header(tool, tmp_path,
                                                                                 capsys):
    from mgpu_lib.book import store
    out = tmp_path / "gpu.jsonl"
    assert tool.main(["--out", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.split("] ")[1].split(":")[0] for line in lines] == list(STAGES)
    records = store.read(out)
    assert [r["stage"] for r in records] == list(STAGES)
    for r in records:
        check_header(r, r["stage"])       # the shipped-record header test's oracle
        assert store.record_kind(r) == "gpu_check stage" and r["profile"] == "full"
        assert r["torch"] == torch.__version__ and r["seconds"] >= 0
    assert records[0]["status"] == "ok" and records[0]["figures"]["gpus"] == 0
    assert {(r["status"], r["reason"]) for r in records[1:]} == {("skipped", "no CUDA device")}
    assert not list(tmp_path.glob("[!.]*_*")) and not (tmp_path / "precision.json").exists()


def test_a_failed_stage_is_recorded_in_one_line_and_the_next_ones_still_run(tool, tmp_path,
                                                                           monkeypatch):
    def planted(run):
        raise RuntimeError("planted failure\nacross two lines")
    monkeypatch.setitem(tool.RUNS, "facts", planted)
    out = tmp_path / "gpu.jsonl"
    assert tool.main(["--out", str(out)]) == 1
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(STAGES)
    assert records[0]["status"] == "failed"
    assert one_line(records[0]["error"]) == "RuntimeError: planted failure across two lines"


def test_the_budget_counts_from_when_the_caller_says(tool, tmp_path):
    """Called from a long-lived process (pytest), main() counts from its call unless told."""
    out = tmp_path / "gpu.jsonl"
    assert tool.main(["--out", str(out), "--budget-s", "60"], started=time.time() - 3600) == 0
    facts = json.loads(out.read_text(encoding="utf-8").splitlines()[0])
    assert facts["status"] == "skipped" and facts["reason"].startswith("budget: estimated 5 s")


@pytest.mark.parametrize("bad", ["-5", "0", "nan", "inf", "soon"])
def test_a_bad_budget_is_one_line_and_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as e:
        load_tool().main(["--dry-run", "--budget-s", bad])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpu_check: error: argument --budget-s: must be a positive number, got '{bad}'"]


@pytest.mark.parametrize("argv, says", [(["--profile", "huge"], "argument --profile: invalid"),
                                        (["--spec", "H9000"], "argument --spec: invalid"),
                                        (["--frobnicate"], "unrecognized arguments")])
def test_every_bad_argument_is_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        load_tool().main(["--dry-run", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in one_line(err) and err.startswith("gpu_check: error:")


@pytest.mark.parametrize("what", ["notes", "a sweep store", "a folder", "drop store notes"])
def test_every_output_is_checked_before_any_stage(tool, tmp_path, monkeypatch, capsys, what):
    """--out, and the stores beside it, that the run would refuse stop it before stage 1."""
    from mgpu_lib.book import store
    out = tmp_path / "gpu.jsonl"
    if what == "notes":
        out.write_text("my notes\n", encoding="utf-8")
    elif what == "a sweep store":
        store.append(out, make_result().to_dict())
    elif what == "a folder":
        out.mkdir()
    else:
        (tmp_path / "drop_cpu.jsonl").write_text("my notes\n", encoding="utf-8")
    monkeypatch.setattr(tool, "RUNS", {name: lambda run: 1 / 0 for name in STAGES})
    assert tool.main(["--out", str(out)]) == 2
    stdout, err = capsys.readouterr()
    assert one_line(err).startswith("gpu_check: error:") and "[1/7]" not in stdout
    if what == "notes":
        assert out.read_text(encoding="utf-8") == "my notes\n"


def test_without_out_the_records_never_go_into_the_package(tool, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert tool.main(["--budget-s", "1"], started=time.time() - 10) == 0
    assert list((tmp_path / "runs").glob("*.jsonl")) == [tmp_path / "runs" / "gpu_cpu.jsonl"]


def test_a_compile_that_does_not_finish_in_its_time_is_stopped_and_skipped(tool, tmp_path,
                                                                          monkeypatch):
    """The child is killed at the stage's estimate (here 1 s: before torch is even imported)."""
    monkeypatch.setitem(tool.ESTIMATE_S, "compile", 1)
    run = tool.Run(tool.parse_args([]), tool.get_profile("smoke"), torch.device("cpu"), True,
                   "cpu", tmp_path / "gpu.jsonl", "cpu")
    with pytest.raises(tool.Stop) as e:
        tool.compiled(run)
    assert e.value.status == "skipped" and str(e.value) == "did not finish within 1 s"
    # the CUDA-graph step: not run either, or the library has none (and the record says so)
    assert e.value.figures["modes"] == {} and any("graph" in n for n in e.value.figures["not_run"])


@pytest.mark.slow
def test_the_dry_run_needs_no_optional_package(tmp_path):
    cmd = [sys.executable, "-c", BLOCK, str(SCRIPT), "--dry-run", "--spec", "H100 SXM5",
           "--out", str(tmp_path / "never.jsonl")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(t for t, _ in plan(proc.stdout).values())


@pytest.mark.slow
def test_the_gpu_stages_run_on_the_cpu_at_a_tiny_size(tool, tmp_path, monkeypatch):
    """bench, the chapter's run, the drop and exercise 2 on the CPU, so that their code has run
    before a GPU's few minutes: records in the stores beside --out, each with the header."""
    from mgpu_lib.book import store
    monkeypatch.delitem(tool.PRECISIONS, "fp16")              # fp16 autocast is CUDA's only
    profile = tool.get_profile("smoke").replace(width=4, batch_size=16, num_epochs=1, seeds=(0,),
                                                train_limit=160, test_limit=80,
                                                data_source="synthetic")
    run = tool.Run(tool.parse_args(["--budget-s", "100000"]), profile, torch.device("cpu"),
                   True, "cpu", tmp_path / "gpu.jsonl", "cpu")
    for name in ("bench", "full_run", "drop", "exercise2"):
        figures, line = tool.RUNS[name](run)
        assert json.dumps(figures) and "\n" not in line, name
    [row] = json.loads((tmp_path / "precision.json").read_text(encoding="utf-8"))
    assert set(row["images_per_s"]) == {"fp32", "bf16"} and row["width"] == 4
    runs, drops = store.read(tmp_path / "run_cpu.jsonl"), store.read(tmp_path / "drop_cpu.jsonl")
    assert [r["config"]["fast"] for r in runs] == [True, False] and len(drops) == 5
    for i, rec in enumerate(runs + drops):
        check_header(rec, f"record {i}")
    # the compile child's protocol, with a setting that needs no compiler (not channels_last: at
    # width 4 on one CPU thread oneDNN's backward corrupts the heap; see channels_last_safe)
    out, code = tool.child([sys.executable, "-c", tool.CHILD, "4", "16", "cudnn_benchmark"], 300)
    assert code == 0 and json.loads(out.splitlines()[-1])["rate"] > 0, out
