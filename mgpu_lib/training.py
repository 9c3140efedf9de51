"""The chapter's `train`, done right, and the one epoch loop that every engine runs.

    python -m mgpu_lib train --devices 2 --batch-size 512 --lr 0.2 --epochs 10

`fit` is the epoch loop: DataParallel (`train` here), DDP (`ddp.py`) and the CPU+GPU trainer each
hand it a `step(x, y)`. Unlike D2L 12.6, `train` builds and initializes a fresh model (no weights
carried into the next run), moves it to `devices[0]` before wrapping, and synchronizes every
timer reading. `TrainConfig(fast=False)` runs the chapter's loop (fp32, NCHW, data on the host);
`data=lab.d2l.chapter_data(config)` adds the chapter's own DataLoader.
"""
from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from torch import nn
from tqdm.auto import tqdm

from .data import load_fashion_mnist
from .devices import describe_devices, resolve_devices, timed
from .model import init_weights, resnet18
from .config import GRAPHS, REFERENCE, Switches, TrainConfig, prepare_model, resolve_switches

# A mean training loss above 4 x ln(10) ~ 9.2 is far worse than guessing uniformly (ln 10 ~ 2.3):
# the run has diverged even if BatchNorm kept the numbers finite (lr 50 gives about 1e7, then 16).
DIVERGED_LOSS = 4 * math.log(10)


def diverged(loss: float) -> bool:
    """Whether an epoch's mean training loss means the run has diverged (NaN, inf or huge)."""
    return not math.isfinite(loss) or loss > DIVERGED_LOSS


# ---- the record a run leaves -------------------------------------------------------------------

# The per-epoch lists of a run, in the order they are filled.
METRICS = ("train_loss", "train_acc", "epoch_seconds", "images_per_second", "test_acc")
# The same weights with BatchNorm's statistics checked (`lab.drop.bn_readings`), where recorded.
BN_METRICS = ("test_acc_batch", "test_acc_recal", "train_acc_recal")
PARTIAL = ".partial-"   # atomic writes' temporary files are `.NAME.partial-XXXX`: ours alone


@dataclass
class TrainResult:
    """What a run measured, epoch by epoch: the one record type (a run, a sweep point). `status`
    is "ok", "diverged", or "failed" (a DDP job that did not finish); `extra` holds what else
    the run knows (its switches, DDP's world, a sweep point's options). The store adds the
    header every stored record carries (versions, git revision, CPU name)."""
    config: dict
    hardware: str
    num_devices: int
    data_source: str
    steps_per_epoch: int
    test_acc: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)
    train_acc: list = field(default_factory=list)
    epoch_seconds: list = field(default_factory=list)
    images_per_second: list = field(default_factory=list)
    test_acc_batch: list = field(default_factory=list)    # BN_METRICS (`readings=`)
    test_acc_recal: list = field(default_factory=list)
    train_acc_recal: list = field(default_factory=list)
    status: str = "ok"
    extra: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.config["seed"]

    @property
    def metrics(self) -> dict:
        return {m: getattr(self, m) for m in METRICS}

    @property
    def final_test_acc(self) -> float:
        """The last test accuracy; nan unless the run finished ("ok"): a diverged run's last one
        is from before it blew up, and would flatter its setting in a mean."""
        return float(self.test_acc[-1]) if self.test_acc and self.status == "ok" else math.nan

    @property
    def sec_per_epoch(self) -> float:
        """The mean epoch time; nan for a run with no epochs (0 would read as infinitely fast)."""
        s = self.epoch_seconds
        return sum(s) / len(s) if s else math.nan

    def summary(self) -> str:
        """The chapter's summary line, e.g. 'test acc: 0.91, 12.3 sec/epoch on 2 x NVIDIA H200'."""
        if self.status != "ok":
            return (f"{self.status} after {len(self.train_loss)} epoch(s) "
                    f"(lr {self.config['lr']}), on {self.hardware}")
        return (f"test acc: {self.final_test_acc:.2f}, {self.sec_per_epoch:.1f} sec/epoch "
                f"on {self.hardware}")

    def to_dict(self) -> dict:
        return asdict(self)


def check_out(path) -> None:
    """The one check of every writer of a run's result (`train --out`, the DDP program's
    `--out`), made before any work: it may replace nothing but an empty file or an earlier run's
    result (one JSON object with a config and a loss curve). A notebook, a results store or
    any other file is a one-line ValueError, and stays as it was."""
    text = Path(path).read_bytes().strip() if Path(path).is_file() else b""
    try:
        if not text or {"config", "train_loss"} <= json.loads(text).keys():
            return                   # new, empty, or a result
    except (ValueError, AttributeError):    # not one JSON object (a store, notes, a checkpoint)
        pass
    raise ValueError(f"will not replace {path}: it is not a run's result (a notebook, a "
                     f"results store or another file); name another file")


def _prepare(x: torch.Tensor, y: torch.Tensor, device, switches: Switches):
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    if switches.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y


def _autocast(device, switches: Switches):
    return torch.autocast(torch.device(device).type, enabled=switches.bf16 or switches.fp16,
                          dtype=torch.float16 if switches.fp16 else torch.bfloat16)


class Autocast(nn.Module):
    """`module` run under the switches' autocast in its own `forward`. DataParallel runs each
    replica in a thread of its own and re-enters autocast there with the enabled flag only, and
    autocast's dtype is thread-local (CUDA's default is fp16): without this, every replica
    computes in fp16 with no GradScaler while the run says bf16."""

    def __init__(self, module: nn.Module, device_type: str, switches: Switches):
        super().__init__()
        self.module, self.device_type, self.switches = module, device_type, switches

    def forward(self, *args, **kwargs):
        with _autocast(self.device_type, self.switches):
            return self.module(*args, **kwargs)


def evaluate_accuracy(net: nn.Module, data_iter, *, switches: Switches = REFERENCE) -> float:
    """Accuracy over `data_iter` in eval mode (`net`'s mode is restored after), counted on the
    device: one read back at the end, not one a batch as D2L's `evaluate_accuracy_gpu`."""
    device, was_training = next(net.parameters()).device, net.training
    net.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    with torch.inference_mode(), _autocast(device, switches):
        for x, y in data_iter:
            x, y = _prepare(x, y, device, switches)
            correct += (net(x).argmax(dim=1) == y).sum()
            total += y.numel()
    net.train(was_training)
    return correct.item() / max(total, 1)


def make_model(config: TrainConfig, device) -> nn.Module:
    """A fresh, initialized model on `device`; the seed fixes the initial weights."""
    torch.manual_seed(config.seed)
    return init_weights(resnet18(width=config.width)).to(device)


def make_step(model: nn.Module, optimizer, loss_fn, device,
              switches: Switches = REFERENCE):
    """`step(x, y)`: one SGD step, returning (sum of losses, correct) as tensors
    on `device`; nothing is read back to the host (an `.item()` would stall the GPU).
    The `GradScaler` scales the loss under fp16 (small gradients would underflow);
    otherwise it passes through."""
    scaler = torch.amp.GradScaler("cuda", enabled=switches.fp16)

    def step(x, y):
        x, y = _prepare(x, y, device, switches)
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device, switches):
            out = model(x)
            loss = loss_fn(out, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)       # fp16: skipped if a gradient overflowed
        scaler.update()
        return loss.detach().float() * y.numel(), (out.argmax(dim=1) == y).sum()
    return step


def fit(step: Callable, train_iter, result: TrainResult, epochs: range, devices,
        reduce: Optional[Callable] = None) -> Iterator[TrainResult]:
    """The epoch loop: train `epochs` (e.g. `range(10)`) with `step(x, y) -> (loss
    sum, correct)`, timed with `devices` synchronized; yield `result` after each epoch
    for the caller to evaluate, save or plot. A diverged run ends with status
    "diverged", a failed evaluation with "failed". DDP's `reduce` sums `[loss sum,
    correct, samples]` across processes."""
    for epoch in epochs:
        if hasattr(train_iter, "set_epoch"):
            train_iter.set_epoch(epoch)  # DDP: this epoch's shard (DistributedSampler)
        with timed(devices) as t:
            sums = [0, 0, 0]
            for x, y in train_iter:
                loss_sum, correct = step(x, y)
                sums = [sums[0] + loss_sum, sums[1] + correct, sums[2] + len(y)]
            totals = torch.stack([torch.as_tensor(v, device=sums[0].device).double()
                                  for v in sums])
            if reduce is not None:
                reduce(totals)
        loss_sum, correct, n = totals.tolist()
        result.train_loss.append(loss_sum / n)
        if diverged(loss_sum / n):
            result.status = "diverged"
            return
        result.train_acc.append(correct / n)
        result.epoch_seconds.append(t.seconds)
        result.images_per_second.append(n / t.seconds)
        yield result
        if result.status != "ok":      # the caller's evaluation failed
            return


@contextmanager
def backends(switches: Switches):
    """cuDNN's algorithm search (`cudnn.benchmark`) as the switches say, and TF32 for
    convolutions and matmuls where they ask for it (else torch's defaults), restored after."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32
    cudnn.benchmark = switches.cudnn_benchmark
    if switches.tf32:
        cudnn.allow_tf32 = matmul.allow_tf32 = True
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = before


def load_data(config: TrainConfig, device, switches: Switches):
    """`(train_iter, test_iter)`: on `device` on the fast path, else on the host, each batch
    copied to the device in the step (the chapter's own pipeline: `lab.d2l.chapter_data`)."""
    return load_fashion_mnist(config.batch_size, device=device if switches.device_data else "cpu",
                              source=config.data_source, train_limit=config.train_limit,
                              test_limit=config.test_limit, seed=config.seed,
                              allow_synthetic=config.allow_synthetic,
                              eval_batch_size=switches.eval_batch_size)


def replicated(net: nn.Module, switches: Switches) -> nn.Module:
    """What DataParallel replicates: `net`, compiled if asked, entering the run's autocast in
    each replica's own thread (`Autocast`) when the run computes in bf16 or fp16."""
    mode = "reduce-overhead" if switches.compile == GRAPHS else None   # CUDA graphs: fewer
    model = torch.compile(net, mode=mode) if switches.compile else net  # kernel launches
    if switches.bf16 or switches.fp16:
        model = Autocast(model, next(net.parameters()).device.type, switches)
    return model


class _Stderr:
    """The bar's stream: a failed write (a full disk, a closed pipe) is dropped, never the
    run's end (issue 52: `2> /dev/full` had cost the result)."""

    def write(self, text: str) -> None:
        with suppress(OSError, ValueError):
            sys.stderr.write(text)

    def flush(self) -> None:
        with suppress(OSError, ValueError):
            sys.stderr.flush()


def progress_bar(steps: int, show: bool = True):
    """A tqdm bar over `steps` steps (a widget in notebooks, text in a terminal)."""
    return tqdm(total=steps, desc="train", unit="step", leave=False, mininterval=0.5,
                disable=not show, file=_Stderr())


def counted(step: Callable, bar) -> Callable:
    """`step`, advancing `bar` by one at each call."""
    def run(x, y):
        bar.update(1)
        return step(x, y)
    return run


def evaluate(r: TrainResult, net: nn.Module, data, switches, then: Callable = lambda r: None,
             readings: Optional[Callable] = None) -> None:
    """Append the epoch's test accuracy (eval mode) to `r`, and what `readings(net, train_iter,
    test_iter)` returns (BatchNorm's: `lab.drop.bn_readings`) to its lists, then call `then(r)`
    (a live plot, a checkpoint). An evaluation that fails (out of memory) ends the run as
    "failed" with its cause in `r.extra["error"]`; its trained epochs are kept."""
    try:
        acc = evaluate_accuracy(net, data[1], switches=switches)
        more = readings(net, *data) if readings else {}
    except (RuntimeError, MemoryError) as e:
        r.status = "failed"
        r.extra["error"] = f"evaluation failed: {type(e).__name__}: {str(e).splitlines()[0]}"
        return
    r.test_acc.append(acc)
    for key, value in more.items():
        getattr(r, key).append(value)
    then(r)


def sgd(parameters, lr: float, steps_per_epoch: int) -> torch.optim.Optimizer:
    """The chapter's optimizer: plain SGD (`steps_per_epoch` is for schedules)."""
    return torch.optim.SGD(parameters, lr=lr)


def train(config: TrainConfig, *, data=None, progress=True, on_epoch=lambda r: None,
          make_optimizer: Callable = sgd, readings=None) -> TrainResult:
    """Train a fresh ResNet-18 with `nn.DataParallel` over `config.devices` devices;
    returns a `TrainResult` (`.summary()` is the chapter's line). `data`: `(train_iter,
    test_iter)` (default: loaded from `config`); `on_epoch(result)` after each epoch (a
    live plot); `make_optimizer(parameters, lr, steps_per_epoch)`: default `sgd`;
    `readings`: more per-epoch readings (see `evaluate`)."""
    devices = resolve_devices(config.devices)
    device = devices[0]                  # where DataParallel scatters and gathers
    switches = resolve_switches(config, device)
    train_iter, test_iter = data or load_data(config, device, switches)
    net = prepare_model(make_model(config, device), switches)  # seeded: same weights
    model = nn.DataParallel(replicated(net, switches), device_ids=devices)
    optimizer = make_optimizer(model.parameters(), config.lr, len(train_iter))
    result = TrainResult(config.to_dict(), describe_devices(devices), len(devices),
                         data_source=getattr(train_iter, "source", "custom"),
                         steps_per_epoch=len(train_iter),
                         extra={"switches": switches.to_dict()})
    step = make_step(model, optimizer, nn.CrossEntropyLoss(), device, switches)
    epochs = range(config.num_epochs)
    bar = progress_bar(len(train_iter) * len(epochs), progress)
    step = counted(step, bar)      # each step advances the bar
    with backends(switches), bar:
        for r in fit(step, train_iter, result, epochs, devices):
            evaluate(r, net, (train_iter, test_iter), switches, on_epoch, readings)
    return result
