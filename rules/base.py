"""The rule interface and the registry that `eqsched.rules.resolve` picks rule sets from.

A rule is one transformation family in pattern form. It does not hold egglog commands itself: it
generates them from the program's analysis facts (`eqsched.egraph.facts.Facts`), because guards
name concrete dimension groups and blocks (which groups a stage reduces over, which stores are
unit-stride along which group). Adding a rule is one file with one class:

    @register
    class Interchange(Rule):
        '''loop(a, loop(b, body)) -> loop(b, loop(a, body))'''
        name = "interchange"

        def rewrites(self, facts):
            return [rewrite(...).to(...)]

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from typing import ClassVar

from eqsched.egraph.facts import Facts


class RuleError(ValueError):
    """A rule specification names an unknown rule or is malformed."""


class Rule:
    """One named ruleset of the schedule e-graph.

    `growth` rules add programs (rewrites that union new terms into e-classes); analysis rules
    (`growth = False`) only derive the positive relations that growth rules use as guards, and run
    to their own fixpoint before every growth step. `requires` names the analysis rules whose
    relations this rule's guards read; `resolve` adds them to any rule set that has this rule.
    """

    name: ClassVar[str]
    growth: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ()

    def rewrites(self, facts: Facts) -> list:
        """egglog commands (`rewrite(...).to(...)`, `rule(...).then(...)`) for this program."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<rule {self.name}>"


RULES: dict[str, Rule] = {}


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: instantiate the rule and file it under its name."""
    if not cls.__doc__ or "->" not in cls.__doc__:
        raise RuleError(f"rule {cls.__name__}: its docstring must show before -> after")
    rule = cls()
    if rule.name in RULES and type(RULES[rule.name]) is not cls:
        raise RuleError(f"a different rule named {rule.name!r} is already registered")
    RULES[rule.name] = rule
    return cls
