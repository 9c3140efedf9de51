"""Why d2l's 2-GPU run loses accuracy: the chapter's two runs taken apart, seed by seed.

    python tools/record_drop.py --seeds 0,1,2 --out runs/drop_cpu.jsonl

The chapter trains one `net` on 1 GPU at batch B and learning rate lr, then reuses it on 2 GPUs
at 2B and 2 lr. Its init re-draws conv and linear weights only, so the second run starts with
the first's BatchNorm state and biases (MXNet's `initialize(force_reinit=True)` starts afresh).
Each run uses the chapter's own code (`d2l.train`):

- `first`: the chapter's first call, on a fresh lazy network (its init reaches 2 of 21 layers);
- `reused`: the chapter's second call on the same object, at 2B and 2 lr;
- `fresh`: 2B and 2 lr from the state MXNet's `force_reinit` leaves: every conv and linear
  weight N(0, 0.01), biases 0, BatchNorm at its defaults;
- `fresh_small`: the same fresh start at B and lr;
- `first_large`: the chapter's first call at 2B and 2 lr: against `fresh`, the scale of the
  initial weights (PyTorch's default init where the chapter's misses) at the doubled lr.

`reused` against `fresh` is the carried-over state; `fresh` against `fresh_small` is doubling
the batch and the learning rate; `first` against `fresh_small` is the partial init. The last
epoch also records BatchNorm's readings (`bn_accuracies`). On a CPU, DataParallel is a
pass-through: BatchNorm sees the whole batch of 2B where two GPUs would each normalize B.
"""
from __future__ import annotations

import copy
from typing import Callable, Optional

import torch
from torch import nn

from .d2l import evaluate_accuracy_gpu, lazy_resnet18, train
from ..data import load_fashion_mnist
from ..devices import describe_devices
from .files import record_header

CONDITIONS = ("first", "reused", "fresh", "fresh_small")
EXTRA = ("first_large",)
KIND = "drop"       # a store of these holds nothing else (`book.store.record_kind`)


def fixed_sample(train_iter, n: int = 2000) -> list:
    """Up to `n` training images spread over the set, in batches (its shuffle untouched)."""
    data = getattr(train_iter, "dataset", train_iter)       # the chapter's DataLoader, or ours
    idx = torch.arange(0, len(data.labels), max(1, len(data.labels) // n))[:n]
    x, y = data.images[idx].unsqueeze(1).float().div(255), data.labels[idx].to(torch.int64)
    return list(zip(x.split(train_iter.batch_size), y.split(train_iter.batch_size)))


def bn_accuracies(model: nn.Module, test_iter, sample: list) -> dict:
    """BatchNorm's running statistics checked on a copy (they lag the weights when steps are few
    and large): `test_acc_batch` normalizes each test batch by its own statistics;
    `test_acc_recal` and `train_acc_recal` (on `sample`) recompute them over `sample`."""
    net = copy.deepcopy(getattr(model, "module", model))
    batch = evaluate_accuracy_gpu(net, test_iter, train_mode=True)
    torch.optim.swa_utils.update_bn(sample, net, device=next(net.parameters()).device)
    return {"test_acc_batch": batch, "test_acc_recal": evaluate_accuracy_gpu(net, test_iter),
            "train_acc_recal": evaluate_accuracy_gpu(net, sample)}


def bn_readings(net: nn.Module, train_iter, test_iter) -> dict:
    """`training.train(config, readings=bn_readings)`: each epoch's `bn_accuracies` over a
    fixed sample of the training set."""
    return bn_accuracies(net, test_iter, fixed_sample(train_iter))


def reset_like_mxnet(net: nn.Module) -> nn.Module:
    """Materialize lazy layers (one forward pass, no statistics kept) and zero every bias, so
    that the chapter's init then leaves the state MXNet's `force_reinit` does."""
    net.eval()
    with torch.no_grad():
        net(torch.zeros(2, 1, 28, 28))
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
            nn.init.zeros_(m.bias)
    return net


def run_seed(seed: int, *, width: int, batch_size: int, lr: float, num_epochs: int,
             train_limit: Optional[int], test_limit: Optional[int], source: str = "auto",
             conditions=CONDITIONS, devices=None, log: Optional[Callable[[str], None]] = None,
             save: Optional[Callable[[dict], None]] = None) -> list[dict]:
    """The records of one seed's `conditions` (`seed` seeds the weights and the data order),
    each saved as its run ends. Runs at B use the first of `devices` (default: the CPU), those at
    2B all of them. "reused" trains "first" again when only it is asked for."""
    devices = list(devices or [torch.device("cpu")])
    data = {b: load_fashion_mnist(b, source=source, train_limit=train_limit,
                                  test_limit=test_limit, seed=seed)
            for b in (batch_size, 2 * batch_size)}
    sample = fixed_sample(data[batch_size][0])       # the same images for every run
    records = []

    def one(condition: str, net: nn.Module, scale: int) -> None:
        train_iter, test_iter = data[scale * batch_size]
        used = devices[:1] if scale == 1 else devices
        out = train(net, used, train_iter, test_iter, scale * lr, num_epochs)
        out.update((k, [v]) for k, v in bn_accuracies(net, test_iter, sample).items())
        config = dict(width=width, num_epochs=num_epochs, train_limit=train_limit,
                      test_limit=test_limit, seed=seed, batch_size=scale * batch_size,
                      lr=scale * lr)
        rec = {**record_header(hardware=describe_devices(used), profile=None, config=config),
               "kind": KIND, "condition": condition, "data_source": train_iter.source, **out}
        if log is not None:
            log(f"seed {seed}, {condition}: test acc " +
                " ".join(f"{a:.3f}" for a in out["test_acc"]) +
                f"; recomputed BN {out['test_acc_recal'][-1]:.3f}")
        if condition in conditions:
            records.append(rec)
            if save is not None:
                save(rec)

    for condition, scale in (("fresh", 2), ("fresh_small", 1), ("first_large", 2)):
        if condition in conditions:
            torch.manual_seed(seed)
            net = lazy_resnet18(width=width)
            one(condition, net if condition == "first_large" else reset_like_mxnet(net), scale)
    if {"first", "reused"} & set(conditions):
        torch.manual_seed(seed)
        net = lazy_resnet18(width=width)
        one("first", net, 1)
        if "reused" in conditions:
            one("reused", net, 2)
    return records

