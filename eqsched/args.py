"""What the `eqsched` command and its tools share to read their arguments: the one-line user
error and the parsers of --size, --limits, --rules, --target, --timeout, --seconds, --seed and
--max-memory, the check that an output file can be written, and the line an interrupted run
ends with.

    size = parse_size("64,64,64", get_workload("matmul"))   # (64, 64, 64), checked by the workload
    limits = parse_limits("iterations=20,seconds=10")       # an egraph.saturate.Limits
    rules = parse_rules("-pack,+unroll")                    # ["-pack", "+unroll"]; None: default
    target = parse_target("host,-avx512f")                  # a backend.Target this CPU can run
    raise CliError("--samples must be >= 1, got 0")         # `eqsched: error: ...`, exit status 2
    run.add_argument("--timeout", type=timeout_arg)         # argparse refuses inf, nan, 0, -1
    exp.add_argument("--seconds", type=seconds_arg)         # argparse refuses inf, nan, 0, -1
    exp.add_argument("--seed", type=seed_arg)               # argparse refuses -1, 2**63
    max_memory_bytes("8G"), max_memory_bytes("50%")        # 8 GiB; half of this machine's memory
    check_writable(Path("best.json"), "the trace")          # before the work whose result it is
    return resumable_interrupt()                            # says so on stderr; exit status 130

Every check runs before anything expensive (saturation, exploration, measuring), so a bad value
costs a second, not the run.

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import Target
    from .workloads import Workload

TARGET_HELP = ("the CPU to compile for: 'host' (default), an LLVM CPU name like 'haswell', then "
               "+feature/-feature changes, like 'host,-avx512f' (AVX2 code on this machine)")


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 2."""


def parse_size(text: str, wl: Workload) -> tuple[int, ...]:
    try:
        size = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CliError(f"bad --size {text!r}: expected integers separated by commas, "
                       f"like {','.join(map(str, wl.default_size))}") from None
    return wl.check_size(size)


def parse_limits(text: str | None) -> Any:
    from .egraph.saturate import Limits

    if not text:
        return Limits()
    fields = {"iterations": int, "enodes": int, "seconds": float}
    values: dict[str, Any] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() not in fields:
            raise CliError(f"bad --limits item {item!r}: expected iterations=, enodes= or "
                           f"seconds=, like iterations=20,enodes=200000,seconds=10")
        if name.strip() in values:
            raise CliError(f"bad --limits {text!r}: {name.strip()} is given twice")
        try:
            values[name.strip()] = fields[name.strip()](value)
        except ValueError:
            raise CliError(f"bad --limits value in {item!r}: not a number") from None
    try:
        return Limits(**values)
    except ValueError as err:
        raise CliError(f"bad --limits {text!r}: {err}") from None


def parse_rules(text: str | None) -> list[str] | None:
    """The rule names or +name/-name edits of a --rules spec; None (the default set) when there
    is no spec. A spec that names nothing (",") is refused rather than read as the default."""
    if text is None:
        return None
    rules = [r.strip() for r in text.split(",") if r.strip()]
    if not rules:
        raise CliError(f"bad --rules {text!r}: it names no rule (leave --rules out for the "
                       f"default set)")
    return rules


def parse_target(text: str, *, runs_here: bool = True) -> Target:
    """The target `text` names, checked before anything is compiled or saturated: LLVM must know
    it and, when `runs_here`, this CPU must be able to run its code."""
    from .backend import Target, TargetError

    try:
        target = Target.parse(text)
        if runs_here:
            target.check_runs_here()
    except TargetError as err:
        raise CliError(f"bad --target: {err}") from None
    return target


def timeout_arg(text: str) -> float:
    """An argparse type: seconds per candidate, checked by `runner.check_timeout` (more than 0,
    finite, at most a day), so a bad --timeout is refused before anything runs."""
    from .runner import check_timeout

    return _checked_seconds(text, "timeout", check_timeout)


def seconds_arg(text: str) -> float:
    """An argparse type: explore's wall-time budget, checked by `explore.check_seconds` (more
    than 0, finite), so that --seconds 0 does not saturate a space to measure nothing."""
    from .explore import check_seconds

    return _checked_seconds(text, "seconds", check_seconds)


def _checked_seconds(text: str, what: str, check: Any) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a number of seconds, got {text!r}"
                                         ) from None
    try:
        return check(seconds)
    except ValueError as err:
        # 1e400 reads as inf: the message quotes what was typed, not what it became.
        head, said_got, _ = str(err).rpartition(", got ")
        raise argparse.ArgumentTypeError(f"{head}, got {text!r}" if said_got else str(err)
                                         ) from None


def seed_arg(text: str) -> int:
    """An argparse type: a seed, checked by `trials.check_seed` (0 to 2**63 - 1)."""
    from .trials import check_seed

    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed must be an integer, got {text!r}") from None
    try:
        return check_seed(seed)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def early_stopping_arg(text: str) -> int | None:
    """An argparse type: trials without a gain after which a task is done (a count >= 1), or
    'off' (None: every task goes on until the budget is spent)."""
    if text == "off":
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--early-stopping takes a count of trials >= 1 or "
                                         f"'off', got {text!r}")
    return int(text)


def check_writable(path: str | os.PathLike, what: str) -> None:
    """Refuse an output file that could not be written, before the work whose result it holds
    (an exploration, a saturation, a sample's measurements), not after it. A probe file is
    written beside it and removed, as the final write does (a new file then renamed over
    it): a missing or read-only directory, a directory in its place and a full disk are all
    found; a file already there is left untouched."""
    if not str(path):  # Path("") would be the current directory
        raise CliError(f"no file name given for {what}")
    path = Path(path)
    if path.is_dir():
        raise CliError(f"cannot write {what} to {path}: it is a directory")
    probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
    try:
        file = open(probe, "w")
    except OSError as e:
        raise CliError(f"cannot write {what} to {path} ({e.strerror})") from None
    try:
        with file:
            file.write("probe")
            file.flush()
            os.fsync(file.fileno())
    except OSError as e:
        raise CliError(f"cannot write {what} to {path} ({e.strerror})") from None
    finally:
        probe.unlink(missing_ok=True)


MEMORY_HELP = ("the measuring worker's memory cap, like 8G, 512M or 50%% (of this machine's "
               "memory); a candidate needing more fails with \"out of memory\" (default: half "
               "of this machine's memory)")
_MEMORY = re.compile(r"(\d+(?:\.\d*)?)\s*(?:([kmgt])i?b?|(%)|b)?", re.I)
_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def max_memory_bytes(value: str | int) -> int:
    """A memory cap in bytes from a number of bytes, a size like "8G" / "512MiB" (binary units)
    or a percentage of this machine's memory like "50%"; ValueError naming a bad one."""
    from .runner import check_max_memory, machine_memory

    if isinstance(value, int) and not isinstance(value, bool):
        return check_max_memory(value)
    match = _MEMORY.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"max memory must be a size like 8G, 512M or 50%, got {value!r}")
    number, unit, percent = float(match.group(1)), match.group(2), match.group(3)
    if percent:
        if not 0 < number <= 100:
            raise ValueError(f"max memory must be a percentage from 0 to 100, got {value!r}")
        return check_max_memory(int(machine_memory() * number / 100))
    return check_max_memory(int(number * _UNITS[unit.lower() if unit else None]))


def max_memory_arg(text: str) -> int:
    """An argparse type for --max-memory (`max_memory_bytes`)."""
    try:
        return max_memory_bytes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def resumable_interrupt() -> int:
    """Say that an interrupted run kept its measurements and resumes when run again; the exit
    status of a command so interrupted (130, as after Ctrl-C)."""
    print("eqsched: interrupted; every measurement so far is in the database, run the same "
          "command again to resume", file=sys.stderr)
    return 130
