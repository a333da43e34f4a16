"""Inlining an elementwise intermediate into its readers.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, eq, function, relation, rewrite, rule, union, var

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Root, program_root

from .analysis import alone, h, inlinable, r, rest, s_lacks, s_only
from .base import Rule, register


@function
def without(stmts: Root, stage: String) -> Root:
    """The root statement list minus stage's nest. Not a program constructor: the space reads
    only eqsched.egraph.lang's constructors and skips these nodes."""


may_inline = relation("may_inline", Root, String)
r2 = var("r2", Root)


@register
class Inline(Rule):
    """Drop the root-level nest of an elementwise intermediate D, substituting D in its readers.

        program [C-nest ; D-nest ; F-nest] -> inlined(D, [C-nest ; F-nest])

    Spelled as `lang.root_expr` does (inlined stages above the statement list, in program
    order), so that the inlined node never sits in the class of its own child: the list without
    D is built by `without`, which walks the list to D's nest. Only a nest holding D alone is
    dropped; stages are inlined in program order, so each program has one spelling.
    """

    name = "inline"
    requires = ("alone", "lacks", "only_stage")

    def rewrites(self, facts: Facts) -> list:
        stages = [String(stage) for stage in inlinable(facts)]
        out = []
        for n, stage in enumerate(stages):
            out += [
                rule(program_root(r)).then(may_inline(r, stage)),
                rule(may_inline(r, stage), alone(r, stage))
                .then(union(r).with_(Root.inlined(stage, without(r, stage)))),
                rewrite(without(Root.rcons(h, rest), stage)).to(rest, s_only(h, stage)),
                rewrite(without(Root.rcons(h, rest), stage))
                .to(Root.rcons(h, without(rest, stage)), s_lacks(h, stage)),
            ]
            out += [rule(may_inline(r, stage), may_inline(r, later),
                         eq(r2).to(without(r, stage))).then(may_inline(r2, later))
                    for later in stages[n + 1:]]
        return out
