"""What the `eqsched` command and its tools share to read their arguments: the one-line user
error and the parsers of --size, --limits, --target, --timeout and --max-memory.

    size = parse_size("64,64,64", get_workload("matmul"))   # (64, 64, 64), checked by the workload
    limits = parse_limits("iterations=20,seconds=10")       # an egraph.saturate.Limits
    target = parse_target("host,-avx512f")                  # a backend.Target this CPU can run
    raise CliError("--samples must be >= 1, got 0")         # `eqsched: error: ...`, exit status 2
    run.add_argument("--timeout", type=timeout_arg)         # argparse refuses inf, nan, 0, -1
    max_memory_bytes("8G"), max_memory_bytes("50%")        # 8 GiB; half of this machine's memory

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

import argparse
import re
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
        try:
            values[name.strip()] = fields[name.strip()](value)
        except ValueError:
            raise CliError(f"bad --limits value in {item!r}: not a number") from None
    return Limits(**values)


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

    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"timeout must be a number of seconds, got {text!r}"
                                         ) from None
    try:
        return check_timeout(seconds)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


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
