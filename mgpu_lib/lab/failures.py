"""A failed DDP job in one line: which rank failed, and with what, from what torch records.

Each rank's `@record` (torch's `errors.record`) writes the exception that ended it to an error
file under torchrun's `--log_dir`; torchrun's own report (`ChildFailedError`) gives the exit
code, and so the signal, of each rank that ended on its own. The blame goes to a rank that
refused its input, then to one killed by a signal nobody in the job sent (torchrun stops the
others with SIGTERM), then to the earliest error; a rank the launcher had to kill (it hung) is named as what the others waited for.
"""
from __future__ import annotations

import os
import re
import textwrap
from signal import SIGTERM
from dataclasses import dataclass, field
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ..ddp import RankInputError

# torchrun's report of a failed rank (torch's ChildFailedError, unchanged since torch 1.9)
REPORT = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")


class LaunchError(RuntimeError):
    """A DDP job failed or hung; the message names the rank and its error."""


@dataclass
class Ended:
    """How torchrun ended: its exit code, the output's last lines, the ranks we killed."""
    code: int
    lines: list = field(default_factory=list)
    stopped: set = field(default_factory=set)

    @property
    def last(self) -> str:
        """The output's last line that says something."""
        return next((t for t in reversed(self.lines) if t.strip()), "no output")


def failure_record(rank: int, f: ProcessFailure) -> dict:
    """A failed rank as JSON: the exception its `@record` wrote (`error`, None without an
    error file), its exit code, and torch's words for a signal."""
    wrote = os.path.isfile(f.error_file)
    return {"rank": rank, "exitcode": f.exitcode, "message": f.message,
            "error": f.message if wrote else None,
            "at_ns": os.stat(f.error_file).st_mtime_ns if wrote else f.timestamp * 10**9}


def read_failures(logs: Path, ended: Ended) -> list:
    """Each failed rank's record: from its error file (`logs/<run>/attempt_0/<rank>/error.json`)
    and the exit code torchrun reported."""
    codes = {int(r): (int(c), int(p)) for r, c, p in REPORT.findall("\n".join(ended.lines))}
    files = {int(p.parent.name): str(p) for p in Path(logs).rglob("error.json")}
    return [failure_record(r, ProcessFailure(r, codes.get(r, (1, 0))[1], codes.get(r, (1, 0))[0],
                                             files.get(r, "")))
            for r in sorted(set(codes) | set(files))]


def failure(records: list, ended: Ended) -> Exception:
    """The one line for a failed job, blaming first a rank that refused its input (then a
    `RankInputError`), then one ended by a signal we did not send, then the earliest error."""
    last = ended.last
    if not records:
        return LaunchError(f"DDP job failed (exit code {ended.code}): {last}")

    def blame(r: dict) -> tuple:
        refused = _exception(r)[0].split(".")[-1] == RankInputError.__name__
        # killed, not by torchrun's SIGTERM (sent to the others once one failed) nor by us
        killed = r["error"] is None and r["exitcode"] < 0 and r["exitcode"] != -SIGTERM
        return (not refused, r["rank"] in ended.stopped, not killed, r["at_ns"], r["rank"])
    first = min(records, key=blame)
    name, text = _exception(first)
    if name.split(".")[-1] == RankInputError.__name__:
        return RankInputError(f"DDP rank {first['rank']} failed: {text}")
    if first["error"] is None and first["exitcode"] > 0:    # it said why on its stderr, if at all
        text += f"; last output: {last}"
    hung = sorted(ended.stopped - {first["rank"]})
    if hung:
        text += (f" (a collective timed out: rank {', '.join(map(str, hung))} stopped answering"
                 f" and was killed)")
    return LaunchError(f"DDP rank {first['rank']} failed: "
                       + textwrap.shorten(f"{name}: {text}" if name else text, 400, placeholder=" ..."))


def _exception(record: dict) -> tuple:
    """(the exception's qualified name, its message's first line), or ("", torch's words for a
    signal, or the exit code) without an error file. `@record` writes the bare class name; the
    module comes from the traceback's last line that names the class."""
    error = record["error"]
    if error is None:
        return "", record["message"] if record["exitcode"] < 0 else \
            f"exit code {record['exitcode']}"
    if not isinstance(error, dict):         # torch's plain-message format
        return "", str(error)
    short, _, text = str(error.get("message", "")).partition(": ")
    stack = str((error.get("extraInfo") or {}).get("py_callstack", ""))
    names = re.findall(rf"^((?:[\w.]+\.)?{re.escape(short)}): ", stack, re.M)
    return (names[-1] if names else short), (text.strip().splitlines() or [""])[0]
