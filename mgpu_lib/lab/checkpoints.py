"""A DDP checkpoint checked in full before any rank starts: the launcher and the CLI call
`check`, which refuses a torn, malformed or foreign checkpoint, or a non-file where one would be
saved, in one line and leaves it as it was. The DDP program itself (`ddp.save_checkpoint`,
`ddp.restore`) needs only `torch.save` and `torch.load`."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Optional

import torch

from ..config import TrainConfig
from ..ddp import CKPT_FORMAT, CKPT_NAME, CheckpointError, check_fresh, differences
from ..training import METRICS, PARTIAL

# What a checkpoint holds; `ddp.restore` reads every one of them.
CKPT_ENTRIES = ("format", "epoch", "config", "world_size", "model", "optimizer", "rng", "result")


def check(folder, config: TrainConfig, world_size: int, resume: bool) -> None:
    """Before a job starts: with `resume`, `folder`'s checkpoint checked against this run;
    without, no checkpoint there yet. Then what killed saves left is removed."""
    checkpoint_file(folder)             # refuses a FIFO, a device, a folder, a dangling link
    load_checkpoint(folder, config, world_size) if resume else check_fresh(folder)
    remove_partial_checkpoints(folder)


def checkpoint_file(folder) -> Path:
    """`folder`'s checkpoint, where saves go: through a link, to the file it points to. A
    CheckpointError if something else is there (a FIFO, a device, a folder, a link to nothing),
    which a save would replace."""
    path = Path(folder) / CKPT_NAME
    if os.path.lexists(path) and not path.is_file():     # a FIFO, a folder, a link to nothing
        raise CheckpointError(f"{path} is not a file, and a checkpoint would replace it; name "
                              f"another --checkpoint folder")
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def remove_partial_checkpoints(folder) -> None:
    """Delete what killed saves left: `replace_file`'s temporary files, and nothing else."""
    for tmp in checkpoint_file(folder).parent.glob(f".{CKPT_NAME}{PARTIAL}*"):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)


def load_checkpoint(folder, config: TrainConfig, world_size: int) -> Optional[dict]:
    """The checkpoint in `folder`, checked against this run; None if there is none. A
    CheckpointError if it is truncated or corrupt, belongs to a different run, or holds more
    epochs than `config.num_epochs` (resuming it would train nothing and report more epochs than
    were asked for)."""
    path = checkpoint_file(folder)
    if not path.is_file():
        return None
    state = _read_checkpoint(path)
    diff = differences(state, config, world_size)
    if diff:
        raise CheckpointError(f"checkpoint {path.name} belongs to a different run: "
                              f"{'; '.join(diff)}")
    if state["epoch"] > config.num_epochs:
        raise CheckpointError(f"checkpoint {path} has {state['epoch']} epochs, more than "
                              f"--epochs {config.num_epochs} (num_epochs); resume with "
                              f"--epochs {state['epoch']} or more")
    return state


def _read_checkpoint(path: Path) -> dict:
    """The whole dict in `path`, with every entry `ddp.restore` reads, else a CheckpointError."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:         # zip, pickle and EOF errors: all mean "not a whole file"
        first = textwrap.shorten((str(e).splitlines() or [type(e).__name__])[0], 120,
                                 placeholder=" ...")
        raise CheckpointError(f"checkpoint {path.name} in {path.parent.name!r} is truncated "
                              f"or corrupt ({first}); delete it or run without --resume") from None
    problem = _checkpoint_problem(state)
    if problem:
        raise CheckpointError(f"checkpoint {path} is not an mgpu_lib DDP checkpoint of format "
                              f"{CKPT_FORMAT} ({problem}); delete it or run without --resume")
    return state


def _checkpoint_problem(state) -> Optional[str]:
    """What keeps `state` from being restored (`ddp.restore` would meet a KeyError), or None."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dict"
    missing = [k for k in CKPT_ENTRIES if k not in state]
    if missing:
        return f"no {', '.join(missing)}"
    if state["format"] != CKPT_FORMAT:
        return f"format {state['format']!r}"
    if not isinstance(state["config"], dict) or not isinstance(state["epoch"], int) or \
            not isinstance(state["result"], dict) or any(m not in state["result"] for m in METRICS):
        return "a malformed config, epoch or result"
    if state["epoch"] < 0 or any(len(state["result"][m]) != state["epoch"] for m in METRICS):
        return f"epoch {state['epoch']} does not match its {len(state['result']['train_loss'])} " \
               f"recorded epochs"
    optimizer = state["optimizer"]
    if not isinstance(state["model"], dict) or not isinstance(optimizer, dict) or \
            any(k not in optimizer for k in ("state", "param_groups")):
        return "no model or optimizer state"
    return None
