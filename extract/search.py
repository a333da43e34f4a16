"""Choose programs from the space: an evolutionary search over a walk's choices, scored by a
cost model (MetaSchedule's evolutionary search, over the e-graph instead of traces).

A candidate's genome is the node picked at every slot the walk reached (`Space.walk`) and one size
assignment per dimension group (`Space.size_options`); its phenotype is the concrete program.
Fresh candidates are uniform draws from the space (`Space.program` of a random index, with the
picks that spell it); mutants re-walk with one choice changed; a crossover child is one parent
with the other's choices inside one top-level statement both have (a stage of a chain).

    search = EvolutionarySearch(space, get_cost_model("analytic"), seed=0)
    batch = search.propose(8, exclude=measured_hashes, elites=best_measured_candidates)

Each round starts from the elites (measured winners), the survivors of the last round and fresh
random walks; it mutates the best (re-pick one slot, re-size one group, or nudge one factor of
two between two pieces of a group) and crosses pairs of them, keeps the best distinct programs,
and returns the top `k` the caller has not measured, with a few random picks mixed in so a wrong
model still sees new ground.
Each generation also adds every parent's vector twin (the loop around its reduction vectorized)
and, on several threads, every member's parallel twin (its root loops made parallel), where the
space has that program, as MetaSchedule's ParallelizeVectorizeUnroll does to every sketch.
Each sketch's best two stay among the parents and survivors (`_with_every_sketch`), so one
sketch cannot crowd out the others before their sizes are tuned.
A round evolves for `generations` generations, and on (up to `max_generations`) while the
predicted top `k` still gains: large spaces (fused chains) need many more than small ones. The
first round, with no elites or survivors to start from, evolves up to `first_islands`
populations from separate draws and merges them (an island model), each `first_population`
strong (by default a later round's, twice that for a chain of reductions): one population often
converges on a poor sketch of a chain. It stops adding populations once the best is predicted
to take at most `settled_s` (explore: `SETTLED_SHARE` of the peak FLOP rate of the cores the
program may use; by default every island runs).

A space no larger than one round of evolution could realize (`whole_space`) is ranked whole
instead: every program is built once, each round ranks them all, and a round that finds fewer
than `k` untried says so (`exhausted`: "the space has N programs; all measured"). Every loop of
a round is bounded whatever the space's size: filling a population ends after `max_attempts`
draws in a row add nothing new.

`wait_turn`, if given, is called between small units of work (one realization, one batch of
predictions) and may block: explore stops the search that way while a candidate is timed on
the other core (a search running beside it skews the timing: docs/ARCHITECTURE.md §17.5).

See docs/ARCHITECTURE.md §9 The search.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from eqsched.egraph.derive import DeriveError, derive, realize, verify
from eqsched.egraph.facts import Facts
from eqsched.egraph.space import Slot, Space
from eqsched.egraph.term import (
    BlockRef,
    Cached,
    PackRef,
    PieceLoop,
    RfactorLoop,
    Sizes,
    Stmt,
    Term,
    pack_symbol,
    show,
    split_path,
    symbols,
    walk,
)
from eqsched.expr import Const, Select, Var, loads
from eqsched.ir import Block, Loop, LoopKind, Program, Scope
from eqsched.schedule import ScheduleError

from .cost import CostModel
from .sketches import blocked_sketches

T = TypeVar("T")
# Code-size limit (TVM's max_unroll_step): nested unrolled loops multiply, and LLVM takes minutes
# on thousands of copies of a loop body (docs/ARCHITECTURE.md §17.3).
MAX_UNROLLED = 128
PROGRAMS_KEPT = 4096
PREDICTION_BATCH = 32  # programs predicted between two calls of wait_turn
# Beyond `generations`, evolution goes on while the predicted top of the round still improves.
STALE_GENERATIONS, MIN_GAIN = 2, 0.01
TILE_CUTS = (1, 2, 4)  # a register-tiled twin's longest unrolled piece: kept, halved, quartered
MAX_TILE_ROWS = 8  # a reshaped register tile takes in a loop of at most this many steps
COLLAPSE_TRIES = 3  # loops a parallel twin tries to run in parallel with an unbalanced root loop
CROSSOVER_SHARE = 0.25  # of each generation's children; the rest are mutants
# Of fresh draws, the share whose groups all take exact factorizations (MetaSchedule's perfect
# tiles), and of re-sized groups, the share drawn among those: remainder tiles outnumber them
# (a power of two gains the 3 x 2^a tiles) and uniform draws then miss the whole-tile sketches.
PERFECT_SHARE = 0.5
SKETCH_NICHE = 2  # of each sketch's best kept among the parents and the pool (_with_every_sketch)
# Programs of one kernel (`Candidate.kernel`) a run measures before its other twins wait until
# every other fresh program of a round has been proposed.
TWINS_MEASURED = 2
PROBE_MISSES = 2  # probes in a row slower than their parents before a search stops probing
ROOT_LIST_OPS = frozenset({"rcons", "rnil", "inlined", "packed"})
# Per top-level statement, in program order: its walk's slots and the groups it loops over.
Statements = tuple[tuple[tuple[Slot, ...], frozenset[str]], ...]


def unrolled_copies(prog: Program) -> int:
    """Block instances the unrolled loops write out in the code, summed over blocks."""
    total = 0
    for blk in prog.blocks():
        copies = 1
        for lp in prog.enclosing(blk.name):
            if lp.kind == LoopKind.UNROLL:
                copies *= lp.extent
        total += copies
    return total


def _unrolled_chains(term: Term) -> list[tuple[tuple[str, str], ...]]:
    """Per block of the term, the symbols of the unrolled loops around it."""
    return [tuple((lp.group, lp.path) for lp in outer if lp.kind == LoopKind.UNROLL)
            for stmt, outer in walk(term.body) if isinstance(stmt, BlockRef)]


def _term_unrolled(chains: list[tuple[tuple[str, str], ...]], sizes: Sizes) -> int:
    """`unrolled_copies` of the term's blocks, read off the term (copy nests not counted)."""
    return sum(math.prod(sizes[s] for s in chain) for chain in chains)


@dataclass(eq=False)
class Candidate:
    """One concrete program of the space and the choices that made it."""

    term: Term
    sizes: Sizes
    program: Program
    picks: dict[Slot, int] = field(repr=False)  # slot -> index into space.choices(slot)
    assignment: dict[str, dict[str, int]] = field(repr=False)  # group -> {path: extent}
    naive: Program = field(repr=False)  # the space's naive program, which the trace starts from
    statements: Statements = field(default=(), repr=False)
    hash: str = ""

    def __post_init__(self) -> None:
        self.hash = self.hash or self.program.hash()

    @property
    def structure(self) -> str:
        """The term in one line, as the database stores it."""
        return show(self.term)

    @functools.cached_property
    def sketch(self) -> tuple:
        """What MetaSchedule would call its sketch, coarsely: the local tiles and packed
        operands the program allocates and the axes its reduction's vector loops run along,
        without sizes, orders or other annotations (what mutation tunes)."""
        made = tuple(sorted(b.name for b in self.program.buffers
                            if b.scope == Scope.LOCAL or b.name.endswith("_packed")))
        return made, tuple(sorted(_reduction_vector_axes(self.program.body)))

    @functools.cached_property
    def kernel(self) -> tuple:
        """The program without its fills of a constant (a reduction's zeroed output): each
        other block with the loops around it (name, extent, kind), and the local and packed
        buffers. Twins that differ only in how they zero an output run alike, and the model
        ranks them alike: a round's top would be one kernel many times over."""
        prog = self.program
        nests = tuple((blk.name, tuple((lp.name, lp.extent, lp.kind)
                                       for lp in prog.enclosing(blk.name)))
                      for blk in prog.blocks() if not isinstance(blk.value, Const))
        return nests, self.sketch[0]

    @functools.cached_property
    def trace(self) -> list[dict]:
        """The manual trace that builds the program from the naive one (`derive`), derived on
        first use and kept; raises DeriveError (every time) when the primitives cannot."""
        return derive(self.term, self.sizes, self.naive)


class EvolutionarySearch:
    """Proposes the candidates `model` ranks best, round after round; deterministic by seed."""

    def __init__(self, space: Space, model: CostModel, *, seed: int = 0, population: int = 192,
                 generations: int = 5, max_generations: int = 20, survivors: int = 48,
                 random_fraction: float = 0.125, max_attempts: int = 50,
                 max_unrolled: int = MAX_UNROLLED, first_islands: int = 3,
                 first_population: int | None = None,
                 settled_s: float = 0.0, whole_space: int | None = None,
                 wait_turn: Callable[[], object] | None = None, threads: int = 1):
        self.space, self.model = space, model
        self.threads = threads
        self.wait_turn = wait_turn or (lambda: None)
        self.rng = random.Random(seed)
        self.population, self.generations = population, generations
        self.max_generations = max(generations, max_generations)
        self.survivors, self.random_fraction = survivors, random_fraction
        self.max_attempts, self.max_unrolled = max_attempts, max_unrolled
        self.first_islands, self.settled_s = first_islands, settled_s
        self.first_population = (first_population if first_population is not None
                                 else 2 * population if _is_chain(space) else population)
        # A space no larger than one round of evolution could realize is ranked whole.
        self.whole_space = (population * (1 + self.max_generations) if whole_space is None
                            else whole_space)
        self.exhausted = ""  # why the last `propose` came short of `k`, when it did
        self._total: int | None = None  # the space's program count, on first need
        self._whole: list[Candidate] | None = None  # every program of a whole-ranked space
        self._kept: list[Candidate] = []  # the last round's best, re-scored next round
        # realize() is the expensive part; bounded, since a long run builds tens of thousands.
        self._programs: OrderedDict[tuple, Program | None] = OrderedDict()
        self._verified_hashes: set[str] = set()
        self._perfect_options: dict[int, tuple[list, list]] = {}  # id(options) -> it, perfect
        self._parallel_twins: dict[str, Candidate | None] = {}  # this round's, by hash
        self._vector_twins: dict[str, Candidate | None] = {}  # likewise
        self._tile_twins: dict[str, list[Candidate]] = {}  # likewise
        self._reshaped_twins: dict[str, list[Candidate]] = {}  # likewise
        self._epilogue_twins: dict[str, Candidate | None] = {}  # likewise
        self._packed_twins: dict[str, list[Candidate]] = {}  # likewise
        self._proposed: Counter[tuple] = Counter()  # kernel -> its programs proposed so far
        self._probed: set[str] = set()  # elites whose probes were made
        # (probe's hash, its parent's, round made), not yet judged
        self._probes_made: list[tuple[str, str, int]] = []
        self._probe_misses = 0  # probes in a row measured slower than their parents
        self._round = 0  # rounds proposed

    # ---- candidates -------------------------------------------------------------------------

    def random_candidate(self) -> Candidate | None:
        """A program drawn uniformly from the space (with the walk picks that spell it); None
        when `max_attempts` draws all fail (unbuildable, or over the unrolling limit)."""
        total = self._count()
        for _ in range(self.max_attempts):
            if total:
                term, sizes = self.space.program(self.rng.randrange(total))
                assignment = _assignment(sizes)
                if self.rng.random() < PERFECT_SHARE:
                    options = dict(self.space.size_options(term))
                    assignment = {g: self._perfect(g, options[g]) or sized
                                  for g, sized in assignment.items()}
                cand = self._grow(self.space.picks_for(term), assignment)
            else:
                cand = self._grow({}, {})
            if cand is not None:
                return cand
        return None

    @functools.cached_property
    def _blocked_seeds(self) -> list[Candidate]:
        """The space's blocked sketches (`sketches.blocked_sketches`) that it holds with their
        sizes, as candidates: every first population starts with them."""
        out = []
        for term, sizes in blocked_sketches(self.space.naive, self.space.facts,
                                            self.space.vector_lanes[1]):
            if not self.space.contains(term, sizes):
                continue
            cand = self._grow(self.space.picks_for(term), _assignment(sizes))
            if cand is not None and cand.term == term and cand.sizes == dict(sorted(sizes.items())):
                out.append(cand)
        return out

    def _count(self) -> int:
        if self._total is None:
            self._total = self.space.count()
        return self._total

    def every_candidate(self) -> list[Candidate]:
        """Every program of the space that builds within the unrolling limit, distinct, in
        index order; built on first use and kept (for spaces of at most `whole_space`)."""
        if self._whole is None:
            whole: dict[str, Candidate] = {}
            for index in range(self._count()):
                cand = self._candidate_at(index)
                if cand is not None:
                    whole.setdefault(cand.hash, cand)
            self._whole = list(whole.values())
        return self._whole

    def _candidate_at(self, index: int) -> Candidate | None:
        """The program with this index, exactly (nothing re-drawn), or None when it cannot be
        built or unrolls more than `max_unrolled` copies."""
        term, sizes = self.space.program(index)
        if _term_unrolled(_unrolled_chains(term), sizes) > self.max_unrolled:
            return None
        prog = self.program_of(term, sizes)
        if prog is None or unrolled_copies(prog) > self.max_unrolled:
            return None
        return Candidate(term, dict(sorted(sizes.items())), prog, self.space.picks_for(term),
                         _assignment(sizes), self.space.naive)

    def _grow(self, picks: dict[Slot, int], assignment: dict[str, dict[str, int]]
              ) -> Candidate | None:
        """Walk keeping the given picks where they still apply, pick the rest at random, then
        size every group (keeping a given assignment where it is still valid)."""
        term, used, statements = self._walk(picks)
        options = self.space.size_options(term)
        if not all(opts for _, opts in options):
            return None
        given: dict[str, dict[str, int]] = {}
        for group, opts in options:
            old = assignment.get(group)
            given[group] = old if old in opts else self._resize(group, opts)
        sized = dict(given)
        sizes = _sizes(sized)
        chains = _unrolled_chains(term)
        unrolled = {g for chain in chains for g, _ in chain}
        for _ in range(self.max_attempts):
            # Over the unrolling limit (known before the costly realization): re-size the groups
            # of the unrolled loops; nested unrolls of a uniform draw are mostly too long.
            if _term_unrolled(chains, sizes) <= self.max_unrolled:
                break
            for group, opts in options:
                if group in unrolled:
                    sized[group] = self._resize(group, opts)
            sizes = _sizes(sized)
        else:
            # Re-sizes stay over the limit when several statements unroll the same groups (each
            # nest of a fused epilogue repeats the reduction's tile), and shrinking the shared
            # groups would take the reduction's register tile with them. Keep the given sizes
            # and make unrolled loops serial instead, one at a time, each a statement's own
            # choice; a serial loop allows any extent, so the sizes stay valid.
            sized, sizes = given, _sizes(given)
            while _term_unrolled(chains, sizes) > self.max_unrolled:
                demoted = self._demoted(used, sizes)
                if demoted is None:  # no unrolled loop left that has a serial form
                    return None
                term, used, statements = self._walk(demoted)
                chains = _unrolled_chains(term)
        prog = self.program_of(term, sizes)
        if prog is None or unrolled_copies(prog) > self.max_unrolled:
            return None
        return Candidate(term, dict(sorted(sizes.items())), prog, used, sized, self.space.naive,
                         statements)

    def _walk(self, picks: dict[Slot, int]) -> tuple[Term, dict[Slot, int], Statements]:
        """The term the picks spell (random picks where they do not apply), the picks used, and
        per top-level statement its slots and the groups it loops over."""
        used: dict[Slot, int] = {}
        statements: list[tuple[list[Slot], set[str]]] = []
        in_statement = False

        def pick(slot: Slot, choices: list) -> object:
            nonlocal in_statement
            index = picks.get(slot)
            if index is None or index >= len(choices):
                index = self.rng.randrange(len(choices))
            used[slot] = index
            node = choices[index]
            # The walk is depth first: an `rcons` slot's statement is every slot up to the
            # next root-list slot.
            if node.op in ROOT_LIST_OPS:
                in_statement = node.op == "rcons"
                if in_statement:
                    statements.append(([], set()))
            elif in_statement:
                statements[-1][0].append(slot)
                if node.op in ("loop", "rloop"):
                    statements[-1][1].add(node.literals[0])
            return node

        term = self.space.walk(pick)
        return term, used, tuple((tuple(slots), frozenset(groups)) for slots, groups in statements)

    def _demoted(self, picks: dict[Slot, int], sizes: Sizes) -> dict[Slot, int] | None:
        """The picks with one unrolled loop that repeats its body, chosen at random, made serial
        (the serial node of the same piece over the same body, which `unroll` put in the same
        class); None when no such loop has one. Not every unrolled loop does: a rewrite can
        build a loop unrolled in a class of its own."""
        unrolled = []
        for slot, index in picks.items():
            choices = self.space.choices(slot)
            node = choices[index]
            if node.op == "loop" and node.literals[2] == LoopKind.UNROLL \
                    and sizes[node.literals[:2]] > 1:
                serial = (node.literals[0], node.literals[1], LoopKind.SERIAL.value)
                twin = next((i for i, other in enumerate(choices)
                             if other.op == "loop" and other.literals == serial
                             and other.children == node.children), None)
                if twin is not None:
                    unrolled.append((slot, twin))
        if not unrolled:
            return None
        slot, index = self.rng.choice(unrolled)
        return {**picks, slot: index}

    def _resize(self, group: str, options: list[dict[str, int]]) -> dict[str, int]:
        """A size assignment for the group: with chance PERFECT_SHARE among its exact
        factorizations (when it has any), otherwise among all its options."""
        if self.rng.random() < PERFECT_SHARE:
            perfect = self._perfect(group, options)
            if perfect is not None:
                return perfect
        return self.rng.choice(options)

    def _perfect(self, group: str, options: list[dict[str, int]]) -> dict[str, int] | None:
        """One of the group's options that splits its extent exactly (no remainder), or None."""
        extent = self.space.facts.extents.get(group)  # None: a pack's panel width
        if extent is None:
            return None
        # A group's option list is one shared object per (group, paths used) (the space caches
        # it), and filtering a long one on every draw and re-size was a tenth of a search.
        kept = self._perfect_options.get(id(options))
        if kept is None or kept[0] is not options:
            kept = options, [o for o in options if _splits_exactly(o, extent)]
            self._perfect_options[id(options)] = kept
        perfect = kept[1]
        return self.rng.choice(perfect) if perfect else None

    def program_of(self, term: Term, sizes: Sizes) -> Program | None:
        """The concrete program (memoized), or None if the primitives cannot build it. It is not
        verified (legal, and encoding back to the term): ranking does not need that, and
        `propose` verifies what it returns."""
        key = _program_key(term, sizes)
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        self.wait_turn()
        try:
            prog = realize(term, sizes, self.space.naive, verify=False)
        except (DeriveError, ScheduleError):
            # A structure the manual primitives cannot build (derive's known gaps) is skipped,
            # never guessed at.
            prog = None
        self._programs[key] = prog
        if len(self._programs) > PROGRAMS_KEPT:
            self._programs.popitem(last=False)
        return prog

    def _parallel_twins_of(self, cands: list[Candidate]) -> list[Candidate | None]:
        """On several threads, each candidate's `parallelized` twin (made once a round)."""
        if self.threads <= 1:
            return []
        return _once_a_round(self._parallel_twins, cands, self.parallelized)

    def parallelized(self, cand: Candidate) -> Candidate | None:
        """The candidate with each root nest's outermost loop of at least `threads` iterations
        made parallel, where the space has that program (a root loop of one iteration, a batch
        of one, may give way to the loop it holds); None when no root nest changes."""
        term = cand.term
        for index, stmt in enumerate(term.body):
            for variant in self._parallel_forms(stmt, cand.sizes):
                body = term.body[:index] + (variant,) + term.body[index + 1:]
                if self.space.contains(dataclasses.replace(term, body=body), cand.sizes):
                    term = dataclasses.replace(term, body=body)
                    break
        if term is cand.term:
            return None
        return self._grow(self.space.picks_for(term), cand.assignment)

    def _parallel_forms(self, stmt: Stmt, sizes: Sizes) -> Iterator[Stmt]:
        """A root statement's parallel forms that can keep `threads` cores busy: its loop made
        parallel (when its steps do not divide among the threads, first run in parallel with
        loops of its perfect nest: `_collapsed`), or the loop a one-iteration loop holds alone,
        moved out and made parallel."""
        if not isinstance(stmt, PieceLoop):
            return
        parallel = LoopKind.PARALLEL.value
        steps = sizes[stmt.group, stmt.path]
        inner = stmt.body[0] if len(stmt.body) == 1 else None
        # (steps, form): the loop made parallel, or the one a one-step loop holds moved out so
        plain: tuple[int, Stmt] | None = None
        if stmt.kind != parallel and steps >= self.threads:
            plain = steps, dataclasses.replace(stmt, kind=parallel)
        elif stmt.kind != parallel and steps == 1 and isinstance(inner, PieceLoop) \
                and sizes[inner.group, inner.path] >= self.threads:
            plain = sizes[inner.group, inner.path], dataclasses.replace(
                inner, kind=parallel, body=(dataclasses.replace(stmt, body=inner.body),))
        if plain is not None and plain[0] % self.threads == 0:
            yield plain[1]
            return
        if steps % self.threads and not isinstance(stmt, RfactorLoop) \
                and not (isinstance(inner, PieceLoop) and inner.kind == parallel):
            yield from self._collapsed(stmt, sizes)
        if plain is not None:
            yield plain[1]

    def _collapsed(self, root: PieceLoop, sizes: Sizes) -> Iterator[PieceLoop]:
        """`root` run in parallel with the loops of the chain of single loops under it down to
        the first of more than one step (that one too if `root` has one step), or further with
        a loop of the chain moved up to just under those: the threads then share the steps'
        product. Loops whose product divides among the threads first, each in chain order, at
        most `COLLAPSE_TRIES` moved."""
        chain = _single_loops_under(root)
        rolled = (LoopKind.SERIAL.value, LoopKind.UNROLL.value)
        top = next((n for n, lp in enumerate(chain) if sizes[lp.group, lp.path] > 1),
                   len(chain))
        steps = sizes[root.group, root.path]
        if steps < self.threads and top < len(chain) and chain[top].kind in rolled:
            steps *= sizes[chain[top].group, chain[top].path]
            top += 1
            if steps % self.threads == 0:
                yield self._parallel_prefix(root, chain, top)
        if any(lp.kind not in rolled for lp in chain[:top]):
            return

        def divides(n: int) -> bool:
            return steps * sizes[chain[n].group, chain[n].path] % self.threads == 0

        movable = [n for n in range(top, len(chain))
                   if chain[n].kind == LoopKind.SERIAL.value
                   and sizes[chain[n].group, chain[n].path] > 1]
        for n in sorted(movable, key=lambda n: not divides(n))[:COLLAPSE_TRIES]:
            order = chain[:top] + [chain[n]] + [lp for m, lp in enumerate(chain)
                                                if m >= top and m != n]
            yield self._parallel_prefix(root, order, top + 1)

    @staticmethod
    def _parallel_prefix(root: PieceLoop, chain: list[PieceLoop], depth: int) -> PieceLoop:
        """`root` holding `chain` (nested in that order), its first `depth` loops parallel."""
        parallel = LoopKind.PARALLEL.value
        loops = [dataclasses.replace(lp, kind=parallel) if n < depth else lp
                 for n, lp in enumerate(chain)]
        return dataclasses.replace(root, kind=parallel, body=(_nest(loops, chain[-1].body),))

    def _vector_twins_of(self, parents: list[Candidate]) -> list[Candidate | None]:
        """Each parent's `vectorized` twin (made once a round, as the parallel twins)."""
        return _once_a_round(self._vector_twins, parents, self.vectorized)

    def vectorized(self, cand: Candidate) -> Candidate | None:
        """The candidate with the innermost loop around each root nest's reduction made a
        vector loop, and in each nest of single loops around one elementwise block, at the
        root or fused under another stage's loops, the innermost loop over its store's
        unit-stride dimension moved innermost and made one, where the space has that program:
        the vector piece resized to a vector width (the widest the space allows), the other
        pieces of its group kept as far as the extent allows; None when no nest changes.
        MetaSchedule's ParallelizeVectorizeUnroll vectorizes every sketch's innermost spatial
        loop; in a uniform draw a vector loop is a rare choice (few sizes fit one), and a
        register tile found without one ranks below programs whose rows are vectors until a
        mutation hits both at once. An elementwise nest left after its reduction (a GELU after
        a matmul whose tile it could not join) needs a reorder as well: its loops follow the
        reduction's tile, whose unit-stride piece is rarely innermost. A residual add fused
        under a convolution's outermost loop loops over whole rows (56 points, no vector
        width): its row is split as the convolution splits it, the finest piece a vector."""
        term, sizes = cand.term, dict(cand.sizes)
        for index, stmt in enumerate(term.body):
            loop = _innermost_reduction_loop(stmt, self.space.facts)
            if loop is None or loop.kind == LoopKind.VECTOR.value:
                continue
            vector = dataclasses.replace(loop, kind=LoopKind.VECTOR.value)
            trial = dataclasses.replace(term, body=term.body[:index] + (
                _replaced(stmt, loop, vector),) + term.body[index + 1:])
            new_sizes = self._vector_sized(trial, loop, sizes)
            if new_sizes is not None and self.space.contains(trial, new_sizes):
                term, sizes = trial, new_sizes
        for index in range(len(term.body)):
            tried: set[str] = set()
            while (found := self._elementwise_vectorized(term, index, sizes, tried)) is not None:
                term, sizes = found
        if term is cand.term:
            return None
        return self._grow(self.space.picks_for(term), _assignment(sizes))

    def _elementwise_vectorized(self, term: Term, index: int, sizes: Sizes, tried: set[str]
                                ) -> tuple[Term, Sizes] | None:
        """`term` and `sizes` with the first elementwise nest of statement `index` whose block
        is not in `tried` vectorized along its store's unit stride (`_unit_stride_vector`), where
        the space has that program; None when no nest of the statement is left to try. Each
        block is tried once."""
        stmt = term.body[index]
        for head in _elementwise_nests(stmt, self.space.facts):
            block = _loop_chain(head)[1].name
            if block in tried:
                continue
            tried.add(block)
            moved = _unit_stride_vector(head, self.space.facts, term)
            if moved is None:
                continue
            nest, loop = moved
            trial = dataclasses.replace(term, body=term.body[:index] + (
                _replaced(stmt, head, nest),) + term.body[index + 1:])
            new_sizes = self._vector_sized(trial, loop, sizes)
            if new_sizes is not None and self.space.contains(trial, new_sizes):
                return trial, new_sizes
        return None

    def _vector_sized(self, term: Term, loop: PieceLoop, sizes: Sizes) -> Sizes | None:
        """`sizes` with `loop`'s piece a vector width in `term`: of the space's options for its
        group, the one keeping most other pieces, then the widest; None when none fits."""
        options = dict(self.space.size_options(term)).get(loop.group, [])
        mine = {path: extent for (g, path), extent in sizes.items() if g == loop.group}
        fitting = [o for o in options if o.get(loop.path) in self.space.vector_lanes]
        if not fitting:
            return None
        kept = max(sum(o[p] == mine.get(p) for p in o if p != loop.path) for o in fitting)
        best = max((o for o in fitting
                    if sum(o[p] == mine.get(p) for p in o if p != loop.path) == kept),
                   key=lambda o: (o[loop.path], sorted(o.items())))
        return {**{k: v for k, v in sizes.items() if k[0] != loop.group},
                **{(loop.group, p): e for p, e in best.items()}}

    def _tile_twins_of(self, parents: list[Candidate]) -> list[Candidate]:
        """Each parent's `register_tiled` twins (made once a round, as the vector twins)."""
        return [twin for twins in _once_a_round(self._tile_twins, parents, self.register_tiled)
                for twin in twins]

    def register_tiled(self, cand: Candidate) -> list[Candidate]:
        """The candidate with each root nest's innermost reduction loop moved out of the
        unrolled loops that hold it alone (so the unrolled and vector loops under it form a
        register tile whose accumulators live across the reduction), as the space has it; one
        twin with the sizes kept, and one each with the longest of those unrolled pieces cut
        to a half and a quarter (the tile then holds fewer accumulators; a piece of the same
        group that no loop unrolls takes up the factor). MetaSchedule's multi-level
        tiling builds every sketch with its innermost reduction tile outside the innermost
        spatial tile; here that is one reorder, and in a chain's space of 1e38 programs the
        search seldom made it together with the sizes it needs (its lone first step holds more
        accumulators than registers and is predicted slower). Empty when no nest changes."""
        raised = []  # (index, new root statement, the longest unrolled loop moved under it)
        for index, stmt in enumerate(cand.term.body):
            loop = _innermost_reduction_loop(stmt, self.space.facts, over_reduce=True)
            moved = (_raised_out_of_unrolled(stmt, loop, cand.sizes) if loop is not None
                     else None)
            if moved is not None:
                raised.append((index, *moved))
        if not raised:
            return []
        body = list(cand.term.body)
        for index, stmt, _ in raised:
            body[index] = stmt
        term = dataclasses.replace(cand.term, body=tuple(body))
        options = dict(self.space.size_options(term))
        # The factor cut from the tile goes to a piece no loop unrolls (groups are shared by
        # the stages of a chain): growing an unrolled piece would take the program over the
        # unrolling limit, and `_grow` would re-size it at random.
        unrolled = {(g, p) for chain in _unrolled_chains(term) for g, p in chain}
        twins = []
        for cut in TILE_CUTS:
            sizes = dict(cand.sizes)
            for _, _, longest in raised:
                group, path = longest.group, longest.path
                mine = {p: e for (g, p), e in sizes.items() if g == group}
                wanted = [o for o in options.get(group, [])
                          if o.get(path) == mine.get(path, 0) // cut
                          and all(o[p] == mine[p] for p in o if (group, p) in unrolled
                                  and p != path)]
                if cut > 1 and wanted:
                    nearest = min(wanted, key=lambda o: (_log_distance(o, mine),
                                                         sorted(o.items())))
                    sizes = {**{k: v for k, v in sizes.items() if k[0] != group},
                             **{(group, p): e for p, e in nearest.items()}}
            if (cut == 1 or sizes != cand.sizes) and self.space.contains(term, sizes):
                twin = self._grow(self.space.picks_for(term), _assignment(sizes))
                if twin is not None and twin.sizes == dict(sorted(sizes.items())):
                    twins.append(twin)
        return twins

    def _reshaped_twins_of(self, parents: list[Candidate]) -> list[Candidate]:
        """Each parent's `reshaped` twins (made once a round, as the vector twins)."""
        return [twin for twins in _once_a_round(self._reshaped_twins, parents, self.reshaped)
                for twin in twins]

    def reshaped(self, cand: Candidate) -> list[Candidate]:
        """The candidate with one root nest's register tile reshaped: a short loop of the
        perfect nest around its innermost reduction loop moved into the tile (unrolled, under
        the reduction loop), and one unrolled loop of another group taken out of the tile to
        where the reduction loop was, serial (or no loop taken out); one twin per such pair
        the space has, sizes kept. A tile of one row by sixteen vectors loads sixteen vectors
        per sixteen FMAs, one of four rows by four vectors four; the register-tiled twins
        only reorder loops that are unrolled already, and a mutation changes one loop's kind
        or place at a time, each step predicted slower than both ends."""
        twins = []
        for index, stmt in enumerate(cand.term.body):
            loop = _innermost_reduction_loop(stmt, self.space.facts, over_reduce=True)
            if loop is None or loop.kind != LoopKind.SERIAL.value:
                continue
            for variants in _reshaped_nests(stmt, loop, cand.sizes):
                for variant in variants:  # the loop taken out serial, else unrolled
                    body = cand.term.body[:index] + (variant,) + cand.term.body[index + 1:]
                    term = dataclasses.replace(cand.term, body=body)
                    if self.space.contains(term, cand.sizes):
                        twin = self._grow(self.space.picks_for(term), cand.assignment)
                        # Re-sized or demoted (over the unrolling limit): not the tile it
                        # was meant to be.
                        if twin is not None and twin.sizes == cand.sizes \
                                and twin.term == term and twin.hash != cand.hash:
                            twins.append(twin)
                        break
        return twins

    def _epilogue_twins_of(self, parents: list[Candidate]) -> list[Candidate | None]:
        """Each parent's `epilogue_fused` twin (made once a round, as the parallel twins)."""
        return _once_a_round(self._epilogue_twins, parents, self.epilogue_fused)

    def epilogue_fused(self, cand: Candidate) -> Candidate | None:
        """The candidate with its elementwise intermediates inlined and the statement that then
        reads a reduction fused into the reduction's nest, as deep as the space allows (Ansor's
        AutoInline and its fused consumer: a convolution's scale-shift and ReLU computed in its
        tile while the tile is in cache); None when the space has no such program. In a
        uniform draw the inlined forms are rare: each intermediate's own nest multiplies the
        programs that keep it (none of 150 draws of the ResNet block's first task inlined its
        scale-shift), and a single mutation cannot both drop a nest and fuse another."""
        term = self._inlined(cand.term, self._epilogue_stages, cand.sizes)
        for index in range(len(term.body) - 1):
            fused = self._fused_into(term, index, cand.sizes)
            if fused is not None:
                term = fused
                break
        if term == cand.term:  # each step above kept a term the space holds
            return None
        return self._grow(self.space.picks_for(term), _assignment(_sizes_of(term, cand.sizes)))

    def padding_inlined(self, cand: Candidate) -> Candidate | None:
        """The candidate with each padding it writes in a nest of its own read instead where
        its reduction reads it (a select of the input in the kernel, whose border steps the
        backend peels off), sizes kept; None when the space has no such program. Whether
        that beats the pass over memory that the copy costs depends on how the backend cuts
        the loops around the border and on the tile, which the cost model does not see: this
        twin is one of the `probes`, measured whatever the model predicts."""
        term = self._inlined(cand.term, self._padding_stages, cand.sizes)
        if term == cand.term:
            return None
        twin = self._grow(self.space.picks_for(term), _assignment(_sizes_of(term, cand.sizes)))
        return twin if twin is not None and twin.term == term else None

    def probes(self, elites: list[Candidate], exclude: set[str]) -> list[Candidate]:
        """Twins of the best measured program that measurement decides, not the model: its
        `padding_inlined` twin, once for each program that is best when a round begins. The
        analytic model charges a select's tests in every step of its loops, and the backend
        leaves them only at the border; a model told so moved its rankings elsewhere (AVX2
        convolutions explored to two thirds of their rate, docs/ARCHITECTURE.md §17.7), and
        a uniform draw almost never inlines a stage, so without a probe the search would
        never measure the form. A probe is judged against its parent two rounds later (by
        then both are measured, even with a round in flight), by their places in the
        measured top `elites`: ahead of its parent, it paid; behind it, a miss; with both out
        of the top (better programs came meanwhile), undecided. Judged against the measured
        top instead, the twin of a best found early, itself far from the top, missed whether
        the form paid or not, and probing stopped before the tile that it would have paid
        for was found. Where the form does not pay (PROBE_MISSES misses in a row), the
        search stops probing."""
        self._round += 1
        place = {c.hash: i for i, c in enumerate(elites)}
        for made in [m for m in self._probes_made if m[2] <= self._round - 2]:
            self._probes_made.remove(made)
            probe, parent = (place.get(h, len(elites)) for h in made[:2])
            if probe < parent:
                self._probe_misses = 0
            elif parent < probe:
                self._probe_misses += 1
        if not elites or elites[0].hash in self._probed or self._probe_misses >= PROBE_MISSES:
            return []
        self._probed.add(elites[0].hash)
        twin = self.padding_inlined(elites[0])
        if twin is None or twin.hash in exclude or not self._verified(twin):
            return []
        self._probes_made.append((twin.hash, elites[0].hash, self._round))
        return [twin]

    def _inlined(self, term: Term, stages: frozenset[str], sizes: Sizes) -> Term:
        """`term` with each root nest that computes one stage of `stages` alone dropped and the
        stage inlined into its readers, where the space has that program."""
        body, inlined = list(term.body), list(term.inlined)
        for index in reversed(range(len(body))):
            names = _block_names(body[index])
            (name,) = names if len(names) == 1 else ("",)
            if name in stages and name not in inlined:
                trial = dataclasses.replace(term, body=tuple(body[:index] + body[index + 1:]),
                                            inlined=tuple(sorted(
                                                [*inlined, name], key=self._stage_order)))
                if self._holds(trial, sizes):
                    del body[index]
                    inlined = list(trial.inlined)
        return dataclasses.replace(term, body=tuple(body), inlined=tuple(inlined))

    def _packed_twins_of(self, parents: list[Candidate]) -> list[Candidate]:
        """Each parent's `packed` twins (made once a round, as the vector twins)."""
        return [twin for twins in _once_a_round(self._packed_twins, parents, self.packed)
                for twin in twins]

    def packed(self, cand: Candidate) -> list[Candidate]:
        """The candidate with one more operand of a root nest's reduction packed, in panels as
        wide as the columns of its register tile (the pieces of the vector loop's group inside
        the innermost reduction loop), where the space packs it so; one twin per operand and
        dimension, sizes kept. Unpacked, B[k, j] under a tile of 16 columns is a line from
        each of rows 4 KiB apart, which no prefetcher follows: such AVX2 tiles ran at half the
        rate of the same tiles over B packed. MetaSchedule rewrites the layout of every dense
        operand; in a uniform draw a pack of the tile's own width is a rare pick."""
        facts = self.space.facts
        twins = []
        for stmt in cand.term.body:
            tile = _tile_columns(stmt, facts, cand.sizes)
            if tile is None:
                continue
            block, group, columns = tile
            packed = {p.buffer for p in cand.term.packs}
            for load in loads(facts.blocks[block].value):
                if load.buffer in packed or len(load.indices) < 2:
                    continue
                packed.add(load.buffer)
                for dim, index in enumerate(load.indices):
                    if isinstance(index, Var) and facts.groups.get((block, index.name)) == group:
                        twin = self._with_pack(cand, PackRef(block, load.buffer, dim), columns)
                        if twin is not None:
                            twins.append(twin)
        return twins

    def _with_pack(self, cand: Candidate, pack: PackRef, factor: int) -> Candidate | None:
        """The candidate with `pack` at `factor` added, where the space has that program (the
        root list holds its packs in one order: each place is tried)."""
        sizes = {**cand.sizes, pack_symbol(pack.buffer): factor}
        packs = cand.term.packs
        for place in range(len(packs) + 1):
            term = dataclasses.replace(cand.term, packs=packs[:place] + (pack,) + packs[place:])
            if self.space.contains(term, sizes):
                twin = self._grow(self.space.picks_for(term), _assignment(sizes))
                return twin if twin is not None and twin.term == term else None
        return None

    def _holds(self, term: Term, sizes: Sizes) -> bool:
        """The space has `term` with the candidate's sizes of the pieces it still loops over."""
        return self.space.contains(term, _sizes_of(term, sizes))

    @functools.cached_property
    def _epilogue_stages(self) -> frozenset[str]:
        """Plain stages that read a reduction elementwise, directly or through other such
        stages, and that no reduction reads: not a convolution's padding, nor mm_exp_mm's exp,
        whose readers would compute them again for every point that reads them."""
        facts = self.space.facts
        plain = self._plain_stages
        found = {w for w, _, _ in facts.elementwise if w not in plain}
        while True:
            more = {r for w, r, _ in facts.elementwise if w in found and r in plain} - found
            if not more:
                break
            found |= more
        return frozenset((found & plain) - self._reduced_stages)

    @functools.cached_property
    def _padding_stages(self) -> frozenset[str]:
        """Plain stages that a reduction reads and that select between a load and a constant:
        a convolution's padding, whose inlined form loads the input only inside the border."""
        facts = self.space.facts
        return frozenset(b for b in self._reduced_stages
                         if isinstance(facts.blocks[b].value, Select))

    @functools.cached_property
    def _plain_stages(self) -> frozenset[str]:
        """Stages of one block that reduce nothing."""
        return frozenset(b for b, blk in self.space.facts.blocks.items()
                         if blk.reduce is None and blk.stage == b)

    @functools.cached_property
    def _reduced_stages(self) -> frozenset[str]:
        """Plain stages whose buffer a reduction reads."""
        blocks = self.space.facts.blocks
        read = {ld.buffer for blk in blocks.values() if blk.reduce for ld in loads(blk.value)}
        return frozenset(b for b in self._plain_stages if blocks[b].buffer in read)

    @functools.cached_property
    def _stage_order(self) -> Callable[[str], int]:
        """A stage's place in the program (`Term.inlined` lists stages in program order)."""
        order = {name: n for n, name in enumerate(
            dict.fromkeys(b.stage for b in self.space.naive.blocks()))}
        return order.__getitem__

    def _fused_into(self, term: Term, index: int, sizes: Sizes) -> Term | None:
        """`term` with statement index+1 (one plain block's nest) moved into statement index
        (a reduction's nest), under the deepest loop of the reduction's path whose loops are
        over groups the reader shares, those loops made serial; None when the space has no
        such program."""
        facts = self.space.facts
        anchor, own = term.body[index], _loop_chain(term.body[index + 1])
        updates = [b for b in _block_names(anchor) if facts.blocks[b].reduce is not None]
        if own is None or not updates or facts.blocks[own[1].name].reduce:
            return None
        loops, leaf = own
        shared = set(facts.groups_of(leaf.name))
        shared -= set().union(*(facts.reduce_groups[u] for u in updates))
        chain: list[PieceLoop] = []
        for loop in _path_to_block(anchor, updates[0]):
            if loop.group not in shared or isinstance(loop, RfactorLoop):
                break
            chain.append(loop)
        for depth in range(len(chain), 0, -1):
            outer = {(lp.group, lp.path) for lp in chain[:depth]}
            inner = [lp for lp in loops if (lp.group, lp.path) not in outer]
            nest: Stmt = leaf
            for lp in reversed(inner):
                nest = dataclasses.replace(lp, body=(nest,))
            # Fusion joins serial loops: an unrolled or parallel one of the chain runs serial
            # (the parallel twin may share the fused loop among threads again).
            placed = _serial_chain_with(anchor, chain[:depth], nest)
            trial = dataclasses.replace(term, body=term.body[:index] + (placed,)
                                        + term.body[index + 2:])
            if self._holds(trial, sizes):
                return trial
        return None

    def mutate(self, cand: Candidate) -> Candidate | None:
        """One random change: re-pick a slot, re-size a group, or move a factor between pieces."""
        move = self.rng.random()
        if move < 0.4 and cand.picks:
            # Walk order, not e-class ids: egglog numbers classes differently from run to run.
            slot = self.rng.choice(list(cand.picks))
            n = len(self.space.choices(slot))
            if n > 1:
                picks = dict(cand.picks)
                picks[slot] = (picks[slot] + self.rng.randrange(1, n)) % n
                return self._grow(picks, cand.assignment)
        groups = sorted(cand.assignment)
        if not groups:
            return None
        group = self.rng.choice(groups)
        options = dict(self.space.size_options(cand.term))[group]
        if move < 0.7:
            choice = self._resize(group, options)
        else:
            choice = self._nudge(cand.assignment[group], options)
            if choice is None:
                return None
        return self._grow(cand.picks, {**cand.assignment, group: choice})

    def crossover(self, a: Candidate, b: Candidate) -> Candidate | None:
        """A child of two parents: `a` with the choices of `b` inside one top-level statement
        both have (the same e-class: the same stage, with the same things fused into it), and
        the sizes of the groups that statement loops over. Stages of a chain cost about
        additively, so a child can take one parent's good first matmul and the other's good
        second one, which single mutations rarely assemble in a space of 1e38 programs. None
        when the parents share no statement."""
        heads = {slots[0] for slots, _ in a.statements if slots}
        shared = [(slots, groups) for slots, groups in b.statements if slots and slots[0] in heads]
        if not shared:
            return None
        slots, groups = shared[self.rng.randrange(len(shared))]
        picks = {**a.picks, **{slot: b.picks[slot] for slot in slots}}
        assignment = {**a.assignment, **{g: b.assignment[g] for g in groups if g in b.assignment}}
        return self._grow(picks, assignment)

    def _nudge(self, current: dict[str, int], options: list[dict[str, int]]
               ) -> dict[str, int] | None:
        """A nearest other assignment (log2 distance): a factor moved between two pieces."""

        others = [o for o in options if o != current]
        if not others:
            return None
        nearest = min(_log_distance(o, current) for o in others)
        return self.rng.choice([o for o in others if _log_distance(o, current) == nearest])

    # ---- rounds -----------------------------------------------------------------------------

    def propose(self, k: int, exclude: Iterable[str] = (),
                elites: Iterable[Candidate] = ()) -> list[tuple[Candidate, float]]:
        """Up to `k` (candidate, predicted seconds) the caller has not measured (`exclude`):
        the `probes` of the best of `elites` (measured programs, best first), then the best
        predicted but a kernel's twins after every other kernel (`_twins_apart`), with about
        `random_fraction` of them random picks. Fewer than
        `k` only when the search ran out of untried programs; `exhausted` then says why."""
        excluded, elites = set(exclude), list(elites)
        known: dict[str, float] = {}  # the model does not change within a round
        if self._count() <= self.whole_space:
            ranked = self.rank(self.every_candidate(), known)
        else:
            ranked = self._evolved(elites, k, known)
        chosen = self.rank(self.probes(elites, excluded)[:k], known)
        excluded |= {c.hash for c, _ in chosen}
        fresh, twins = self._twins_apart([(c, s) for c, s in ranked if c.hash not in excluded])
        left = k - len(chosen)
        n_random = min(len(fresh) + len(twins), round(left * self.random_fraction)) \
            if left > 1 else 0
        best, used = self._verified_prefix(fresh + twins, left - n_random)
        chosen += best
        rest = fresh[used:]
        shuffled = self.rng.sample(rest, len(rest)) + twins[max(0, used - len(fresh)):]
        chosen += self._verified_prefix(shuffled, k - len(chosen))[0]
        self.exhausted = self._shortfall(len(ranked)) if len(chosen) < k else ""
        self._proposed.update(c.kernel for c, _ in chosen)
        return chosen

    def _twins_apart(self, ranked: list[tuple[Candidate, float]]
                     ) -> tuple[list[tuple[Candidate, float]], list[tuple[Candidate, float]]]:
        """`ranked` split in rank order: programs whose kernel has had fewer than
        TWINS_MEASURED proposed (this round's counted), and the rest, which a round proposes
        only when the first run out: it measures different kernels before one again."""
        seen = Counter(self._proposed)
        fresh, twins = [], []
        for entry in ranked:
            kernel = entry[0].kernel
            (fresh if seen[kernel] < TWINS_MEASURED else twins).append(entry)
            seen[kernel] += 1
        return fresh, twins

    def _shortfall(self, ranked: int) -> str:
        """Why a round found fewer than `k` untried programs: a space ranked whole has none
        left; an evolved one had none among the `ranked` programs of its populations."""
        total = self._count()
        if self._whole is None:
            return (f"the search found no more untried programs among the {ranked} it ranked "
                    f"(the space has {total} programs)")
        if len(self._whole) == total:
            return f"the space has {total} programs; all measured"
        return (f"the space has {total} programs, {len(self._whole)} of them buildable and "
                f"distinct; all measured")

    def _evolved(self, elites: list[Candidate], k: int, known: dict[str, float]
                 ) -> list[tuple[Candidate, float]]:
        """The round's populations evolved from the elites and the last round's survivors,
        merged and ranked; the best are kept as the next round's survivors."""
        seeds = [*elites, *self._kept]
        merged: dict[str, Candidate] = {}
        self._parallel_twins.clear()
        self._vector_twins.clear()
        self._tile_twins.clear()
        self._reshaped_twins.clear()
        self._epilogue_twins.clear()
        self._packed_twins.clear()
        # With nothing measured or kept yet, one population often settles on a poor sketch of
        # a fused chain (docs/ARCHITECTURE.md §17.3): evolve more while the best is predicted
        # slower than `settled_s`.
        for _ in range(1 if seeds else self.first_islands):
            for cand, _ in self._evolve(seeds, k, known):
                merged.setdefault(cand.hash, cand)
            if min((known[h] for h in merged), default=math.inf) <= self.settled_s:
                break
        ranked = self.rank(list(merged.values()), known)  # predicted already: only sorts
        self._kept = [c for c, _ in _with_every_sketch(ranked, self.survivors)]
        return ranked

    def _evolve(self, seeds: list[Candidate], k: int, known: dict[str, float]
                ) -> list[tuple[Candidate, float]]:
        """One population: `seeds` and fresh draws, evolved while its predicted top `k` gains;
        ranked best first."""
        pool: dict[str, Candidate] = {}
        # The first round starts from random draws alone: in a chain's space (4 groups, 40 and
        # more slots) 192 of them settled on sketches predicted at a third of what 384 found;
        # a single reduction's space is small enough for 192 (§17.3).
        size = self.population if seeds else self.first_population

        def add(cands: Iterable[Candidate | None]) -> None:
            for c in cands:
                if c is not None and c.hash not in pool:
                    pool[c.hash] = c

        add(seeds)
        if not seeds:
            add(self._blocked_seeds)
        # Draws repeat once most of a space is in the pool: `max_attempts` draws in a row that
        # add nothing end the filling (a space with fewer programs than a population would
        # never fill it).
        repeats = 0
        while len(pool) < size and repeats < self.max_attempts:
            fresh = self.random_candidate()
            if fresh is None:
                break
            repeats = repeats + 1 if fresh.hash in pool else 0
            add([fresh])
        ranked = self.rank(list(pool.values()), known)
        stale = 0
        for generation in range(self.max_generations):
            parents = [c for c, _ in _with_every_sketch(ranked, self.survivors)]
            if not parents or (generation >= self.generations and stale >= STALE_GENERATIONS):
                break
            before = _top_score(ranked, k)
            add(self.crossover(*self.rng.sample(parents, 2))
                if len(parents) > 1 and self.rng.random() < CROSSOVER_SHARE
                else self.mutate(self.rng.choice(parents)) for _ in range(size))
            # MetaSchedule's ParallelizeVectorizeUnroll makes every sketch's outer loops
            # parallel; here the twins join the pool beside them and the model decides (a draw
            # rarely holds both a good register tile and a parallel root loop). Every member
            # gets its parallel twin, not only the parents: a serial program with a good tile
            # is predicted at one core's speed, ranks below poorly tiled parallel ones and
            # would never become a parent to be parallelized.
            add(self._parallel_twins_of(list(pool.values())))
            add(self._vector_twins_of(parents))
            add(self._tile_twins_of(parents))
            add(self._reshaped_twins_of(parents))
            add(self._epilogue_twins_of(parents))
            add(self._packed_twins_of(parents))
            ranked = self.rank(list(pool.values()), known)
            pool = {c.hash: c for c, _ in _with_every_sketch(ranked, size)}
            stale = stale + 1 if _top_score(ranked, k) > before * (1 - MIN_GAIN) else 0
        return ranked

    def _verified_prefix(self, ranked: list[tuple[Candidate, float]], n: int
                         ) -> tuple[list[tuple[Candidate, float]], int]:
        """The first `n` verified entries of `ranked`, and how many entries that took (only
        those are verified: a round ranks hundreds and proposes a few)."""
        out: list[tuple[Candidate, float]] = []
        used = 0
        for entry in ranked:
            if len(out) >= n:
                break
            used += 1
            if self._verified(entry[0]):
                out.append(entry)
        return out, used

    def _verified(self, cand: Candidate) -> bool:
        """Is the unverified realization (see `program_of`) legal and the term's own? A
        candidate that fails is forgotten: it is never ranked or proposed again."""
        if cand.hash in self._verified_hashes:
            return True
        self.wait_turn()
        try:
            verify(cand.term, cand.sizes, cand.program, self.space.facts)
        except DeriveError:
            self._programs[_program_key(cand.term, cand.sizes)] = None
            self._kept = [c for c in self._kept if c is not cand]
            if self._whole is not None:
                self._whole = [c for c in self._whole if c is not cand]
            return False
        self._verified_hashes.add(cand.hash)
        return True

    def rank(self, cands: list[Candidate], known: dict[str, float] | None = None
             ) -> list[tuple[Candidate, float]]:
        """(candidate, predicted seconds), best first; ties broken by hash (deterministic).
        `known` (hash -> seconds) holds predictions already made, and is filled in."""
        known = {} if known is None else known
        new = [c for c in cands if c.hash not in known]
        for start in range(0, len(new), PREDICTION_BATCH):
            self.wait_turn()
            batch = new[start:start + PREDICTION_BATCH]
            known.update(zip([c.hash for c in batch],
                             map(float, self.model.predict([c.program for c in batch]))))
        return sorted(((c, known[c.hash]) for c in cands), key=lambda cs: (cs[1], cs[0].hash))


def _once_a_round(made: dict[str, T], cands: list[Candidate],
                  make: Callable[[Candidate], T]) -> list[T]:
    """`make` of each candidate, made once and kept in `made` (by hash; a round clears it):
    most of a population stays in it for several generations."""
    for cand in cands:
        if cand.hash not in made:
            made[cand.hash] = make(cand)
    return [made[cand.hash] for cand in cands]


def _innermost_reduction_loop(stmt: Stmt, facts: Facts, over_reduce: bool = False
                              ) -> PieceLoop | None:
    """The innermost piece loop (not a factored one) around the first reducing block in walk
    order that has one, in a root statement; `over_reduce`: the innermost over a piece of that
    block's reduce groups. None without."""
    found: PieceLoop | None = None

    def visit(node: Stmt, around: tuple[PieceLoop, ...]) -> None:
        nonlocal found
        if found is not None:
            return
        if isinstance(node, BlockRef):
            reduce = facts.reduce_groups.get(node.name, set())  # empty: not a reduction
            found = next((loop for loop in reversed(around) if reduce
                          and (not over_reduce or loop.group in reduce)), None)
            return
        inner = (*around, node) if _plain(node) else around
        for child in getattr(node, "body", ()):
            visit(child, inner)

    visit(stmt, ())
    return found


def _elementwise_nests(stmt: Stmt, facts: Facts) -> Iterator[PieceLoop]:
    """The outermost loops of the nests of single loops around one elementwise block in a root
    statement: the statement itself, or such a nest fused under its loops, in walk order."""

    def visit(node: Stmt, alone: bool) -> Iterator[PieceLoop]:
        # alone: the only statement of the loop around it, so inside a longer chain
        chain = _loop_chain(node)
        if chain is not None:
            if chain[0] and not alone and not facts.reduce_groups.get(chain[1].name):
                yield node
            return
        body = getattr(node, "body", ())
        for child in body:
            yield from visit(child, len(body) == 1)

    yield from visit(stmt, False)


def _unit_stride_vector(head: PieceLoop, facts: Facts, term: Term
                        ) -> tuple[Stmt, PieceLoop] | None:
    """The nest of single loops `head` (in `term`) around one elementwise block with the
    innermost of its loops over the block's unit-stride store dimension moved innermost as a
    vector loop (the space keeps a split's pieces in order, so that is the finest piece, whose
    steps are one element). A whole loop there is split first as `term` splits its group
    elsewhere (a group's extent is split one way in a program), or else in two; the outer pieces
    take its place, the finest is the vector (the space sizes it). Returns the new nest and the
    loop that became the vector (whose piece `_vector_sized` resizes); None when the nest has
    no loop over that dimension or already ends in a vector loop."""
    loops, block = _loop_chain(head)
    group = facts.store_inner_group.get(block.name)
    inner = next((lp for lp in reversed(loops) if lp.group == group), None)
    if inner is None or loops[-1].kind == LoopKind.VECTOR.value:
        return None
    pieces = [inner.path] if inner.path else _finest_pieces(term, group) or [
        split_path("", 0, 2), split_path("", 1, 2)]
    split = [dataclasses.replace(inner, path=path, kind=LoopKind.SERIAL.value)
             for path in pieces]
    vector = dataclasses.replace(split[-1], kind=LoopKind.VECTOR.value)
    kept = [piece for lp in loops for piece in (split[:-1] if lp is inner else [lp])]
    return _nest([*kept, vector], (block,)), vector


def _finest_pieces(term: Term, group: str) -> list[str]:
    """The pieces of `group` that `term` splits no further, outer to inner; [] when it loops
    over the group whole only."""
    paths = {s.path for s, _ in walk(term.body) if isinstance(s, PieceLoop) and s.group == group}
    finest = [p for p in paths if p and not any(q.startswith(p + ".") for q in paths)]
    return sorted(finest, key=lambda p: [int(step.split("/")[0]) for step in p.split(".")])


def _tile_columns(stmt: Stmt, facts: Facts, sizes: Sizes) -> tuple[str, str, int] | None:
    """The first reducing block of a root statement, its vector loop's group and how many
    points of it the loops inside its innermost reduction loop cover (a register tile's
    columns); None without a reducing block under a reduction loop with a vector loop inside."""
    loop = _innermost_reduction_loop(stmt, facts, over_reduce=True)
    if loop is None:
        return None
    for node, tile in walk(loop.body):
        if isinstance(node, BlockRef) and facts.reduce_groups.get(node.name):
            vector = [lp for lp in tile if lp.kind == LoopKind.VECTOR.value]
            if not vector:
                return None
            group = vector[-1].group
            return node.name, group, math.prod(sizes[lp.group, lp.path] for lp in tile
                                               if lp.group == group)
    return None


def _raised_out_of_unrolled(stmt: Stmt, loop: PieceLoop, sizes: Sizes
                            ) -> tuple[Stmt, PieceLoop] | None:
    """`stmt` with `loop` (a serial loop over a reduce piece) moved out of the unrolled loops
    of other groups around it that hold nothing else (a perfect nest: only the order of its
    loops changes), and the longest of those at `sizes`; None when `loop` is not directly
    inside such a loop."""
    path = _path_to(stmt, loop)
    if path is None or loop.kind != LoopKind.SERIAL.value:
        return None
    unrolled: list[PieceLoop] = []
    for outer in reversed(path[:-1]):
        if not (_plain(outer) and outer.kind == LoopKind.UNROLL.value and len(outer.body) == 1
                and outer.group != loop.group):
            break
        unrolled.append(outer)
    if not unrolled:
        return None
    inner: Stmt = dataclasses.replace(unrolled[0], body=loop.body)
    for outer in unrolled[1:]:
        inner = dataclasses.replace(outer, body=(inner,))
    longest = max(unrolled, key=lambda u: sizes[u.group, u.path])
    return _replaced(stmt, unrolled[-1], dataclasses.replace(loop, body=(inner,))), longest


def _reshaped_nests(stmt: Stmt, loop: PieceLoop, sizes: Sizes) -> Iterator[list[Stmt]]:
    """Per reshaping of the register tile under `loop` (a serial loop over a reduce piece; see
    `EvolutionarySearch.reshaped`): `stmt` with the reshaped nest, the loop taken out of the
    tile serial and then unrolled (the space may have only one of them)."""
    path = _path_to(stmt, loop)
    if path is None:
        return
    above: list[PieceLoop] = []  # the perfect nest around `loop`, innermost first
    for outer in reversed(path[:-1]):
        if not (_plain(outer) and len(outer.body) == 1):
            break
        above.append(outer)
    tile = _single_loops_under(loop)  # the perfect nest under `loop`, outermost first
    node = tile[-1] if tile else loop
    vector_groups = {t.group for t in tile if t.kind == LoopKind.VECTOR.value}
    head = above[-1] if above else loop
    outer_order = above[::-1]
    for into in outer_order:
        if into.group == loop.group or into.group in vector_groups \
                or not 2 <= sizes[into.group, into.path] <= MAX_TILE_ROWS:
            continue
        row = dataclasses.replace(into, kind=LoopKind.UNROLL.value)
        outs = [t for t in tile if t.kind == LoopKind.UNROLL.value and t.group != into.group
                and sizes[t.group, t.path] > 1]
        for out in [None, *outs]:
            takes = [[]] if out is None else [[dataclasses.replace(out, kind=kind)] for kind
                                              in (LoopKind.SERIAL.value, LoopKind.UNROLL.value)]
            yield [_replaced(stmt, head, _nest([o for o in outer_order if o is not into]
                                               + taken + [loop, row]
                                               + [t for t in tile if t is not out], node.body))
                   for taken in takes]


def _plain(node: Stmt) -> bool:
    """A piece loop that a reorder may move (not one a reduction is factored along)."""
    return isinstance(node, PieceLoop) and not isinstance(node, RfactorLoop)


def _single_loops_under(loop: PieceLoop) -> list[PieceLoop]:
    """The chain of loops under `loop`, each the only statement of the one before, outermost
    first, down to the first that is not a plain piece loop."""
    chain: list[PieceLoop] = []
    node = loop
    while len(node.body) == 1 and _plain(node.body[0]):
        node = node.body[0]
        chain.append(node)
    return chain


def _nest(loops: list[PieceLoop], body: tuple[Stmt, ...]) -> Stmt:
    """The loops nested in order (outermost first) around `body`."""
    for lp in reversed(loops):
        body = (dataclasses.replace(lp, body=body),)
    return body[0]


def _path_to(stmt: Stmt, target: Stmt) -> list[Stmt] | None:
    """The nodes from `stmt` down to `target` (by identity), both included."""
    if stmt is target:
        return [stmt]
    for child in getattr(stmt, "body", ()):
        found = _path_to(child, target)
        if found is not None:
            return [stmt, *found]
    return None


def _log_distance(option: dict[str, int], current: dict[str, int]) -> float:
    return sum(abs(math.log2(option[p]) - math.log2(current[p])) for p in current)


def _block_names(stmt: Stmt) -> set[str]:
    return {s.name for s, _ in walk((stmt,)) if isinstance(s, BlockRef)}


def _path_to_block(stmt: Stmt, name: str) -> list[PieceLoop]:
    """The loops from `stmt` down to block `name`, up to a local tile (a tile holds one stage:
    nothing joins it)."""
    for s, outer in walk((stmt,)):
        if isinstance(s, BlockRef) and s.name == name:
            loops = []
            for loop in outer:
                loops.append(loop)
                if any(isinstance(c, Cached) for c in loop.body):
                    break
            return loops
    return []


def _loop_chain(stmt: Stmt) -> tuple[list[PieceLoop], BlockRef] | None:
    """A nest of single loops around one block: (its loops, outer first; the block)."""
    loops = []
    while isinstance(stmt, PieceLoop) and not isinstance(stmt, RfactorLoop) \
            and len(stmt.body) == 1:
        loops.append(stmt)
        stmt = stmt.body[0]
    return (loops, stmt) if isinstance(stmt, BlockRef) else None


def _sizes_of(term: Term, sizes: Sizes) -> Sizes:
    """`sizes` of the pieces `term` loops over ({} when one has none: no program of it)."""
    wanted = symbols(term)
    return {sym: sizes[sym] for sym in wanted} if wanted <= set(sizes) else {}


def _serial_chain_with(stmt: Stmt, chain: list[PieceLoop], nest: Stmt) -> Stmt:
    """`stmt` with the loops of `chain` (by identity, outer first) made serial and `nest`
    appended to the body of the last."""
    if not chain or stmt is not chain[0]:
        body = getattr(stmt, "body", None)
        if not body or not chain:
            return stmt
        return dataclasses.replace(stmt, body=tuple(_serial_chain_with(c, chain, nest)
                                                    for c in body))
    body = tuple(_serial_chain_with(c, chain[1:], nest) for c in stmt.body)
    if len(chain) == 1:
        body += (nest,)
    return dataclasses.replace(stmt, kind=LoopKind.SERIAL.value, body=body)


def _replaced(stmt: Stmt, old: Stmt, new: Stmt) -> Stmt:
    """`stmt` with the node `old` (by identity) replaced by `new`."""
    if stmt is old:
        return new
    body = getattr(stmt, "body", None)
    if not body:
        return stmt
    return dataclasses.replace(stmt, body=tuple(_replaced(c, old, new) for c in body))


def _reduction_vector_axes(nodes: tuple, vector: str = "") -> set[str]:
    """The axes (`Y.k` of `Y.k.3`) of vectorized loops around reductions: the loops that
    decide a sketch; a padding copy's or an init's vector loop does not."""
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, Block):
            if node.reduce is not None and vector:
                out.add(vector)
            continue
        inner = vector
        if isinstance(node, Loop) and node.kind == LoopKind.VECTOR:
            stem, _, last = node.name.rpartition(".")
            inner = stem if last.isdigit() else node.name
        out |= _reduction_vector_axes(node.body, inner)
    return out


def _with_every_sketch(ranked: list[tuple[Candidate, float]], n: int
                       ) -> list[tuple[Candidate, float]]:
    """The best `n`, except that the best `SKETCH_NICHE` of each sketch come first (up to half
    of `n`, better sketches first), in rank order. One sketch soon fills a population that is
    cut to its best (a vectorized row beats a register tile whose sizes are still random:
    conv2d's blocked sketches died out that way, docs/ARCHITECTURE.md §9); kept, each sketch's
    best go on being mutated."""
    seen: dict[tuple, int] = {}
    niche: list[int] = []
    for i, (cand, _) in enumerate(ranked):
        if len(niche) >= n // 2:
            break
        count = seen.get(cand.sketch, 0)
        if count < SKETCH_NICHE:
            seen[cand.sketch] = count + 1
            niche.append(i)
    chosen = set(niche)
    for i in range(len(ranked)):
        if len(chosen) >= n:
            break
        chosen.add(i)
    return [ranked[i] for i in sorted(chosen)]


def _assignment(sizes: Sizes) -> dict[str, dict[str, int]]:
    """The sizes per group: {group: {path: extent}}."""
    assignment: dict[str, dict[str, int]] = {}
    for (group, path), extent in sizes.items():
        assignment.setdefault(group, {})[path] = extent
    return assignment


def _splits_exactly(option: dict[str, int], extent: int) -> bool:
    """Do the top pieces of a {path: extent} assignment multiply to the whole extent? (Pieces
    below them split exactly by construction; an unsplit group is whole.)"""
    top = [e for path, e in option.items() if path and "." not in path]
    return not top or math.prod(top) == extent


def _sizes(assignment: dict[str, dict[str, int]]) -> Sizes:
    """The sizes of a per-group assignment: {(group, path): extent}."""
    return {(g, p): e for g, paths in assignment.items() for p, e in paths.items()}


def _program_key(term: Term, sizes: Sizes) -> tuple:
    return term, tuple(sorted(sizes.items()))


def _is_chain(space: Space) -> bool:
    """Does the space's computation chain reductions (mm_exp_mm, an MLP, softmax)?"""
    return sum(stage.reduce is not None for stage in space.naive.computation.stages) > 1


def _top_score(ranked: list[tuple[Candidate, float]], k: int) -> float:
    """The mean predicted seconds of the best `k`: what a round would propose."""
    top = [score for _, score in ranked[:k]]
    return sum(top) / len(top) if top else math.inf
