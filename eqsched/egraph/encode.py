"""Program -> (Term, Sizes): read a scheduled program back into the e-graph's vocabulary.

Every loop of a program made by the manual primitives is named `<naive loop><suffix>`: the
naive loop of the block axis it iterates (`C.i`, `C.init.i`, `D.j`) and the split pieces that
made it (`.1.0`). That gives its dimension group (from the naive block axis, `facts.groups`) and
its piece path: the arity of each split level is the number of sibling pieces in the binding of
an axis it iterates (`C.i.1.0` with siblings `.0 .1 .2 .3` and `.1.1` is "1/4.0/2").

    for C.i.0 in range(2):                     C.i[0/2]{
      alloc C.local:                             cached:C{
        <C.read / C.write copy nests: implied>
        for C.k ...: for C.i.1 in unrolled(8):     C.k[]{C.i[1/2]@unroll{C.update}}}}

An `Alloc` of `<stage>.local` is `Cached(stage, body)` without its copy nests; a `<buf>_packed`
copy nest is a `PackRef` (factor -> the pack symbol's size); a root loop that starts with an
rfactor partial init (`<stage>.rf_init`) is an `RfactorLoop` without that nest, and the final
reduction nest after it (`<stage>.rf_final`) is implied; so is a root-level init nest, the one
of an rfactor along lanes, whose loop (the innermost piece the partials' `k % n` follows) is an
`RfactorLoop` below the root; stages of the computation that have no block left were inlined
(listed in stage order). Anything else raises EncodeError.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

from ..expr import BinOp, Load, Var
from ..ir import Alloc, Binding, Block, Loop, Node, Program, naive_program, walk
from .facts import Facts, facts_of
from .term import (
    BlockRef,
    Cached,
    PackRef,
    PieceLoop,
    RfactorLoop,
    Sizes,
    Stmt,
    Term,
    pack_symbol,
    split_path,
)

LOCAL_SUFFIX = ".local"
PACKED_SUFFIX = "_packed"


class EncodeError(ValueError):
    """The program has a part the e-graph vocabulary cannot state; the message names it."""


def naive_loop_groups(naive: Program, facts: Facts) -> dict[str, str]:
    """Naive loop name (`C.init.i`) -> its dimension group (`C.i`)."""
    out = {}
    for blk in naive.blocks():
        for b in blk.bindings:
            (loop, _), = b.terms
            out[loop] = facts.groups[(blk.name, b.axis)]
    return out


def parse_loop(name: str, bases: set[str]) -> tuple[str, tuple[int, ...]] | None:
    """`C.init.i.1.0` -> ("C.init.i", (1, 0)) when the base is a naive loop name."""
    head = name
    pieces: list[int] = []
    while True:
        if head in bases:
            return head, tuple(reversed(pieces))
        stem, dot, last = head.rpartition(".")
        if not dot or not last.isdigit():
            return None
        pieces.append(int(last))
        head = stem


def suffix_to_path(suffix: tuple[int, ...], arities: tuple[int, ...]) -> str:
    path = ""
    for index, ways in zip(suffix, arities):
        path = split_path(path, index, ways)
    return path


def encode(prog: Program, facts: Facts | None = None) -> tuple[Term, Sizes]:
    """The (Term, Sizes) of a program made from its naive program by the manual primitives."""
    naive = naive_program(prog.computation)
    facts = facts or facts_of(naive)
    return _Encoder(prog, naive, facts).term()


class _Encoder:
    def __init__(self, prog: Program, naive: Program, facts: Facts):
        self.prog = prog
        self.groups = naive_loop_groups(naive, facts)
        self.bases = set(self.groups)
        self.sizes: Sizes = {}
        self.naive_stages = [s.name for s in naive.computation.stages]
        self.lane_partials = _lane_partial_loops(prog)

    def term(self) -> tuple[Term, Sizes]:
        packs, body = [], []
        for node in self.prog.body:
            pack = self._pack(node)
            if pack is not None:
                packs.append(pack)
            elif _rfactor_final(node) or _rfactor_init(node):
                continue
            elif isinstance(node, Loop) and any(map(_rfactor_init, node.body)):
                group, path = self._piece(node)
                self._record((group, path), node.extent, f"loop {node.name}")
                inside = tuple(self._stmt(n) for n in node.body if not _rfactor_init(n))
                body.append(RfactorLoop(group, path, node.kind.value, inside))
            else:
                body.append(self._stmt(node))
        present = {b.stage for b in self.prog.blocks()}
        inlined = tuple(s for s in self.naive_stages if s not in present)
        return Term(tuple(body), inlined, tuple(packs)), self.sizes

    def _record(self, symbol: tuple[str, str], extent: int, what: str) -> None:
        if self.sizes.setdefault(symbol, extent) != extent:
            raise EncodeError(f"{what}: extent {extent}, but {symbol} is "
                              f"{self.sizes[symbol]} elsewhere")

    def _stmt(self, node: Node) -> Stmt:
        if isinstance(node, Block):
            return BlockRef(node.name)
        if isinstance(node, Alloc):
            return self._cached(node)
        group, path = self._piece(node)
        self._record((group, path), node.extent, f"loop {node.name}")
        kind = RfactorLoop if node.name in self.lane_partials else PieceLoop
        return kind(group, path, node.kind.value, tuple(self._stmt(n) for n in node.body))

    def _cached(self, alloc: Alloc) -> Cached:
        if not alloc.buffer.endswith(LOCAL_SUFFIX):
            raise EncodeError(f"alloc {alloc.buffer}: not a cache_write tile")
        stage = alloc.buffer[: -len(LOCAL_SUFFIX)]
        inside = []
        for n in alloc.body:
            if not any(_tile_copy(b) for b, _ in walk((n,)) if isinstance(b, Block)):
                inside.append(self._stmt(n))
        return Cached(stage, tuple(inside))

    def _piece(self, loop: Loop) -> tuple[str, str]:
        parsed = parse_loop(loop.name, self.bases)
        if parsed is None:
            raise EncodeError(f"loop {loop.name}: not a piece of a naive loop")
        base, suffix = parsed
        binding = self._binding_of(loop)
        siblings = []
        for lp, _ in binding.terms:
            other = parse_loop(lp, self.bases)
            if other is None or self.groups[other[0]] != self.groups[base]:
                raise EncodeError(f"loop {loop.name}: axis {binding.axis} is also bound to {lp}, "
                                  "not a piece of the same dimension")
            siblings.append(other[1])
        arities = []
        for level in range(len(suffix)):
            indices = {s[level] for s in siblings if s[:level] == suffix[:level] and
                       len(s) > level}
            if indices != set(range(len(indices))):
                raise EncodeError(f"loop {loop.name}: split pieces {sorted(indices)} are not "
                                  "0..n-1")
            arities.append(len(indices))
        return self.groups[base], suffix_to_path(suffix, tuple(arities))

    def _binding_of(self, loop: Loop) -> Binding:
        """The binding of the axis the loop iterates, in the first block under it that is not a
        tile copy (a copy's axes also run over its own copy loops, which the term omits)."""
        for blk in (n for n, _ in walk(loop.body) if isinstance(n, Block) and not _implied(n)):
            for b in blk.bindings:
                if any(lp == loop.name for lp, _ in b.terms):
                    return b
        raise EncodeError(f"loop {loop.name}: no block under it iterates it")

    def _pack(self, node: Node) -> PackRef | None:
        """The PackRef of a `<buf>_packed` copy nest, or None for any other node."""
        copies = [b for b, _ in walk((node,)) if isinstance(b, Block)]
        if len(copies) != 1 or not copies[0].name.endswith(PACKED_SUFFIX):
            return None
        copy = copies[0]
        source = copy.value
        if not (isinstance(source, Load) and copy.name == source.buffer + PACKED_SUFFIX):
            raise EncodeError(f"copy nest {copy.name}: not a pack of one buffer")
        # The packed dimension is the one the copy's store does not index plainly: `p0 * 8 + p2`
        # of an exact pack, the axis `q` that a padded pack stores at [q // 8, .., q % 8].
        stored = {ix for ix in copy.indices if isinstance(ix, Var)}
        dims = [d for d, ix in enumerate(source.indices) if ix not in stored]
        readers = [b.name for b in self.prog.blocks()
                   if copy.buffer in {ld.buffer for ld in b.reads()} and b is not copy]
        if len(dims) != 1 or len(readers) != 1:
            raise EncodeError(f"copy nest {copy.name}: expected one packed dimension and one "
                              f"reader, found dims {dims} and readers {readers}")
        factor = self.prog.buffer(copy.buffer).shape[-1]
        self._record(pack_symbol(source.buffer), factor, f"pack {copy.name}")
        return PackRef(readers[0], source.buffer, dims[0])


def _lane_partial_loops(prog: Program) -> set[str]:
    """The loops an rfactor along lanes factored: the innermost piece of the axis whose
    `axis % n` indexes a stage's partials (`C_rf[k % 16, i]`)."""
    out = set()
    for blk in prog.blocks():
        if blk.reduce is None or blk.buffer != f"{blk.stage}_rf" or not blk.indices:
            continue
        part = blk.indices[0]
        if isinstance(part, BinOp) and part.op == "%" and isinstance(part.a, Var):
            out |= {lp for lp, stride in blk.binding(part.a.name).terms if stride == 1}
    return out


def _implied(blk: Block) -> bool:
    """Blocks a term leaves implied: tile copies and rfactor's partial init and final sum."""
    return _tile_copy(blk) or blk.name in (f"{blk.stage}.rf_init", f"{blk.stage}.rf_final")


def _rfactor_init(node: Node) -> bool:
    """The partial init nest `rfactor` puts first in the body of its loop."""
    return _only_block(node, "rf_init")


def _rfactor_final(node: Node) -> bool:
    """The nest after an rfactor loop that reduces the partials into the stage's buffer."""
    return _only_block(node, "rf_final")


def _only_block(node: Node, role: str) -> bool:
    found = [b for b, _ in walk((node,)) if isinstance(b, Block)]
    return len(found) == 1 and found[0].name == f"{found[0].stage}.{role}"


def _tile_copy(blk: Block) -> bool:
    """The copy-in / copy-out blocks `cache_write` adds around a local tile."""
    return blk.name in (f"{blk.stage}.read", f"{blk.stage}.write")


__all__ = ["EncodeError", "encode", "naive_loop_groups", "parse_loop"]
