"""What the `eqsched` command and its tools share to read their arguments: the one-line user
error and the parsers of --size and --limits.

    size = parse_size("64,64,64", get_workload("matmul"))   # (64, 64, 64), checked by the workload
    limits = parse_limits("iterations=20,seconds=10")       # an egraph.saturate.Limits
    raise CliError("--samples must be >= 1, got 0")         # `eqsched: error: ...`, exit status 2

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .workloads import Workload


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
