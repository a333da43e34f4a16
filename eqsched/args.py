"""What the `eqsched` command and its tools share to read their arguments: the one-line user
error and the parsers of --size, --limits and --target.

    size = parse_size("64,64,64", get_workload("matmul"))   # (64, 64, 64), checked by the workload
    limits = parse_limits("iterations=20,seconds=10")       # an egraph.saturate.Limits
    target = parse_target("host,-avx512f")                  # a backend.Target this CPU can run
    raise CliError("--samples must be >= 1, got 0")         # `eqsched: error: ...`, exit status 2

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

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
