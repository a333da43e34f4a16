"""What the three space experiments share on the command line: the `eqsched experiment` group,
the arguments every experiment takes, and turning them into a checked problem.

    eqsched experiment compare matmul --rules-a default --rules-b=-pack --samples 200
    eqsched experiment distribution matmul --size 64,64,64 --samples 32 --db eqsched.db
    eqsched experiment ranking matmul --size 64,64,64 --db eqsched.db --models analytic,random

Each experiment is a module of its own (`compare`, `distribution`, `ranking`) with its
`add_parser(sub)`, which adds it under `eqsched experiment`.

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..args import TARGET_HELP, CliError, parse_limits, parse_size, seed_arg
from ..egraph.saturate import Limits
from ..workloads import get_workload


def add_parser(sub: Any, experiments: Sequence[ModuleType]) -> None:
    """The `experiment` subcommand; each module of `experiments` adds its own parser under it."""
    exp = sub.add_parser("experiment", help="space experiments: compare rule sets' spaces, "
                                            "measure a uniform sample, rate cost models")
    inner = exp.add_subparsers(dest="experiment", required=True)
    for module in experiments:
        module.add_parser(inner)


def common_arguments(p: Any) -> None:
    """The arguments of every experiment: the problem, the seed of the draws, --json."""
    p.add_argument("workload", help="a name from `eqsched workloads`")
    p.add_argument("--size", help="comma-separated sizes (default: the workload's default)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the uniform draws")
    p.add_argument("--limits", help="saturation limits, like iterations=20,seconds=10")
    p.add_argument("--target", default="host",
                   help=TARGET_HELP + "; its vector width sets the vector lanes of the space")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def problem(args: Any) -> tuple[str, tuple[int, ...], Limits]:
    """The workload's name, its size and the saturation limits the arguments name."""
    wl = get_workload(args.workload)
    size = parse_size(args.size, wl) if args.size is not None else wl.default_size
    return wl.name, size, parse_limits(args.limits)


def rule_spec(spec: str) -> Any:
    """A CLI rule spec, checked now so a typo fails before any saturation."""
    from ..rules import RuleError, resolve

    if spec == "default":
        return None
    try:
        resolve(spec)
    except RuleError as err:
        raise CliError(str(err)) from None
    return spec


def at_least_one(args: Any, *names: str) -> None:
    for name in names:
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be >= 1, got {getattr(args, name)}")
