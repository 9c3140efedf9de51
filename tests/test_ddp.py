"""DDP on gloo processes, CPU only: the arithmetic, one step against one process, sharding,
the DDP program under torchrun (standalone and as two "nodes"), a killed rank and resume, a
resumed run against an uninterrupted one, how a failed rank is named, snapshots, and the CLI."""
import ast
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from mgpu_lib.book.store import load_result
from mgpu_lib import ddp
from mgpu_lib.data import shard_indices
from mgpu_lib.lab import launcher
from mgpu_lib.perf import scaling
from mgpu_lib.book.cli import main
from mgpu_lib.training import TrainConfig, TrainResult, make_model, make_step

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddp_helpers import failed, rank_pid, source, tiny
from helpers import batch, bn_free_model

REPO = Path(__file__).resolve().parent.parent


# ---- pure functions ---------------------------------------------------------------------------

def test_batch_split_and_threads():
    assert ddp.local_batch_size(256, 4) == 64
    with pytest.raises(ValueError, match="does not split evenly over 3 processes"):
        ddp.local_batch_size(32, 3)
    assert ddp.cpu_threads(2, cpus=16) == 8
    assert ddp.cpu_threads(4, cpus=2) == 1
    assert ddp.choose_backend("gloo") == "gloo"
    assert ddp.choose_backend("auto") == ("nccl" if torch.cuda.is_available() else "gloo")


def test_the_ranks_get_their_share_of_the_cores():
    env = launcher.rank_env("gloo", 2)
    assert env["OMP_NUM_THREADS"] == str(ddp.cpu_threads(2))


@pytest.mark.parametrize("n,world", [(4000, 2), (1000, 4)])
def test_shards_cover_the_subset_exactly_once(n, world):
    for epoch in (0, 1):
        shards = [shard_indices(n, r, world, epoch, seed=0) for r in range(world)]
        everything = torch.cat(shards)
        assert len(everything) == n                      # no sample twice ...
        assert torch.equal(everything.sort().values, torch.arange(n))   # ... none missing
        assert all(len(s) == n // world for s in shards)
    # set_epoch reshuffles: epoch 1 is not epoch 0's order
    assert not torch.equal(shard_indices(n, 0, world, 0), shard_indices(n, 0, world, 1))


def test_uneven_shards_pad_with_at_most_world_minus_one_repeats():
    shards = [shard_indices(10, r, 3, 0) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]          # equal steps on every rank
    everything = torch.cat(shards)
    assert set(everything.tolist()) == set(range(10)) and len(everything) == 12


# ---- one SGD step: 2 ranks on half a batch each == 1 process on the whole batch --------------

def _one_step(model, x, y, device="cpu"):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    make_step(model, opt, nn.CrossEntropyLoss(), device)(x, y)


def _rank_step(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=2)
    try:
        x, y = batch()
        model = nn.parallel.DistributedDataParallel(bn_free_model())
        _one_step(model, x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8])
        torch.save(model.module.state_dict(), f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_on_half_batches_equal_one_process_on_the_batch(tmp_path):
    torch.set_num_threads(1)
    mp.spawn(_rank_step, args=(str(tmp_path),), nprocs=2, join=True)
    single = bn_free_model()
    before = {k: v.clone() for k, v in single.state_dict().items()}
    _one_step(single, *batch())
    for rank in (0, 1):
        theirs = torch.load(tmp_path / f"rank{rank}.pt")
        for k, v in single.state_dict().items():
            assert not torch.equal(v, before[k])         # the step moved every parameter
            torch.testing.assert_close(theirs[k], v, rtol=0, atol=1e-5)


# ---- whole jobs -------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The DDP program's flags for one short epoch of the smoke profile's kind.
SHORT = ["--epochs", "1", "--width", "4", "--train-limit", "400", "--test-limit", "100",
         "--data-source", source(), "--allow-synthetic", "--batch-size", "32", "--lr", "0.05"]


@pytest.mark.slow
def test_the_ddp_program_runs_under_torchrun_and_prints_its_result(tmp_path):
    """The issue's command: `torchrun --standalone --nproc_per_node=2 -m mgpu_lib.ddp`."""
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", "-m", "mgpu_lib.ddp", *SHORT, "--out", str(out)],
                         cwd=REPO, env=dict(os.environ, MGPU_PROFILE="smoke"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = load_result(out)
    assert run.stdout.splitlines()[-1] == ddp.LOG + result.summary()
    assert result.num_devices == 2 and len(result.test_acc) == 1


@pytest.mark.slow
def test_two_nodes_on_one_machine(tmp_path):
    port, out = _free_port(), tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=mgpu-test",
           "--local-addr=127.0.0.1", "-m", "mgpu_lib.ddp", *SHORT, "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    nodes = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        logs = [p.communicate(timeout=120)[0] for p in nodes]
    finally:
        for p in nodes:
            p.kill() if p.poll() is None else None
    assert [p.returncode for p in nodes] == [0, 0], logs
    result = load_result(out)
    assert result.num_devices == 2 and "2 gloo processes" in result.hardware
    assert len(result.test_acc) == 1
    assert result.steps_per_epoch == 12      # 200 images per rank, 12 full batches of 16


@pytest.mark.slow
def test_killed_worker_fails_the_job_then_resume_finishes(tmp_path):
    config = tiny(num_epochs=3, train_limit=2400)
    ckpt, failure = tmp_path / "ckpt", {}
    saved_one = threading.Event()       # rank 0 logs an epoch after its checkpoint is written

    def first_run():
        try:
            launcher.launch(config, 2, checkpoint=ckpt, timeout_s=150,
                       log=lambda line: line.startswith("epoch 1/") and saved_one.set())
        except launcher.LaunchError as e:
            failure["error"], failure["at"] = str(e), time.monotonic()
        saved_one.set()                 # never wait on a job that already ended

    job = threading.Thread(target=first_run)
    job.start()
    assert saved_one.wait(120) and (ckpt / ddp.CKPT_NAME).exists(), \
        f"no checkpoint after the first epoch: {failure}"
    victim = rank_pid(1)
    assert victim, "rank 1 not found"
    os.kill(victim, signal.SIGKILL)                      # mid-epoch 2 (epoch 1 is saved)
    killed = time.monotonic()
    job.join(90)
    assert not job.is_alive() and "error" in failure, "the job outlived its dead rank"
    assert failure["at"] - killed < 60
    assert "rank 1" in failure["error"] and "SIGKILL" in failure["error"], failure["error"]
    assert rank_pid(0) == 0 and rank_pid(1) == 0       # nothing left behind
    saved = torch.load(ckpt / ddp.CKPT_NAME, weights_only=True)["epoch"]
    assert 1 <= saved < 3

    result = launcher.launch(config, 2, checkpoint=ckpt, resume=True, timeout_s=150)
    assert result.extra["resumed_from_epoch"] == saved
    assert len(result.train_loss) == len(result.test_acc) == len(result.epoch_seconds) == 3
    assert result.status == "ok"


def test_failure_names_the_rank_from_torchs_error_files_and_report(tmp_path, monkeypatch):
    """A failed rank is named from the error file torch's `@record` wrote for it, or from the
    signal torchrun reports: a rank that refused its input first, then one ended by a signal we
    did not send, then the earliest error. A rank we killed (it hung) is the cause of its peer's
    timeout, not the failure."""
    def waited(rank=0):
        return failed(tmp_path / f"w{rank}", rank, monkeypatch, RuntimeError(
            "Connection closed by peer"))
    report = ChildFailedError("mgpu_lib.ddp", {1: ProcessFailure(1, 101, -9, "")}).format_msg()
    signalled = launcher.read_failures(tmp_path / "none", launcher.Ended(1, report.splitlines()))
    assert str(launcher.failure(signalled + [waited()], launcher.Ended(1))) == \
        "DDP rank 1 failed: Signal 9 (SIGKILL) received by PID 101"
    crashed = [failed(tmp_path, 1, monkeypatch, ZeroDivisionError("division by zero")), waited()]
    error = launcher.failure(crashed, launcher.Ended(1, ["busy"] * 60))
    assert type(error) is launcher.LaunchError    # rank 0 noticed after rank 1 raised: second
    assert str(error) == "DDP rank 1 failed: ZeroDivisionError: division by zero"
    hung = [waited(), failed(tmp_path, 1, monkeypatch, exitcode=-9)]
    assert str(launcher.failure(hung, launcher.Ended(1, stopped={1}))) == (
        "DDP rank 0 failed: RuntimeError: Connection closed by peer (a collective timed out: "
        "rank 1 stopped answering and was killed)")
    told = [waited(1), failed(tmp_path / "told", 0, monkeypatch,
                              ddp.RankInputError("batch size 30 does not split evenly"))]
    error = launcher.failure(told, launcher.Ended(1))
    assert type(error) is ddp.RankInputError
    assert str(error) == "DDP rank 0 failed: batch size 30 does not split evenly"
    silent = [failed(tmp_path, 1, monkeypatch, exitcode=2)]      # exited without an error file
    assert str(launcher.failure(silent, launcher.Ended(1, ["rank 1: error: no disk"]))) \
        == "DDP rank 1 failed: exit code 2; last output: rank 1: error: no disk"
    nothing = launcher.Ended(1, ["ValueError: bad torchrun", ""])    # torchrun itself failed
    assert str(launcher.failure([], nothing)) == \
        "DDP job failed (exit code 1): ValueError: bad torchrun"


def test_train_and_trace_start_torchrun_with_the_ddp_programs_ranks(monkeypatch, tmp_path):
    """`train --strategy ddp` runs `torchrun -m mgpu_lib.ddp`; `trace` runs its ranks under the
    same torchrun, joined by the same `ddp.setup`."""
    commands = []

    def started(cmd, *args, **kw):
        commands.append(cmd)
        raise launcher.LaunchError("not started")
    monkeypatch.setattr(launcher, "supervise", started)
    flags = ["--profile", "smoke", "--width", "4", "--data-source", source()]
    assert main(["train", "--strategy", "ddp", "--nprocs", "2", *flags]) == 1
    assert main(["trace", "--profile", "smoke", "--out", str(tmp_path)]) == 1
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    assert [cmd[:4] for cmd in commands] == [torchrun, torchrun]
    program = commands[0][commands[0].index("--no_python") + 1:]
    assert program[:4] == [sys.executable, "-u", "-m", "mgpu_lib.ddp"]
    assert commands[1][commands[1].index("--no_python") + 3:][:2] == ["-m", "mgpu_lib.lab.trace"]
    from mgpu_lib.lab import trace
    assert trace.setup is ddp.setup


# ---- snapshots --------------------------------------------------------------------------------

def _rank_train(rank: int, folder: str, store: str, epochs: int, resume: bool) -> None:
    """One of 2 ranks of `ddp.train` (no torchrun: a file rendezvous), snapshots in `folder`."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ddp.train(tiny(num_epochs=epochs), torch.device("cpu"), checkpoint=folder, resume=resume)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_resumed_run_equals_the_run_never_stopped(tmp_path):
    """2 ranks trained for 2 epochs, and 2 ranks trained for 1 then resumed from the snapshot
    for the second, end with the same weights, optimizer and readings: the snapshot (model,
    optimizer, epoch, result) holds all a run needs; no random state is missing."""
    def run(name: str, epochs: int, resume: bool = False) -> dict:
        store = tmp_path / f"{name}-{epochs}.store"
        mp.spawn(_rank_train, args=(str(tmp_path / name), str(store), epochs, resume), nprocs=2)
        return torch.load(tmp_path / name / ddp.CKPT_NAME, weights_only=True)
    straight = run("straight", 2)
    assert run("resumed", 1)["epoch"] == 1
    resumed = run("resumed", 2, resume=True)
    assert resumed["epoch"] == straight["epoch"] == 2
    assert resumed["result"]["extra"]["resumed_from_epoch"] == 1
    for key in ("train_loss", "train_acc", "test_acc"):
        assert resumed["result"][key] == straight["result"][key], key
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


def _saved_checkpoint(folder: Path, config: TrainConfig, epochs: int = 1,
                      world: int = 2) -> Path:
    """A real snapshot of `config` after `epochs` epochs on `world` ranks."""
    net = make_model(config, "cpu")
    opt = torch.optim.SGD(net.parameters(), lr=config.lr)
    result = TrainResult(config.to_dict(), "cpu", world, data_source="synthetic",
                         steps_per_epoch=1)
    for key in ("test_acc", "train_loss", "train_acc", "epoch_seconds", "images_per_second"):
        setattr(result, key, [0.5] * epochs)
    return ddp.save_checkpoint(folder, net, opt, result)


def _fresh(config: TrainConfig):
    """What a rank restores into: a differently seeded model, its optimizer, an empty result."""
    net = make_model(config.replace(seed=7), "cpu")
    result = TrainResult(config={}, hardware="", num_devices=2, data_source="", steps_per_epoch=1)
    return net, torch.optim.SGD(net.parameters(), lr=1), result


def test_a_snapshot_is_the_tutorials_and_restores_whole(tmp_path):
    config = tiny()
    path = _saved_checkpoint(tmp_path, config)
    assert os.listdir(tmp_path) == [ddp.CKPT_NAME]          # the temporary file was renamed
    saved = torch.load(path, weights_only=True)
    assert set(saved) == {"model", "optimizer", "epoch", "result"}
    net, opt, result = _fresh(config)
    assert ddp.restore(tmp_path, config.replace(num_epochs=5), 2, net, opt, result) == 1
    for name, tensor in saved["model"].items():             # more epochs: fine
        assert torch.equal(net.state_dict()[name], tensor), name
    assert opt.param_groups[0]["lr"] == config.lr            # the optimizer's state came back
    assert result.test_acc == [0.5] and result.extra["resumed_from_epoch"] == 1
    assert ddp.restore(tmp_path / "none", config, 2, *_fresh(config)) == 0   # a first run


@pytest.mark.parametrize("other,world,differs", [
    (dict(lr=0.1), 2, "lr was 0.05, now 0.1"), (dict(width=8), 2, "width was 4, now 8"),
    ({}, 4, "world size was 2, now 4"), (dict(num_epochs=1), 2, "2 epochs done, more than "
                                                             "--epochs 1")],
    ids=["lr", "width", "world", "fewer-epochs"])
def test_another_runs_snapshot_says_what_differs_and_loads_nothing(tmp_path, other, world,
                                                                  differs):
    config = tiny(lr=0.05, num_epochs=2)
    path = _saved_checkpoint(tmp_path, config, epochs=2)
    before = path.read_bytes()
    net, opt, result = _fresh(config)
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ValueError) as refused:
        ddp.restore(tmp_path, config.replace(**other), world, net, opt, result)
    assert "\n" not in str(refused.value) and differs in str(refused.value), refused.value
    assert str(path) in str(refused.value)
    assert path.read_bytes() == before and result.test_acc == []
    assert all(torch.equal(net.state_dict()[k], v) for k, v in weights.items())


@pytest.mark.parametrize("bad", ["torn", "text"])
def test_a_snapshot_that_does_not_load_is_refused_and_left_as_it_was(tmp_path, bad):
    config = tiny()
    path = _saved_checkpoint(tmp_path, config)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2] if bad == "torn"
                     else b"not a snapshot")
    before = path.read_bytes()
    with pytest.raises(ValueError, match="does not load") as refused:
        ddp.restore(tmp_path, config, 2, *_fresh(config))
    assert str(path) in str(refused.value).splitlines()[0]
    assert path.read_bytes() == before


# ---- the command line -------------------------------------------------------------------------

def test_cli_rejects_an_uneven_batch_split(capsys):
    code = main(["train", "--strategy", "ddp", "--nprocs", "3", "--batch-size", "32",
                 "--profile", "smoke"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "batch size 32 does not split evenly over 3 processes" in err


def test_cli_nprocs_needs_ddp(capsys):
    assert main(["train", "--nprocs", "2", "--profile", "smoke"]) == 2
    assert "need --strategy ddp" in capsys.readouterr().err


@pytest.mark.slow
def test_the_ddp_program_needs_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    run = subprocess.run([sys.executable, "-m", "mgpu_lib.ddp", "--epochs", "1"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "run this under torchrun" in run.stderr, run.stderr


def test_one_ddp_entry_the_cli_has_no_worker(capsys):
    """`torchrun -m mgpu_lib.ddp` is the one rank program; the CLI's `worker` went."""
    with pytest.raises(SystemExit) as refused:
        main(["worker", "--profile", "smoke"])
    assert refused.value.code == 2 and "invalid choice: 'worker'" in capsys.readouterr().err


def test_ring_allreduce_leaves_every_rank_with_every_sum():
    for n in (2, 3, 4, 8):
        steps = scaling.ring_allreduce_steps(n)
        assert len(steps) == 2 * (n - 1) + 1
        after_scatter = steps[n - 1][1]         # each rank owns one fully reduced chunk
        assert all(row.count(n) == 1 for row in after_scatter)
        assert sorted(row.index(n) for row in after_scatter) == list(range(n))
        assert steps[-1][1] == [[n] * n for _ in range(n)]
    assert scaling.allreduce_bytes(1000, 4) == {"ddp_ring_per_device": 6000.0, "dp_gpu0": 4000.0}


# ---- no code on a page is a string ------------------------------------------------------------

def _code_in_strings(source: str) -> list:
    """The string literals in a code cell's `source` (docstrings aside) that hold Python code:
    more than one line that parses and defines, imports or loops."""
    tree = ast.parse("\n".join(line for line in source.splitlines()
                               if not line.lstrip().startswith(("%", "!"))))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr)}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs \
                and "\n" in n.value.strip():
            try:
                body = ast.parse(textwrap.dedent(n.value)).body
            except SyntaxError:
                continue
            if any(isinstance(b, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom,
                                  ast.For, ast.While, ast.With)) for b in body):
                found.append(n.value.strip().splitlines()[0])
    return found


def test_no_page_shows_code_from_a_string_literal():
    """Page 05 showed DDP as a diff of two string literals, code that never ran; a diff is
    computed from the source of code that runs (`inspect.getsource`)."""
    planted = 'ONE = """\\ndef main(config):\n    for x, y in loader:\n        step(x, y)\n"""'
    assert _code_in_strings(planted) == ["def main(config):"]
    assert _code_in_strings('print("a\\nb")\ndef f():\n    """Doc.\n\n    import x\n    """') == []
    pages = sorted(REPO.glob("chapters/*.ipynb")) + sorted(REPO.glob("exercises/*.ipynb"))
    assert len(pages) > 5
    found = {}
    for page in pages:
        for i, cell in enumerate(json.loads(page.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                with contextlib.suppress(SyntaxError):
                    if strings := _code_in_strings(source):
                        found[f"{page.name} cell {i}"] = strings
    assert not found, found


def test_the_ddp_delta_a_reader_studies_is_at_most_20_lines():
    """Issue 50: page 05 shows `ddp.train` as a diff over `mg.train`, computed from their
    source (docstrings left out), as the DDP tutorial series shows multigpu.py over
    single_gpu.py. It must show DDP's delta (the shards, DDP(...), the all-reduce, the rank-0
    guard, the checkpoint), not a progress bar or callbacks: at most 20 changed lines."""
    import ast
    import difflib
    import inspect
    import mgpu_lib as mg

    def code(f) -> list:
        lines = inspect.getsource(f).splitlines()
        doc = ast.parse("\n".join(lines)).body[0].body[0]
        return lines[: doc.lineno - 1] + lines[doc.end_lineno:]
    diff = [line for line in difflib.unified_diff(code(mg.train), code(ddp.train), lineterm="")
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(diff) <= 20, "\n".join(diff)
    added = "\n".join(line for line in diff if line.startswith("+"))
    for delta in ("load_shards", "DDP(", "dist.all_reduce", "rank == 0", "restore("):
        assert delta in added, delta
