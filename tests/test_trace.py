"""The traced DDP run: reading a profiler trace, the overlap it measures, the stored events
(page 05 draws from them), and (slow) two real gloo processes with several buckets, one, and no_sync."""
import contextlib
import errno
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from mgpu_lib.lab import trace as trace_mod
from mgpu_lib.lab.events import (Event, Overlap, RankTrace, TraceRun, backward_spans,
                             mean_overlap, measure_overlap, overlap_rows, read_trace)
from mgpu_lib.ddp import write_atomic
from mgpu_lib.lab.launcher import LaunchError
from mgpu_lib.model import resnet18
from mgpu_lib.book.profiles import get_profile
from mgpu_lib.lab.trace import ONE_BUCKET_MB, MarkedDataParallel, Variant, summary_lines, trace_ddp
from mgpu_lib.training import TrainConfig

from ddp_helpers import alive, gone, signal_job, wait_for


def load_events(path) -> TraceRun:
    """A `TraceRun` back from the events.json that `trace_ddp` wrote."""
    d = json.loads(Path(path).read_text(encoding="utf-8"))
    ranks = [RankTrace(**{**r, "events": [Event(**e) for e in r["events"]]}) for r in d["ranks"]]
    return TraceRun(**{**d, "ranks": ranks})


def x(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat,
            "args": args}


def chrome_trace(path, events, meta=None):
    doc = {"traceEvents": events}
    if meta:
        doc["otherData"] = {"mgpu": meta}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


BWD = "autograd::engine::evaluate_function: "


def two_steps():
    """Two steps of 1000 us: forward, three backward ops, an AccumulateGrad, a bucket all-reduce
    on gloo's thread that starts inside backward, and the optimizer."""
    ev = []
    for s, t in enumerate((1000, 2000)):
        ev += [x(f"ProfilerStep#{s + 2}", t, 1000, cat="user_annotation"),
               x("forward", t + 10, 300, cat="user_annotation"),
               x(BWD + "ConvolutionBackward0", t + 400, 100),
               x(BWD + "NativeBatchNormBackward0", t + 500, 100),
               x(BWD + "torch::autograd::AccumulateGrad", t + 600, 250),    # not a compute op
               x(BWD + "ConvolutionBackward0", t + 610, 190),
               x("gloo:all_reduce", t + 750, 100, tid=2),                   # 50 us inside
               x("gloo:broadcast", t + 20, 5, tid=2),
               x("optimizer", t + 900, 50, cat="user_annotation")]
    return ev


def test_read_trace_classifies_assigns_steps_and_reads_the_buckets(tmp_path):
    path = chrome_trace(tmp_path / "r.json", two_steps() + [x("gloo:all_reduce", 5000, 10)],
                        dict(variant="v", rank=1, num_buckets=3, accumulate=1))
    t = read_trace(path)
    assert (t.variant, t.rank, t.num_buckets, t.steps) == ("v", 1, 3, 2)
    kinds = [e.kind for e in t.events if e.step == 0]
    assert kinds.count("backward") == 3 and "AccumulateGrad" not in {e.name for e in t.events}
    assert [len(t.of("allreduce", s)) for s in (0, 1)] == [1, 1]    # the one outside: dropped
    assert t.of("forward", 1)[0].start == pytest.approx(1010e-6)    # from the first step
    assert backward_spans(t, 0) == [pytest.approx((400e-6, 800e-6))]


def test_overlap_counts_only_the_part_inside_backward(tmp_path):
    t = read_trace(chrome_trace(tmp_path / "r.json", two_steps()))
    o = measure_overlap(t)
    assert o.allreduce_s == pytest.approx(100e-6) and o.hidden_s == pytest.approx(50e-6)
    assert o.fraction == pytest.approx(0.5)
    assert (o.allreduces, o.started_early) == (1, 1)
    assert o.backward_s == pytest.approx(400e-6)
    # the model hides up to overlap x backward: 0.5 x 400 us covers all 100 us; 0.1 x 400, 40%
    assert o.assumed_fraction(0.5) == 1.0 and o.assumed_fraction(0.1) == pytest.approx(0.4)


def test_no_sync_micro_batches_have_their_own_backward_spans():
    ev = [Event("forward", "forward", 0.0, 1.0, 0, 0), Event("a", "backward", 1.0, 1.0, 0, 0),
          Event("forward", "forward", 2.0, 1.0, 0, 1), Event("b", "backward", 3.0, 2.0, 0, 1),
          Event("gloo:all_reduce", "allreduce", 4.0, 2.0, 0, 1)]
    t = RankTrace("v", 0, ev, 1, accumulate=2)
    assert backward_spans(t, 0) == [(1.0, 2.0), (3.0, 5.0)]
    o = measure_overlap(t)
    assert o.backward_s == 2.0 and o.hidden_s == 1.0 and o.started_early == 1


def test_a_gpu_trace_reads_kernels_by_the_step_that_launched_them(tmp_path):
    ev = [x("ProfilerStep#2", 0, 1000, cat="user_annotation"),
          x("ProfilerStep#2", 1100, 900, tid=7, cat="gpu_user_annotation"),  # the GPU's copy
          x("forward", 1200, 50, cat="user_annotation"),                      # after the step
          x("forward", 10, 200, cat="user_annotation"),
          x("backward", 300, 300, cat="user_annotation"),
          x("cudaLaunchKernel", 350, 5, cat="cuda_runtime", correlation=7),
          x("cudaLaunchKernel", 1200, 5, cat="cuda_runtime", correlation=8),   # next step
          x("sm80_xmma_dgrad", 900, 80, tid=7, cat="kernel", correlation=7),    # runs later
          x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 950, 60, tid=9, cat="kernel",
            correlation=9),
          x("sm80_xmma_fprop", 1300, 10, tid=7, cat="kernel", correlation=8),
          x("nccl:all_reduce", 400, 3, cat="cpu_op")]                          # only the launch
    t = read_trace(chrome_trace(tmp_path / "g.json", ev))
    assert t.steps == 1                 # the GPU's copy of the step mark is no step of its own
    assert [(e.kind, e.name[:4]) for e in t.events if e.kind != "forward"] == \
        [("backward", "sm80"), ("allreduce", "nccl")]
    assert measure_overlap(t).hidden_s == pytest.approx(30e-6)


def synthetic_run(tmp_path) -> TraceRun:
    ranks = []
    for variant, early in (("small", True), ("one", False)):
        for rank in (0, 1):
            t = read_trace(chrome_trace(tmp_path / f"{variant}{rank}.json", two_steps()),
                           variant, rank)
            if not early:     # move the all-reduce after backward
                t.events = [Event(e.name, e.kind, e.start + 0.0003, e.duration, e.step)
                            if e.kind == "allreduce" else e for e in t.events]
            t.num_buckets = 1
            ranks.append(t)
    return TraceRun("2 x gloo on a test", "smoke", 2, "gloo", 8, 32, 1.0, ranks)


def test_stored_events_read_back_without_running_anything(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a figure tried to run something")
    monkeypatch.setattr(trace_mod, "run_ranks", refuse)
    monkeypatch.setattr(torch.distributed, "init_process_group", refuse)
    monkeypatch.setattr(trace_mod, "trace_ddp", refuse)
    path = write_atomic(tmp_path / "events.json", json.dumps(asdict(synthetic_run(tmp_path))))
    run = load_events(path)
    assert run.variants == ["small", "one"] and isinstance(run.ranks[0].events[0], Event)
    assert {e.kind for r in run.ranks for e in r.events} >= {"forward", "backward",
                                                               "allreduce", "optimizer"}
    rows = overlap_rows(run)
    assert [(r[6], r[7]) for r in rows] == [(50, 100), (0, 100)]     # measured, model
    assert "50% of it hidden" in summary_lines(run)[1]


def test_mean_overlap_averages_the_ranks():
    ev = lambda d: [Event("b", "backward", 0.0, 1.0, 0), Event("a", "allreduce", 0.5, d, 0)]
    run = TraceRun("", "", 2, "gloo", 8, 32, 0.0,
                   [RankTrace("v", 0, ev(1.0), 1), RankTrace("v", 1, ev(3.0), 1)])
    assert mean_overlap(run, "v") == Overlap(1.0, 2.0, 0.5, 1, 1)


def test_unwaited_allreduce_takes_each_buckets_shortest_bar():
    # rank 0 waits 4 s in the first bucket, rank 1 2 s in the second: 1 + 1 s left
    ev = lambda d1, d2: [Event("a", "allreduce", 0.0, d1, 0), Event("a", "allreduce", 9.0, d2, 0)]
    run = TraceRun("", "", 2, "gloo", 8, 32, 0.0,
                   [RankTrace("v", 0, ev(5.0, 1.0), 2), RankTrace("v", 1, ev(1.0, 3.0), 2)])
    assert trace_mod.unwaited_allreduce_s(run, "v") == 2.0
    assert mean_overlap(run, "v").allreduce_s == 5.0


def test_default_buckets_follow_ddps_caps_first_one_small():
    assert trace_mod.FIRST_CAP_BYTES == 2**20 and trace_mod.DEFAULT_CAP_BYTES == 25 * 2**20
    grads = sum(p.numel() * 4 for p in resnet18(width=16).parameters())
    sizes = trace_mod.default_bucket_bytes(16)      # 2.8 MB: 1 MiB, then the rest
    assert sum(sizes) == grads and len(sizes) == 2 and sizes[0] >= 2**20 > sizes[0] - 2**19
    assert len(trace_mod.default_bucket_bytes(8)) == 1      # 0.7 MB: under the first cap


def test_marked_dataparallel_marks_each_phase_and_passes_its_arguments(monkeypatch):
    for name in ("scatter", "replicate", "parallel_apply", "gather"):
        assert inspect.signature(getattr(MarkedDataParallel, name)) == \
            inspect.signature(getattr(nn.DataParallel, name))
    seen = []
    monkeypatch.setattr(trace_mod, "record_function",
                        lambda name: seen.append(name) or contextlib.nullcontext())
    monkeypatch.setattr(nn.DataParallel, "gather", lambda self, outputs, device: (outputs, device))
    dp = MarkedDataParallel.__new__(MarkedDataParallel)
    # a fresh wrapper, so it finds the stand-in gather: the mark wraps the call, arguments pass
    assert trace_mod._marked("gather")(dp, [1], 0) == ([1], 0) and seen == ["gather"]


@pytest.mark.parametrize("argv, words", [
    (["--accumulate", "2"], "--accumulate needs --bucket-cap-mb"),
    (["--nprocs", "3", "--profile", "smoke"], "does not split evenly"),
    (["--bucket-cap-mb", "0"], "--bucket-cap-mb"),
    # before: an OverflowError from a rank, after the job started (issue 33)
    (["--bucket-cap-mb", "1e308"], "--bucket-cap-mb: must be a number of MiB above 0 and at "
                                   "most 10000")])
def test_cli_refuses_bad_input_in_one_line(argv, words, tmp_path, capsys):
    """Bad input is refused before any process starts."""
    from mgpu_lib.book.cli import main
    try:
        code = main(["trace", "--out", str(tmp_path), *argv])
    except SystemExit as e:         # argparse's refusals
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.splitlines()) == 1


def test_a_bucket_cap_past_one_bucket_is_refused_where_it_enters(capsys):
    """Any cap above the model's gradients is one bucket; DDP's byte count overflows near 1e300.
    The command line refuses it in one line (exit 2), before any process starts."""
    from mgpu_lib.book.cli import main
    assert Variant("one", ONE_BUCKET_MB).bucket_cap_mb == ONE_BUCKET_MB
    for cap in ("1e308", "inf", "nan", "0", "-1"):
        with pytest.raises(SystemExit) as e:
            main(["trace", "--profile", "smoke", "--bucket-cap-mb", cap])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--bucket-cap-mb" in err


# ---- two real gloo processes ------------------------------------------------------------------

SMALL_MB = 0.1     # at width 8 (0.7 MB of gradients) several buckets


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    config = get_profile("smoke").config()
    variants = [Variant("small", SMALL_MB), Variant("one", ONE_BUCKET_MB),
                Variant("no_sync", ONE_BUCKET_MB, accumulate=2)]
    return out, trace_ddp(config, 2, variants, out=out, timeout_s=600)


def children() -> list:
    """This process's live children, but multiprocessing's resource tracker (test_ddp's
    `mp.spawn` starts one that lives as long as this process)."""
    return [p.cmdline() for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE
            and not any("resource_tracker" in a for a in p.cmdline())]


@pytest.mark.slow
def test_each_rank_writes_a_chrome_trace_and_no_process_stays(traced):
    out, run = traced
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/rank*.json")) == \
        [f"{v}/rank{r}.json" for v in ("no_sync", "one", "small") for r in (0, 1)]
    assert load_events(out / "events.json").variants == ["small", "one", "no_sync"]
    assert children() == []


@pytest.mark.slow
def test_at_least_one_all_reduce_per_bucket_per_step(traced):
    _, run = traced
    assert run.get("small").num_buckets > 1 and run.get("one").num_buckets == 1
    for t in run.ranks:
        assert t.steps == 2
        for step in range(t.steps):
            assert len(t.of("allreduce", step)) >= t.num_buckets, (t.variant, t.rank, step)


@pytest.mark.slow
def test_small_buckets_start_all_reducing_before_backward_ends_and_one_bucket_does_not(traced):
    _, run = traced
    for rank in (0, 1):
        for step in (0, 1):
            small, one = run.get("small", rank), run.get("one", rank)
            end = backward_spans(small, step)[-1][1]
            assert any(e.start < end for e in small.of("allreduce", step))
            end = backward_spans(one, step)[-1][1]
            assert all(e.start >= end for e in one.of("allreduce", step))
        assert measure_overlap(run.get("small", rank)).fraction > 0
        assert measure_overlap(run.get("one", rank)).hidden_s == 0


@pytest.mark.slow
def test_no_sync_all_reduces_only_in_the_last_micro_batch(traced):
    _, run = traced
    for t in (run.get("no_sync", 0), run.get("no_sync", 1)):
        assert {e.micro for e in t.of("forward")} == {0, 1}
        assert {e.micro for e in t.of("allreduce")} == {1}


@pytest.mark.slow
def test_a_hung_job_is_stopped_at_its_timeout_and_leaves_nothing(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchError, match="timed out after 2 s .* stopped"):
        trace_ddp(TrainConfig(width=4, batch_size=8), 2, [Variant("v")], out=tmp_path,
                  timeout_s=2)
    assert time.monotonic() - start < 30 and children() == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_stops_a_trace_and_leaves_nothing(tmp_path, sig):
    """Before (issue 33): SIGTERM to `trace` exited 143 with no message; both ranks and the
    multiprocessing resource tracker went on for about 30 s, wrote their traces into --out
    after the command had exited, and a mgpu-trace-* folder stayed. SIGKILL: the same."""
    out = tmp_path / "out"
    code, err, started = signal_job(["trace", "--nprocs", "2", "--profile", "smoke", "--steps",
                                     "50", "--out", str(out)], tmp_path, sig)
    written = sorted(out.rglob("*"))
    assert gone(started, 15), [p.cmdline() for p in started if alive(p.pid)]
    assert wait_for(lambda: not list(tmp_path.glob("mgpu-trace-*")), 30)
    assert sorted(out.rglob("*")) == written            # nothing written after the exit
    if sig == signal.SIGTERM:
        assert code == 143 and len(err.splitlines()) == 1 and "SIGTERM" in err, err
    else:
        assert code == -signal.SIGKILL


def test_a_trace_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Before (issue 33): on a full disk the profiler left torn `rank*.json.tmp` files in
    --out and the error said "FileNotFoundError ... rank1.json". Now the profiler writes into
    the job's folder, and --out gets one atomic write whose error names the cause and file."""
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    path = tmp_path / "v" / "rank1.json"
    with pytest.raises(OSError) as failed:
        write_atomic(path, "{}")
    assert str(failed.value) == f"[Errno 28] No space left on device: '{path}'"
    assert list(tmp_path.rglob("*.*")) == []            # no torn file, no temporary file


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="mounts a small tmpfs: Linux, as root")
def test_a_full_disk_is_named_and_leaves_no_torn_trace(tmp_path):
    """The same on a real full disk: a 1.2 MB tmpfs holds rank 0's 0.9 MB trace, not rank 1's."""
    out = tmp_path / "full"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(out)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = subprocess.run([sys.executable, "-m", "mgpu_lib", "trace", "--nprocs", "2",
                            "--profile", "smoke", "--bucket-cap-mb", "1", "--out", str(out)],
                           capture_output=True, text=True, timeout=600)
        left = sorted(f.name for f in out.rglob("*") if f.is_file())
    finally:
        subprocess.run(["umount", str(out)])
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "No space left on device" in p.stderr and "rank" in p.stderr, p.stderr
    assert all(name in ("rank0.json", "rank1.json") for name in left), left


@pytest.mark.slow
def test_cli_trace_writes_per_rank_traces_and_a_summary(tmp_path):
    p = subprocess.run([sys.executable, "-m", "mgpu_lib", "trace", "--nprocs", "2", "--profile",
                        "smoke", "--bucket-cap-mb", "1", "--out", str(tmp_path / "t")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in (tmp_path / "t").glob("*/rank*.json")) == \
        ["rank0.json", "rank1.json"]
    assert "all-reduce(s) per step" in p.stdout and "perfetto" in p.stdout
