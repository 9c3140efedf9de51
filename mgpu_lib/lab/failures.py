"""A failed DDP job in one line: which rank failed, and with what, from what torch records.

Each rank's `@record` (torch's `errors.record`) writes the exception that ended it to an error
file under torchrun's `--log_dir`; torchrun's own report (`ChildFailedError`) gives the exit
code, and so the signal, of each rank that ended on its own. torch's `ProcessFailure` reads both.
`_blame` picks the rank to name; a rank the launcher had to kill (it hung) is named as what the
others waited for.
"""
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGTERM

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ..ddp import RankInputError

# torchrun's report of a failed rank (torch's ChildFailedError, unchanged since torch 1.9)
REPORT = re.compile(r"rank\s*:\s*(\d+) \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")
# torchrun's warning as it stops the survivors of a failed rank (its api.py, since torch 1.9)
CLOSING = re.compile(r"Sending process (\d+) closing signal")


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


def read_failures(logs: Path, ended: Ended) -> list:
    """Each failed rank's `ProcessFailure`: its error file
    (`logs/<run>/attempt_0/<rank>/error.json`) and the exit code torchrun reported."""
    reported = {int(r): (int(p), int(c)) for r, c, p in REPORT.findall("\n".join(ended.lines))}
    files = {int(p.parent.name): str(p) for p in Path(logs).rglob("error.json")}
    return [ProcessFailure(r, *reported.get(r, (0, 1)), files.get(r, ""))    # pid, exit code
            for r in sorted(set(reported) | set(files))]


def failure(failures: list, ended: Ended) -> Exception:
    """The one line for a failed job: a `RankInputError` if a rank refused its input, else a
    `LaunchError`."""
    if not failures:
        return LaunchError(f"DDP job failed (exit code {ended.code}): {ended.last}")
    closed = {int(pid) for pid in CLOSING.findall("\n".join(ended.lines))}
    first = min(failures, key=lambda f: _blame(f, ended.stopped, closed))
    (name, text), rank = _exception(first), first.local_rank
    if name.split(".")[-1] == RankInputError.__name__:
        return RankInputError(f"DDP rank {rank} failed: {text}")
    if not os.path.isfile(first.error_file) and first.exitcode > 0:     # it said why on stderr
        text += f"; last output: {ended.last}"
    if hung := sorted(ended.stopped - {rank}):
        text += (f" (a collective timed out: rank {', '.join(map(str, hung))} stopped answering"
                 f" and was killed)")
    return LaunchError(f"DDP rank {rank} failed: " + textwrap.shorten(
        f"{name}: {text}" if name else text, 400, placeholder=" ..."))


def _blame(f: ProcessFailure, stopped: set, closed: frozenset = frozenset()) -> tuple:
    """Sorts the rank to blame first: it refused its input; we did not kill it; torchrun did not
    stop it as a survivor (`closed`: their pids); a signal nobody in the job sent ended it
    (torchrun sends SIGTERM); its error came earliest."""
    wrote = os.path.isfile(f.error_file)
    refused = _exception(f)[0].split(".")[-1] == RankInputError.__name__
    signalled = not wrote and f.exitcode < 0 and f.exitcode != -SIGTERM
    at_ns = os.stat(f.error_file).st_mtime_ns if wrote else f.timestamp * 10**9
    return (not refused, f.local_rank in stopped, f.pid in closed, not signalled, at_ns,
            f.local_rank)


def _exception(f: ProcessFailure) -> tuple:
    """(the exception's qualified name, its message's first line), or ("", torch's words for a
    signal, or the exit code) without an error file. `@record` writes the bare class name; the
    module comes from the traceback's last line that names the class."""
    if not os.path.isfile(f.error_file):
        return "", f.message if f.exitcode < 0 else f"exit code {f.exitcode}"
    if not isinstance(f.message, dict):         # torch's plain-message format
        return "", str(f.message)
    short, _, text = str(f.message.get("message", "")).partition(": ")
    stack = str((f.message.get("extraInfo") or {}).get("py_callstack", ""))
    names = re.findall(rf"^((?:[\w.]+\.)?{re.escape(short)}): ", stack, re.M)
    return (names[-1] if names else short), (text.strip().splitlines() or [""])[0]
