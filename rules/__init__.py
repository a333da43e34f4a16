"""eqsched.rules: the rewrite rules of the schedule e-graph (installed from the repo's rules/).

Each transformation of the manual schedule API is here in pattern form, one module per family,
each a `Rule` whose docstring draws it (before -> after) and whose guards come from analysis
relations (rules/analysis.py, kept apart from the growth rules). Pick rule sets by name:

    resolve(None)                      # the default set (Ansor/MetaSchedule's CPU space)
    resolve("-pack")                   # the default set without packing
    resolve(["tile", "reorder"])       # just these (plus the analysis rules they need)
    resolve(["-tile", MyTile()])       # swap in your own rule object

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import (  # noqa: F401  (importing a family module registers its rules)
    analysis,
    cache_write,
    fuse,
    inline,
    pack,
    parallel,
    reorder,
    rfactor,
    tile,
    unroll,
    vectorize,
)
from .base import RULES, Rule, RuleError, register

DEFAULT = ("tile", "reorder", "fuse", "inline", "vectorize", "unroll", "parallel", "cache_write",
           "pack", "rfactor")

Spec = str | Rule | Iterable[str | Rule] | None


def default_rules() -> list[Rule]:
    return _with_requirements([RULES[name] for name in DEFAULT])


def resolve(spec: Spec = None) -> list[Rule]:
    """Rules from names, Rule objects and "+name" / "-name" edits (comma-separated in a string).

    Edits apply to the listed rules, or to the default set when only edits are given. Analysis
    rules that a chosen rule requires are added."""
    if spec is None:
        return default_rules()
    if isinstance(spec, str):
        items: list = spec.replace(",", " ").split()
        if not items:  # a typo, not a request for the default set (that is None)
            raise RuleError(f"the rule spec {spec!r} names no rule")
    else:
        items = [spec] if isinstance(spec, Rule) else list(spec)
    edits = [i for i in items if isinstance(i, str) and i[:1] in "+-"]
    plain = [i for i in items if i not in edits]
    chosen = [_rule(i) for i in plain] if plain else [RULES[name] for name in DEFAULT]
    for edit in edits:
        rule = _rule(edit[1:])
        if edit[0] == "+" and rule.name not in {r.name for r in chosen}:
            chosen.append(rule)
        elif edit[0] == "-":
            chosen = [r for r in chosen if r.name != rule.name]
    return _with_requirements(chosen)


def _rule(item: str | Rule) -> Rule:
    if isinstance(item, Rule):
        return item
    if not isinstance(item, str) or item not in RULES:
        raise RuleError(f"unknown rule {item!r}; known: {', '.join(sorted(RULES))}")
    return RULES[item]


def _with_requirements(rules: list[Rule]) -> list[Rule]:
    out = list(rules)
    names = {r.name for r in out}
    for rule in out:  # grows while iterating: requirements of requirements
        for need in rule.requires:
            if need not in names:
                out.append(_rule(need))
                names.add(need)
    return out


__all__ = ["DEFAULT", "RULES", "Rule", "RuleError", "default_rules", "register", "resolve"]
