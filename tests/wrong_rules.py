"""A deliberately wrong rule, for `eqsched rules check` to catch: vectorize any innermost loop,
having forgotten the guard that no block reduces over it (its lanes would race on one
accumulator). `eqsched rules check vectorize_unguarded --module
tests/wrong_rules.py` must report it unsound, with the smallest failing program."""

from egglog import String, rewrite

from eqsched.egraph.lang import Kind, loop
from eqsched.egraph.term import split_path
from eqsched.rules.analysis import b, blocks_only, levels, tiled
from eqsched.rules.base import Rule, register


@register
class VectorizeUnguarded(Rule):
    """Vectorize the innermost loop of any group (the guard against reduced groups forgotten).

        loop(C.k, "3/4", serial, [C.update]) -> loop(C.k, "3/4", vector, [C.update])
    """

    name = "vectorize_unguarded"
    requires = ("nesting",)

    def rewrites(self, facts):
        out = []
        for group in sorted(facts.extents):
            ways = levels(facts, group)
            paths = ("", split_path("", ways - 1, ways)) if tiled(facts.extents[group]) else ("",)
            for path in paths:
                gr, pa = String(group), String(path)
                out.append(rewrite(loop(gr, pa, Kind.serial(), b))
                           .to(loop(gr, pa, Kind.vector(), b), blocks_only(b)))
        return out
