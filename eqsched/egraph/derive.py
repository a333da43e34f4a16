"""(Term, Sizes) -> a trace of manual primitives that turns the naive program into that program.

The recipe is canonical (one trace per term), in this order:

1. `inline` each stage of `term.inlined`, in order.
2. Per top-level statement of the term, in order, build its nest:
   - the *host* is a block under it (tried in order: most axes first, then term order); its naive
     nest is `split` into the pieces its loops name (sizes from `Sizes`; "1/4.0/2" is a split of
     piece `.1`) and `reorder`ed into the term's order;
   - every other block B under it is `fuse`d at the deepest loop of B's term chain that already
     exists, in the first order that works: B must read or write a block already there, and the
     manual fuse puts a producer at the start of that loop's body and a consumer at its end, so B's
     statement must sit right before (after) the statements already built. B's remaining loops,
     which fuse mirrors from the blocks there, are then split further and reordered like the host's.
     If some block cannot be fused this way, the next host is tried.
   A loop's name is therefore `<naive loop of its owner's axis><piece suffix>` (`C.init.j.2`).
   Then `rfactor` each RfactorLoop (a root statement, or a lane loop below one) along its loop:
   the accumulating block under it that reduces over its group (before the annotations: a
   parallel or vectorized rfactor loop is legal only once the partials exist).
3. `vectorize` / `unroll` / `parallel` each annotated loop, in term pre-order. Annotations come
   before cache_write, because cache_write gives its copy loops the kinds of the tile loops.
4. `cache_write(<the stage's block in the tile, its update if there>, at=<the loop whose only
   child is the Cached>)`.
5. `pack` each PackRef last: the copy nest lands right before the nest that holds the reader.

The result is checked by encoding it again: a term the manual API cannot state (a root order other
than the hosts' program order, a fused block in the middle of a loop body, a Cached that is not the
only child of a loop, ...) raises DeriveError naming the part, never a different program.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

import math

from ..ir import LoopKind, Program
from ..legality import ScheduleError, check_program
from ..schedule import Schedule
from .encode import encode
from .facts import Facts, facts_of
from .term import (
    BlockRef,
    Cached,
    PieceLoop,
    RfactorLoop,
    Sizes,
    Stmt,
    Term,
    pack_symbol,
    show,
    split_path,
    walk,
)

ANNOTATE = {LoopKind.VECTOR: "vectorize", LoopKind.UNROLL: "unroll", LoopKind.PARALLEL: "parallel"}


class DeriveError(ValueError):
    """The manual primitives cannot build the term's program; the message names the term part."""


def derive(term: Term, sizes: Sizes, naive: Program) -> list[dict]:
    """The manual trace (list of {"op", "args"}) that builds the term's program from `naive`."""
    return _Derivation(term, sizes, naive).run().trace


def realize(term: Term, sizes: Sizes, naive: Program, *, verify: bool = True) -> Program:
    """The term's concrete program: `Schedule.replay(naive, derive(term, sizes, naive)).program`.

    Fast path first: the primitives without the whole-program check after each one (most of the
    time of a derivation), then one check of the result and the usual cross-check that it encodes
    back to (term, sizes), which pins it to the same program. Any failure there falls back to the
    checked derivation, which also knows which alternatives a rejected step leaves.

    `verify=False` skips that final check on the fast path (a large share of its time,
    docs/ARCHITECTURE.md §17.2): for a search that ranks thousands of programs and calls `verify`
    on the few it keeps."""
    try:
        return _Derivation(term, sizes, naive, checked=False, verify=verify).run().program
    except Exception:  # noqa: BLE001  (an unchecked primitive may fail in any way)
        return _Derivation(term, sizes, naive).run().program


def build_unchecked(term: Term, sizes: Sizes, naive: Program) -> Program:
    """The term's program built by the primitives with no legality check at all: what the term
    says, right or wrong. For soundness fuzzing of rules (`eqsched rules check`), where an
    illegal program must be built and run so that execution catches it."""
    return _Derivation(term, sizes, naive, checked=False, verify=False).run().program


def verify(term: Term, sizes: Sizes, program: Program, facts: Facts) -> None:
    """Raise DeriveError unless `program` is legal and encodes back to exactly (term, sizes)
    (`facts` of the naive program)."""
    try:
        check_program(program)
    except ScheduleError as e:
        raise DeriveError(f"built without step checks, it is illegal: {e}") from None
    _encodes_to(term, sizes, program, facts)


def _encodes_to(term: Term, sizes: Sizes, program: Program, facts: Facts) -> None:
    got, got_sizes = encode(program, facts)
    if got != term:
        raise DeriveError(f"the manual API builds {show(got)}, not {show(term)}")
    wrong = {k: v for k, v in got_sizes.items() if sizes.get(k, v) != v}
    if wrong:
        raise DeriveError(f"the built program has sizes {wrong}, not the term's")


def path_suffix(path: str) -> str:
    """Piece path -> loop name suffix: "1/4.0/2" -> ".1.0"."""
    return "".join("." + step.split("/")[0] for step in path.split(".")) if path else ""


def _ancestors(path: str) -> list[str]:
    """"1/4.0/2" -> ["", "1/4", "1/4.0/2"]."""
    steps = path.split(".") if path else []
    return [""] + [".".join(steps[: n + 1]) for n in range(len(steps))]


def _blocks_in(stmt: Stmt) -> list[str]:
    return [s.name for s, _ in walk((stmt,)) if isinstance(s, BlockRef)]


def _children(stmts: tuple[Stmt, ...]) -> list[Stmt]:
    """A loop body as fuse sees it: a Cached (made last) is transparent."""
    out: list[Stmt] = []
    for s in stmts:
        out += _children(s.body) if isinstance(s, Cached) else [s]
    return out


class _Derivation:
    def __init__(self, term: Term, sizes: Sizes, naive: Program, checked: bool = True,
                 verify: bool = True):
        self.term, self.sizes, self.naive = term, sizes, naive
        self.checked, self.verify = checked, verify
        self.facts = facts_of(naive)
        self.sch = Schedule(naive, checked=checked)
        self.names: dict[int, str] = {}  # id(term PieceLoop) -> program loop name
        self.chains = {s.name: outer for s, outer in walk(term.body) if isinstance(s, BlockRef)}
        self.loops = [s for s, _ in walk(term.body) if isinstance(s, PieceLoop)]
        self.naive_loop = {(blk.name, b.axis): b.terms[0][0]
                           for blk in naive.blocks() for b in blk.bindings}

    def run(self) -> Schedule:
        for stage in self.term.inlined:
            self._step(f"inline:{stage}", self.sch.inline, stage)
        wanted = set(self.chains)
        have = {b.name for b in self.sch.program.blocks()}
        if wanted != have:
            raise DeriveError(f"term blocks {sorted(wanted)} are not the program's blocks "
                              f"{sorted(have)} after inlining {list(self.term.inlined)}")
        for stmt in self.term.body:
            self._build_root(stmt)
        for stmt, _ in walk(self.term.body):
            if isinstance(stmt, RfactorLoop):
                self._rfactor(stmt)
        for s, _ in walk(self.term.body):
            if isinstance(s, PieceLoop) and s.kind != LoopKind.SERIAL:
                op = ANNOTATE[s.kind]
                self._step(f"{show(Term((s,)))}", getattr(self.sch, op), self.names[id(s)])
        for s, outer in walk(self.term.body):
            if isinstance(s, Cached):
                self._cache_write(s, outer)
        for p in self.term.packs:
            factor = self._size(pack_symbol(p.buffer))
            self._step(f"pack:{p.block}:{p.buffer}:{p.dim}", self.sch.pack, p.block, p.buffer,
                       p.dim, factor)
        self._check()
        return self.sch

    # ---- nests --------------------------------------------------------------------------------

    def _build_root(self, root: Stmt) -> None:
        """Try each block as the host (most axes first) until every other block fuses in."""
        blocks = _blocks_in(root)
        hosts = sorted(blocks, key=lambda b: (-len(self.facts.blocks[b].axes), blocks.index(b)))
        main, names = self.sch, dict(self.names)
        for host in hosts:
            self.sch = main.fork()
            if self._fuse_all(host, blocks):
                return
            self.sch, self.names = main, dict(names)
        raise DeriveError(f"cannot build {show(Term((root,)))} by fusing into one nest: the "
                          "manual fuse puts a producer first and a consumer last in the loop it "
                          "fuses at")

    def _fuse_all(self, host: str, blocks: list[str]) -> bool:
        self._shape(host, self.chains[host])
        placed = {host}
        pending = [b for b in blocks if b != host]
        while pending:
            fused = next((b for b in pending if self._try_fuse(b, placed)), None)
            if fused is None:
                return False
            placed.add(fused)
            pending.remove(fused)
        return True

    def _try_fuse(self, name: str, placed: set[str]) -> bool:
        chain = self.chains[name]
        depth = max((n for n, lp in enumerate(chain) if id(lp) in self.names), default=None)
        if depth is None:
            return False
        at = chain[depth]
        children = _children(at.body)
        present = [n for n, c in enumerate(children) if placed & set(_blocks_in(c))]
        mine = next(n for n, c in enumerate(children) if name in _blocks_in(c))
        at_name = self.names[id(at)]
        prog = self.sch.program
        under = [b for b in prog.blocks() if at_name in {lp.name for lp in prog.enclosing(b.name)}]
        buffer = prog.block(name).buffer
        produces = any(buffer in {ld.buffer for ld in b.reads()} for b in under)
        if mine != (present[0] - 1 if produces else present[-1] + 1):
            return False
        trial = self.sch.fork()
        try:
            trial.fuse(name, at_name)
            if not self.checked:
                # The checked derivation refuses a fuse that leaves the program illegal for now
                # (a consumer fused before its initializer) and takes another route; the fast
                # one must take the same route, or its program's loops are named differently
                # from those of the trace that `derive` records and replays.
                check_program(trial.program)
        except ScheduleError:
            return False
        self.sch = trial
        self._shape(name, chain[depth + 1:])
        return True

    def _shape(self, block: str, own: tuple[PieceLoop, ...]) -> None:
        """Split the block's loops into the pieces `own` names and put them in `own`'s order."""
        targets = []
        for lp in own:
            axis = self.facts.axis_of(block, lp.group)
            if axis is None:
                raise DeriveError(f"loop {lp.group}[{lp.path}] around {block}: {block} has no "
                                  f"axis in dimension {lp.group}")
            base = self.naive_loop[(block, axis)]
            self._split_down_to(base, lp.group, lp.path)
            self.names[id(lp)] = base + path_suffix(lp.path)
            targets.append(self.names[id(lp)])
        current = [lp.name for lp in self.sch.program.enclosing(block) if lp.name in targets]
        if current != targets:
            self._step(f"loops of {block}", self.sch.reorder, *targets)

    def _split_down_to(self, base: str, group: str, path: str) -> None:
        existing = {lp.name for lp in self.sch.program.loops()}
        steps = _ancestors(path)
        have = max((n for n, p in enumerate(steps) if base + path_suffix(p) in existing),
                   default=None)
        if have is None:
            raise DeriveError(f"piece {group}[{path}]: no loop {base}* to split it from")
        for parent in steps[have:-1]:
            _, ways = steps[steps.index(parent) + 1].rpartition(".")[2].split("/")
            factors = [self._size((group, split_path(parent, n, int(ways))))
                       for n in range(int(ways))]
            self._step(f"{group}[{parent}]", self.sch.split, base + path_suffix(parent), factors)

    def _rfactor(self, loop: RfactorLoop) -> None:
        where = show(Term((loop,)))
        found = [b for b in _blocks_in(loop) if loop.group in self.facts.reduce_groups[b]]
        if len(found) != 1:
            raise DeriveError(f"{where}: rfactor needs one block reducing over {loop.group} "
                              f"under the loop, found {found}")
        self._step(where, self.sch.rfactor, found[0], self.names[id(loop)])

    # ---- annotations ----------------------------------------------------------------------

    def _cache_write(self, cached: Cached, outer: tuple[PieceLoop, ...]) -> None:
        where = f"cached:{cached.stage}"
        if not outer or outer[-1].body != (cached,):
            raise DeriveError(f"{where}: cache_write needs a loop whose only child is the tile")
        inside = [self.facts.blocks[b] for b in _blocks_in(cached)]
        mine = [b for b in inside if b.stage == cached.stage]
        if not mine:
            raise DeriveError(f"{where}: no block of stage {cached.stage} in the tile")
        block = next((b.name for b in mine if b.reduce), mine[0].name)
        self._step(where, self.sch.cache_write, block, self.names[id(outer[-1])])

    # ---- bookkeeping ----------------------------------------------------------------------

    def _size(self, symbol: tuple[str, str]) -> int:
        """A piece's extent: given, or (a piece split further) the product of its pieces'."""
        if symbol in self.sizes:
            return self.sizes[symbol]
        group, path = symbol
        head = f"{path}." if path else ""
        for lp in self.loops:
            if lp.group == group and lp.path.startswith(head) and lp.path != path:
                ways = int(lp.path[len(head):].split(".")[0].split("/")[1])
                return math.prod(self._size((group, split_path(path, n, ways)))
                                 for n in range(ways))
        raise DeriveError(f"no size for piece {symbol}")

    def _step(self, part: str, primitive, *args) -> None:
        try:
            primitive(*args)
        except ScheduleError as e:
            raise DeriveError(f"{part}: {e}") from None

    def _check(self) -> None:
        if not self.verify:
            return
        if self.checked:  # every step was checked: only the cross-check is left
            _encodes_to(self.term, self.sizes, self.sch.program, self.facts)
        else:
            verify(self.term, self.sizes, self.sch.program, self.facts)


__all__ = ["DeriveError", "build_unchecked", "derive", "path_suffix", "realize", "verify"]
