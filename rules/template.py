"""TEMPLATE for a new rewrite rule: copy this file to rules/<your_rule>.py, rename the class and
`name`, write `rewrites`, then check it:

    eqsched rules check unroll_innermost --module rules/template.py --workloads matmul
    eqsched rules check <your_rule> --module rules/<your_rule>.py

To make it part of eqsched, add its module to the imports in rules/__init__.py (and its name to
DEFAULT if every exploration should use it). This file itself is not imported by the package, so
the example below is not registered until you load it.

How a rule works. The schedule e-graph holds programs as terms of the language in
eqsched/egraph/lang.py: `loop(group, piece_path, kind, body)` for a loop over one piece of a
dimension group (paths like "3/4" name the 4th of a 4-way split), `cons`/`nil` lists of
statements (`Body`; the top level is a `Root` list), blocks, `cached` tiles, packs. A rule
returns egglog commands, built from the program's analysis facts (`eqsched.egraph.facts.Facts`:
the groups, their extents, which group each block stores unit-stride along, ...):

- `rewrite(lhs).to(rhs, guard1, guard2)` adds `rhs` to the e-class of every `lhs` that matches
  when the guards hold; variables like `b` (a body) and `g`, `p` (group, path) come from
  rules/analysis.py.
- Guards are analysis relations (rules/analysis.py): `blocks_only(b)`, `reg_tile(b)`,
  `unit_stride(b, group)`, ... A rule that reads one names its analysis rule in `requires`.
- The docstring must draw the rewrite (`before -> after`): `@register` refuses a rule without.

Every term the rule creates must be a program the manual schedule primitives can build
(eqsched/egraph/derive.py) and must compute what the start computes: `rules check` executes
the programs before and after against numpy and reports the smallest that differs.

See docs/ARCHITECTURE.md §15 Extending eqsched.
"""

from __future__ import annotations

from egglog import rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Kind, loop
from eqsched.rules.analysis import b, blocks_only, g, p
from eqsched.rules.base import Rule, register


@register
class UnrollInnermost(Rule):
    """Unroll a serial loop whose body is blocks only (the innermost loop of a nest).

        loop(C.k, "1/2", serial, [C.update]) -> loop(C.k, "1/2", unroll, [C.update])
    """

    name = "unroll_innermost"
    requires = ("nesting",)  # the analysis that derives `blocks_only`

    def rewrites(self, facts: Facts) -> list:
        # One command for every group: the pattern's variables match any group and piece.
        return [rewrite(loop(g, p, Kind.serial(), b))
                .to(loop(g, p, Kind.unroll(), b), blocks_only(b))]
