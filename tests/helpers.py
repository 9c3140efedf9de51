"""What several test files share: the command line run in this process, the one-line check, a
whole `TrainResult` in one call, a fake trainer for sweeps, and a small network without
BatchNorm with a batch for it (the equivalence tests of DDP and the heterogeneous step)."""
from typing import Optional

import torch
from torch import nn

from mgpu_lib.book import cli
from mgpu_lib.book.store import ResultsError
from mgpu_lib.lab.files import HEADER, SCHEMA
from mgpu_lib.training import TrainConfig, TrainResult


def run_cli(capsys, *argv) -> tuple:
    """(exit code, stdout, stderr) of `python -m mgpu_lib *argv`, run in this process."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:          # argparse refusals
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line(text) -> str:
    """`text` (stderr, a message, an exception or pytest's ExceptionInfo) checked to be one line
    without a traceback; returned without its newline, for more checks."""
    text = str(getattr(text, "value", text))
    body = text[:-1] if text.endswith("\n") else text
    assert body and "\n" not in body and "Traceback" not in body and len(body) < 500, text
    return body


def make_result(epochs: int = 2, status: str = "ok", *, config: Optional[dict] = None,
                acc: float = 0.5, **fields) -> TrainResult:
    """A whole run of `epochs` epochs, as a file would hold it: a diverged run has one loss
    more than its other lists, the last one not finite. `config` overrides config fields
    (seed 1, profile cpu), `fields` any field of the result."""
    config = TrainConfig(**{"num_epochs": max(epochs, 1), "seed": 1, "profile": "cpu",
                            **(config or {})}).to_dict()
    done = epochs - (status == "diverged")
    metrics = dict(train_loss=[1.0] * done + [float("nan")] * (status == "diverged"),
                   train_acc=[acc] * done, epoch_seconds=[2.0] * done,
                   images_per_second=[100.0] * done, test_acc=[acc] * done)
    return TrainResult(**{**dict(config=config, hardware="CPU", num_devices=1,
                                 data_source="synthetic", steps_per_epoch=4, status=status),
                              **metrics, **fields})


class FakeTrain:
    """A sweep's `train_fn` that trains nothing: counts calls; accuracy depends on lr and seed,
    the loss blows up for lr > 10; the `fail_on`-th call is a Ctrl-C."""

    def __init__(self, fail_on: int = 0):
        self.calls, self.fail_on = [], fail_on

    def __call__(self, config, **options):
        self.calls.append((config, options))
        if len(self.calls) == self.fail_on:
            raise KeyboardInterrupt
        r = TrainResult(config=config.to_dict(), hardware="fake", num_devices=1,
                        data_source="fake", steps_per_epoch=8)
        for e in range(config.num_epochs):
            if config.lr > 10:
                r.train_loss.append(float("nan"))
                r.status = "diverged"
                break
            r.train_loss.append(1.0 / (e + 1))
            r.train_acc.append(0.5)
            r.test_acc.append(round(min(1.0, 0.5 + config.lr + 0.01 * config.seed + 0.01 * e), 6))
            r.epoch_seconds.append(1.0 + config.seed)
            r.images_per_second.append(100.0)
        return r


def bn_free_model(seed: int = 0) -> nn.Module:
    """A tiny network without BatchNorm: a step on a split batch equals the full-batch step."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 28 * 28, 10))


def batch(n: int = 16):
    """`n` random 28 x 28 images and labels, the same every call."""
    g = torch.Generator().manual_seed(1)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def check_header(rec: dict, where: str) -> None:
    """Raise ResultsError (one line, naming `where`) unless `rec` carries a whole header: the
    oracle for every record the library writes."""
    missing = [k for k in HEADER if k not in rec]
    if missing:
        raise ResultsError(f"{where}: no {', '.join(missing)} (a record from before the "
                           f"header, schema 1?)")
    # text, or None (unknown) for all but hardware
    bad = [k for k in ("mgpu_lib", "git", "torch", "profile", "hardware") if not (
        (isinstance(rec[k], str) and rec[k] != "") or (rec[k] is None and k != "hardware"))]
    if rec["schema"] != SCHEMA:
        bad.insert(0, "schema")
    if not isinstance(rec["config"], dict) or not rec["config"]:
        bad.append("config")
    if bad:
        raise ResultsError(f"{where}: bad header field(s) {', '.join(bad)}")
