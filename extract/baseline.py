"""egglog's built-in extractor as a baseline: the root's smallest term (AST size), sized by a model.

    term = egglog_term(space)                     # e.g. the naive nest with the init fused in
    best = egglog_baseline(space, model, k=4)     # [(Candidate, predicted seconds), ...]

Loop cost multiplies by trip counts and depends on the loops around it, so a per-node additive
cost (what egglog's extractor minimizes) cannot see what makes a schedule fast (see
docs/ARCHITECTURE.md §4 The e-graph); this is the yardstick the search is compared against, not
a way to find programs.
egglog extracts structure only: the tile sizes are drawn at random and ranked by the model.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

import random

from eqsched.egraph.space import Space
from eqsched.egraph.term import BlockRef, Cached, PackRef, PieceLoop, RfactorLoop, Term
from eqsched.ir import LoopKind

from .cost import CostModel
from .search import Candidate, EvolutionarySearch


def egglog_term(space: Space) -> Term:
    """The term egglog's default extractor picks for the program's root class."""
    sat = space.saturation
    text = str(sat.egraph.extract(sat.root))
    # The extracted expression prints as Python calls of the language's constructors; read it
    # back with constructors that build Term pieces (no other names are visible to it).
    names = {
        "Root": _RootBuilder, "Body": _BodyBuilder, "Kind": _KindBuilder,
        "loop": lambda group, path, kind, body: PieceLoop(group, path, kind, body),
        "rloop": lambda group, path, kind, body: RfactorLoop(group, path, kind, body),
        "block": BlockRef, "cached": lambda stage, body: Cached(stage, body),
    }
    packs, inlined, body = eval(text, {"__builtins__": {}}, names)  # noqa: S307
    return Term(body, inlined, packs)


class _KindBuilder:
    serial = staticmethod(lambda: LoopKind.SERIAL.value)
    vector = staticmethod(lambda: LoopKind.VECTOR.value)
    unroll = staticmethod(lambda: LoopKind.UNROLL.value)
    parallel = staticmethod(lambda: LoopKind.PARALLEL.value)


class _BodyBuilder:
    nil = staticmethod(lambda: ())
    cons = staticmethod(lambda head, tail: (head,) + tail)


class _RootBuilder:
    rnil = staticmethod(lambda: ((), (), ()))

    @staticmethod
    def rcons(head, rest):
        packs, inlined, body = rest
        return packs, inlined, (head,) + body

    @staticmethod
    def inlined(stage, rest):
        packs, inlined, body = rest
        return packs, (stage,) + inlined, body

    @staticmethod
    def packed(block, buffer, dim, rest):
        packs, inlined, body = rest
        return (PackRef(block, buffer, dim),) + packs, inlined, body


def egglog_baseline(space: Space, model: CostModel, k: int = 1, *, seed: int = 0,
                    sizings: int = 64) -> list[tuple[Candidate, float]]:
    """egglog's structure with `sizings` random size assignments; the model's best `k`."""
    term = egglog_term(space)
    rng = random.Random(seed)
    search = EvolutionarySearch(space, model, seed=seed)
    options = space.size_options(term)
    found: dict[str, Candidate] = {}
    for _ in range(sizings):
        choice = {g: rng.choice(opts) for g, opts in options if opts}
        sizes = {(g, p): e for g, paths in choice.items() for p, e in paths.items()}
        prog = search.program_of(term, sizes)
        if prog is not None:
            cand = Candidate(term, dict(sorted(sizes.items())), prog, {}, choice, space.naive)
            found.setdefault(cand.hash, cand)
    return search.rank(list(found.values()))[:k]
