"""The schedule space: the programs a saturated e-graph represents, counted, sampled, matched.

A program is a choice of one e-node per reachable e-class (never an `append` node: its class also
holds the cons list it evaluates to) plus an extent for every piece symbol the chosen structure
uses. Structure and sizes are counted together because kinds constrain sizes: a vector piece has
one of the space's `vector_lanes` (those of its target's vector register: 8..64 for 512 bits),
an unroll piece at most 16 iterations (`term.extent_allowed`).

A group's size assignments are the ordered factorizations of its extent down the split tree its
paths form, plus, at the top split of the whole extent, the splits that leave a remainder (an
inner tile from `term.remainder_tiles`, the outermost piece its ceiling); a pack factor is a
divisor > 1 of the packed dimension or a padded panel width (`term.pack_factors`), but not
the whole innermost dimension (that panel is the buffer's own layout). Each
assignment satisfies
some of the group's *limits* (piece p in vector lanes, piece p unrollable); the assignments that
satisfy the same ones form a *profile*. A group has few profiles (matmul 1024³: 11, 16 and 3, of
286, 286 and 11 assignments) while the limit sets programs put on it are many, and a program's
limits are satisfied exactly when each loop's are. So counts are kept per profile:

    table       = {tree key: array over the profiles of the groups split in the key}
                  tree key = one bit per split piece (and its ancestors) and per packed operand
                  array[p] = the structures whose every limit the profile p satisfies
    node table  = its loop's table times its children's (keys unite, arrays multiply pointwise)
    class table = its nodes' tables added, then its *settled* groups summed out:
                  array <- sum over p of array[p] x (assignments in p); their bits leave the key
    programs    = the root's table (every group is settled at the root)

A group is settled at a class when no program uses it outside that class: its tree is complete
there. A limit on a whole extent (path "") is known at once: a loop breaking it has no program.
Keyed by the limit sets themselves, a fused chain has far more keys per class than profiles,
and its count does not finish (docs/ARCHITECTURE.md §17.2). Arrays are numpy object arrays of
exact Python ints, one axis per group that some program splits (size 1 where a table does not
depend on the group). A table whose tree for a group is part of a larger one (a split piece
split again elsewhere) is lifted: each profile of the larger tree restricts to one of the
smaller.

Every program has an index in [0, count): `program(index)` unranks it, `sample` draws indices
uniformly, `enumerate` walks them. The order depends only on content: nodes are sorted by a hash
of their op, literals and children's hashes, never by egglog's ids (they vary run to run); keys,
profiles and assignments are ordered by the constraints and extents they stand for.

The root list is read in one spelling, the one the rules write and `lang.root_expr` mirrors:
inlined stages first, then the statements, then the packs at its tail; any other interleaving
would spell a Term twice.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from itertools import product
from typing import Any, Protocol

import numpy as np

from ..ir import LoopKind, Program
from .facts import Facts, partials_limit
from .lang import SERIALIZED_OPS
from .saturate import Limits, RewriteRule, saturate
from .term import (
    KINDS,
    VECTOR_LANES,
    BlockRef,
    Cached,
    PackRef,
    PieceLoop,
    RfactorLoop,
    Sizes,
    Stmt,
    Term,
    extent_allowed,
    pack_factors,
    parent_path,
    partials_constraint,
    remainder_tiles,
    show,
    split_path,
    symbols,
    walk,
)

Key = frozenset  # of (group, path, constraint); a pack is ("pack:" + buffer, "", "pack:<dim>")
Slot = tuple[str, int]  # (e-class, root phase); the phase is 0 outside the root list
Table = dict[int, np.ndarray]  # tree key -> counts by profile
Omega = tuple[int, ...]  # a profile index per array axis (0 on an axis a table does not split)

INLINES, STMTS, PACKS = 0, 1, 2  # the part of the root list a class may start in, in order
PROGRAM_OPS = {"nil", "cons", "loop", "rloop", "block", "cached", "rnil", "rcons", "inlined",
               "packed"}
LOOP_OPS = ("loop", "rloop")
EMPTY: Key = frozenset()


class SpaceError(ValueError):
    """The e-graph does not describe a space of programs (a cycle, a malformed structure)."""


@dataclass(frozen=True)
class _Node:
    index: int
    op: str  # our vocabulary (lang.SERIALIZED_OPS values)
    literals: tuple  # decoded string/int children, in argument order
    children: tuple[Slot, ...]  # the children that carry program structure
    triples: Key  # the constraints this node adds
    digest: str
    own: int = 0  # its tree key (`Space._bit`)


@dataclass(frozen=True)
class _Profiles:
    """The size assignments of one split tree of a group, by the limits they satisfy."""

    masks: tuple[int, ...]  # the limits satisfied (`Space._limit_bit`), one per profile, sorted
    assignments: tuple[tuple[dict[str, int], ...], ...]  # {path: extent} per profile
    limits: int  # every limit on a path of this tree

    @property
    def weights(self) -> list[int]:
        return [len(a) for a in self.assignments]


def _constraint(kind: str) -> str:
    """What a loop kind asks of its extent. Kinds that ask nothing share one value, so keys
    differing only in them (a parallel or a serial outer loop) are counted together."""
    return kind if kind in (LoopKind.VECTOR, LoopKind.UNROLL) else ""


def _allowed(op: str, phase: int) -> bool:
    if op == "inlined":
        return phase == INLINES
    if op == "rcons":
        return phase <= STMTS
    return True


def _lineage(path: str) -> list[str]:
    """The piece and the pieces it was split from, the whole extent "" excluded."""
    out = []
    while path:
        out.append(path)
        path = parent_path(path)[0]
    return out


def _ordered_factorizations(extent: int, ways: int) -> list[tuple[int, ...]]:
    if ways == 1:
        return [(extent,)]
    return [(d,) + rest for d in range(1, extent + 1) if extent % d == 0
            for rest in _ordered_factorizations(extent // d, ways - 1)]


def _top_splits(extent: int, ways: int) -> list[tuple[int, ...]]:
    """The ways to split a whole extent: its ordered factorizations, then per remainder tile
    (`term.remainder_tiles`) the tile's factorizations under an outermost piece of
    ceil(extent / tile). No two are equal: a remainder tile does not divide the extent."""
    out = _ordered_factorizations(extent, ways)
    if ways > 1:
        out += [(-(-extent // tile),) + inner for tile in remainder_tiles(extent)
                for inner in _ordered_factorizations(tile, ways - 1)]
    return out


def _assignments(children: dict[str, list[str]], path: str, extent: int,
                 allowed: Callable[[str, int], bool] = lambda path, extent: True,
                 ) -> list[dict[str, int]]:
    """Every {path: extent} of the split tree below `path` (`children`: the pieces of each split
    piece, outer to inner) whose extents are `allowed`."""
    if not allowed(path, extent):
        return []
    kids = children.get(path)
    if not kids:
        return [{path: extent}]
    out = []
    splits = _top_splits if path == "" else _ordered_factorizations
    for factors in splits(extent, len(kids)):
        for parts in product(*(_assignments(children, k, f, allowed)
                               for k, f in zip(kids, factors))):
            merged = {path: extent}
            for part in parts:
                merged.update(part)
            out.append(merged)
    return out


def _value(array: np.ndarray, omega: Omega) -> int:
    """The count at profile indices `omega` (an axis of size 1 holds it for every profile)."""
    if array.size == 1:
        return array.flat[0]
    return array[tuple(i if n > 1 else 0 for i, n in zip(omega, array.shape))]


class SaturatedEGraph(Protocol):
    """What a Space reads of a saturation: `eqsched.egraph.saturate.Saturation`, or an e-graph
    built by hand (the tests build some with unions)."""

    naive: Program
    facts: Facts

    def serialized(self) -> dict: ...

    @property
    def root_class(self) -> str: ...


class Space:
    """The programs of a saturation (`eqsched.egraph.saturate.Saturation`)."""

    def __init__(self, sat: SaturatedEGraph, vector_lanes: Sequence[int] = VECTOR_LANES):
        """`vector_lanes`: the extents a vector piece may have (`term.vector_lanes` of the
        target's register lanes)."""
        self.saturation = sat
        self.vector_lanes = tuple(vector_lanes)
        self.naive: Program = sat.naive
        self.facts: Facts = sat.facts
        self.report = getattr(sat, "report", None)
        data = sat.serialized()
        self._raw = data["nodes"]
        self._class_of = {nid: n["eclass"] for nid, n in self._raw.items()}
        self._members: dict[str, list[str]] = defaultdict(list)
        for nid, n in self._raw.items():
            self._members[n["eclass"]].append(nid)
        self.root_class: str = sat.root_class
        self._nodes: dict[str, list[_Node]] = {}
        self._order: list[str] = []  # reachable program classes, children before parents
        self._parse()
        self._index_constraints()
        # Tables per node, per slot before and after settling groups, and what unranking needs.
        self._node_tables: dict[int, Table] = {}
        self._raw_tables: dict[Slot, Table] = {}
        self._tables: dict[Slot, Table] = {}
        self._structure_counts: dict[Slot, int] = {}
        self._settled_into: dict[Slot, dict[int, list[int]]] = {}
        self._combo_cache: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        self._profile_cache: dict[tuple[str, int], _Profiles] = {}
        self._restriction_cache: dict[tuple[str, int, int], list[int]] = {}
        self._complete_trees: set[tuple[str, int]] = set()
        self._group_sizes_cache: dict[tuple[str, frozenset], list[dict[str, int]]] = {}
        # Membership is matched top-down; shared subterms meet shared classes again.
        self._match_root = cache(self._match_root)
        self._match_body = cache(self._match_body)
        self._match_stmt = cache(self._match_stmt)
        self._slot_nodes = cache(self._slot_nodes)  # asked at every step of walks and unranking

    # ---- reading the serialized e-graph ----------------------------------------------------

    def _leaf(self, cid: str) -> str | int:
        """The value of a literal class (a string, an integer, or a loop kind)."""
        members = self._members[cid]
        if len(members) != 1:
            ops = sorted(self._raw[m]["op"] for m in members)
            raise SpaceError(f"class {cid} should hold one literal or kind but holds {ops}")
        op = self._raw[members[0]]["op"]
        if op.startswith('"'):
            return json.loads(op)
        kind = SERIALIZED_OPS.get(op)
        if kind in KINDS:
            return kind
        try:
            return int(op)
        except ValueError:
            raise SpaceError(f"class {cid} holds {op!r} where a literal or kind belongs") from None

    def _spec(self, nid: str) -> tuple[str, tuple, tuple[Slot, ...], Key] | None:
        """(op, literals, program children, own constraints) of a node; None if never chosen."""
        raw = self._raw[nid]
        op = SERIALIZED_OPS.get(raw["op"])
        if op not in PROGRAM_OPS or raw.get("subsumed"):
            return None
        ch = [self._class_of[c] for c in raw["children"]]
        if op in LOOP_OPS:
            group, path, kind = self._leaf(ch[0]), self._leaf(ch[1]), self._leaf(ch[2])
            if kind not in KINDS:
                raise SpaceError(f"loop over {group}[{path}] has kind {kind!r}")
            own = frozenset({(group, path, _constraint(kind))}
                            | ({self._partials(group, path)} if op == "rloop" else set()))
            return op, (group, path, kind), ((ch[3], 0),), own
        if op in ("cons", "rcons"):
            return op, (), ((ch[0], 0), (ch[1], STMTS if op == "rcons" else 0)), EMPTY
        if op == "block":
            return op, (self._leaf(ch[0]),), (), EMPTY
        if op == "cached":
            return op, (self._leaf(ch[0]),), ((ch[1], 0),), EMPTY
        if op == "inlined":
            return op, (self._leaf(ch[0]),), ((ch[1], INLINES),), EMPTY
        if op == "packed":
            blk, buf, dim = (self._leaf(c) for c in ch[:3])
            return op, (blk, buf, dim), ((ch[3], PACKS),), frozenset({(f"pack:{buf}", "",
                                                                        f"pack:{dim}")})
        return op, (), (), EMPTY  # nil, rnil

    def _partials(self, group: str, path: str) -> tuple[str, str, str]:
        """The limit an rfactor loop over this piece puts on its extent."""
        return group, path, partials_constraint(partials_limit(self.facts, group))

    def _key_of(self, term: Term) -> Key:
        """The constraints a term's loops put on its sizes."""
        return _key_of(term) | {self._partials(s.group, s.path) for s, _ in walk(term.body)
                                if isinstance(s, RfactorLoop)}

    def _parse(self) -> None:
        """Walk the classes reachable from the root, children first; refuse cycles."""
        specs: dict[str, list[tuple]] = {}
        state: dict[str, int] = {}  # 1 = on the current path, 2 = done
        stack: list[tuple[str, list[str]]] = []

        def enter(cid: str) -> None:
            found = [s for s in (self._spec(n) for n in sorted(self._members[cid])) if s]
            specs[cid] = found
            state[cid] = 1
            kids = sorted({c for s in found for c, _ in s[2]}, reverse=True)
            stack.append((cid, kids))

        if self.root_class not in self._members:
            raise SpaceError(f"root class {self.root_class} is not in the serialized e-graph")
        enter(self.root_class)
        while stack:
            cid, kids = stack[-1]
            if not kids:
                stack.pop()
                state[cid] = 2
                self._order.append(cid)
                continue
            kid = kids.pop()
            if state.get(kid) == 1:
                path = [c for c, _ in stack]
                cycle = path[path.index(kid):]
                raise SpaceError("the rules made a cycle (a program containing itself) through "
                                 f"classes {' -> '.join(cycle + [kid])}: "
                                 f"ops {[sorted({s[0] for s in specs[c]}) for c in cycle]}")
            if kid not in state:
                enter(kid)
        digests: dict[str, str] = {}
        count = 0
        for cid in self._order:
            nodes = []
            for op, literals, children, own in specs[cid]:
                # A saturation stopped early (--limits) can leave a class with no program node
                # yet (only a helper such as `append`, not rewritten): a node over it spells no
                # program, and a walk that chose it would find nothing to pick there.
                if any(not self._nodes[c] for c, _ in children):
                    continue
                text = repr((op, literals, [(digests[c], p) for c, p in children]))
                nodes.append((hashlib.sha1(text.encode()).hexdigest(), op, literals, children,
                              own))
            nodes.sort()
            digests[cid] = hashlib.sha1("|".join(n[0] for n in nodes).encode()).hexdigest()
            self._nodes[cid] = [_Node(count + i, op, lit, ch, own, d)
                                for i, (d, op, lit, ch, own) in enumerate(nodes)]
            count += len(nodes)

    # ---- counting --------------------------------------------------------------------------

    def _index_constraints(self) -> None:
        """Give every tree-key atom and every limit a bit (in content order), every group some
        program splits an array axis, and find, for each class, the groups that no program can
        use outside it: their sizes are settled there."""
        atoms, limits = set(), set()
        for nodes in self._nodes.values():
            for n in nodes:
                for group, path, constraint in n.triples:
                    if constraint.startswith("pack:"):
                        atoms.add((group, path, constraint))
                        continue
                    atoms |= {(group, p, "") for p in _lineage(path)}
                    if path and constraint:
                        limits.add((group, path, constraint))
        self._bit = {a: 1 << i for i, a in enumerate(sorted(atoms))}
        self._limit_bit = {t: 1 << i for i, t in enumerate(sorted(limits))}
        self._group_mask: dict[str, int] = defaultdict(int)
        for (group, _, _), bit in self._bit.items():
            self._group_mask[group] |= bit
        split = sorted({g for g, _, c in atoms if not c.startswith("pack:")})
        self._axis = {g: i for i, g in enumerate(split)}
        self._ndim = max(len(split), 1)  # numpy returns 0-d object results as bare scalars
        self._nodes = {cid: [replace(n, own=self._key_of_triples(n.triples)) for n in nodes]
                       for cid, nodes in self._nodes.items()}
        below: dict[str, set[str]] = {}
        for cid in self._order:
            below[cid] = set()
            for n in self._nodes[cid]:
                below[cid] |= {t[0] for t in n.triples}
                for child, _ in n.children:
                    below[cid] |= below[child]
        outside: dict[str, set[str]] = defaultdict(set)
        for cid in reversed(self._order):  # parents before children
            for n in self._nodes[cid]:
                around = outside[cid] | {t[0] for t in n.triples}
                for i, (child, _) in enumerate(n.children):
                    siblings = [below[c] for j, (c, _) in enumerate(n.children) if j != i]
                    outside[child] |= around.union(*siblings)
        self._settled = {cid: sorted(below[cid] - outside[cid]) for cid in self._order}

    def _key_of_triples(self, triples: Key) -> int:
        key = 0
        for group, path, constraint in triples:
            if constraint.startswith("pack:"):
                key |= self._bit[(group, path, constraint)]
            else:
                key |= sum(self._bit[(group, p, "")] for p in _lineage(path))
        return key

    def _slot_nodes(self, slot: Slot) -> tuple[_Node, ...]:
        return tuple(n for n in self._nodes[slot[0]] if _allowed(n.op, slot[1]))

    def _along(self, group: str, values: list[int]) -> np.ndarray:
        """`values` as an array varying along the group's axis only."""
        shape = [1] * self._ndim
        shape[self._axis[group]] = len(values)
        return np.array(values, dtype=object).reshape(shape)

    def _own_table(self, node: _Node) -> Table:
        fits = np.ones((1,) * self._ndim, dtype=object)
        if node.op not in LOOP_OPS:
            return {node.own: fits}
        for group, path, limit in sorted(node.triples):
            if not limit:
                continue
            if not path:  # the whole extent is known
                if not extent_allowed(limit, self.facts.extents[group], self.vector_lanes):
                    return {}
                continue
            bit = self._limit_bit[(group, path, limit)]
            masks = self._profiles(group, node.own & self._group_mask[group]).masks
            fits = fits * self._along(group, [int(bool(m & bit)) for m in masks])
        return {node.own: fits} if fits.any() else {}

    def _lift(self, array: np.ndarray, key: int, wider: int) -> np.ndarray:
        """`array` of tree key `key` as an array of `wider`, a superset of it."""
        if key == wider:
            return array
        for group, axis in self._axis.items():
            mask = self._group_mask[group]
            if array.shape[axis] > 1 and key & mask != wider & mask:
                array = np.take(array, self._restriction(group, wider & mask, key & mask),
                                axis=axis)
        return array

    def _merge(self, a: Table, b: Table) -> Table:
        out: Table = {}
        for ka, va in a.items():
            for kb, vb in b.items():
                key = ka | kb
                both = self._lift(va, ka, key) * self._lift(vb, kb, key)
                out[key] = out[key] + both if key in out else both
        return out

    def _node_table(self, node: _Node) -> Table:
        out = self._node_tables.get(node.index)
        if out is None:
            out = self._own_table(node)
            for child in node.children:
                out = self._merge(out, self._slot_table(child))
            self._node_tables[node.index] = out
        return out

    def _raw_table(self, slot: Slot) -> Table:
        """Structures of the slot by tree key and profile, sizes of no group settled here yet."""
        out = self._raw_tables.get(slot)
        if out is None:
            out = {}
            for node in self._slot_nodes(slot):
                for key, array in self._node_table(node).items():
                    out[key] = out[key] + array if key in out else array
            self._raw_tables[slot] = out
        return out

    def _slot_table(self, slot: Slot) -> Table:
        """Programs of the slot by the tree key and profiles of its open groups: the groups
        settled here are summed over their profiles, weighted by their assignments."""
        out = self._tables.get(slot)
        if out is None:
            out = {}
            for key, array in self._raw_table(slot).items():
                open_key, settled = self._settle(slot, key, array)
                if settled.any():
                    out[open_key] = out[open_key] + settled if open_key in out else settled
            self._tables[slot] = out
        return out

    def _settle(self, slot: Slot, key: int, array: np.ndarray) -> tuple[int, np.ndarray]:
        for group, part in self._settling_groups(slot, key):
            if group in self._axis:
                weights = self._along(group, self._complete(group, part).weights)
                array = (array * weights).sum(axis=self._axis[group], keepdims=True)
            else:
                array = array * len(self._options(group, part))
            key &= ~part
        return key, array

    def _settling_groups(self, slot: Slot, key: int) -> list[tuple[str, int]]:
        """(group, its part of the key) for the groups settled at the slot that the key uses."""
        return [(g, key & self._group_mask[g]) for g in self._settled[slot[0]]
                if key & self._group_mask[g]]

    def _structures(self, slot: Slot) -> int:
        out = self._structure_counts.get(slot)
        if out is None:
            out = sum(math.prod(self._structures(c) for c in n.children)
                      for n in self._slot_nodes(slot))
            self._structure_counts[slot] = out
        return out

    def count(self) -> int:
        """The number of distinct programs: structures x tile-size assignments."""
        table = self._slot_table(self.root_slot)  # every group settles at the root: key 0
        return int(table[0].flat[0]) if 0 in table else 0

    def count_structures(self) -> int:
        """The number of distinct structures, sizes ignored."""
        return self._structures(self.root_slot)

    # ---- sizes -----------------------------------------------------------------------------

    def _paths(self, group: str, part: int) -> set[str]:
        return {p for (g, p, _), bit in self._bit.items() if g == group and bit & part}

    def _profiles(self, group: str, part: int) -> _Profiles:
        """The profiles of the split tree a key's part for the group names (completed with the
        sibling pieces that may enclose a class from outside it)."""
        found = self._profile_cache.get((group, part))
        if found is None:
            children = self._split_tree(group, self._paths(group, part), complete=True)
            limits = [(p, c, bit) for (g, p, c), bit in self._limit_bit.items() if g == group]
            by_mask: dict[int, list[dict[str, int]]] = defaultdict(list)
            for sizes in _assignments(children, "", self.facts.extents[group]):
                by_mask[sum(bit for p, c, bit in limits if p in sizes
                            and extent_allowed(c, sizes[p], self.vector_lanes))].append(sizes)
            masks = sorted(by_mask)
            tree = {p for kids in children.values() for p in kids}
            found = _Profiles(tuple(masks), tuple(tuple(by_mask[m]) for m in masks),
                              sum(bit for p, _, bit in limits if p in tree))
            self._profile_cache[(group, part)] = found
        return found

    def _complete(self, group: str, part: int) -> _Profiles:
        """The profiles of a group's final tree, refusing one with a piece missing."""
        if (group, part) not in self._complete_trees:
            self._split_tree(group, self._paths(group, part))
            self._complete_trees.add((group, part))
        return self._profiles(group, part)

    def _restriction(self, group: str, wide: int, narrow: int) -> list[int]:
        """For each profile of the wider tree, the profile of the narrower one it restricts
        to."""
        found = self._restriction_cache.get((group, wide, narrow))
        if found is None:
            small = self._profiles(group, narrow)
            index = {m: i for i, m in enumerate(small.masks)}
            found = [index[m & small.limits] for m in self._profiles(group, wide).masks]
            self._restriction_cache[(group, wide, narrow)] = found
        return found

    def _options(self, group: str, part: int) -> list[dict[str, int]]:
        uses = frozenset((p, c) for (g, p, c), bit in self._bit.items() if bit & part)
        return self._group_sizes(group, uses)

    def _size_lists(self, key: Key) -> list[tuple[str, list[dict[str, int]]]]:
        """Per group (sorted), every valid {path: extent} for the paths the key uses."""
        by_group: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for group, path, kind in key:
            by_group[group].add((path, kind))
        return [(g, self._group_sizes(g, frozenset(by_group[g]))) for g in sorted(by_group)]

    def _group_sizes(self, group: str, uses: frozenset) -> list[dict[str, int]]:
        cached = self._group_sizes_cache.get((group, uses))
        if cached is None:
            if group.startswith("pack:"):
                cached = self._pack_sizes(group, uses)
            else:
                cached = self._tile_sizes(group, uses)
            self._group_sizes_cache[(group, uses)] = cached
        return cached

    def _pack_sizes(self, group: str, uses: frozenset) -> list[dict[str, int]]:
        dims = {int(kind.split(":")[1]) for _, kind in uses}
        buffer = group.removeprefix("pack:")
        if len(dims) != 1:
            raise SpaceError(f"{buffer} is packed along several dimensions {sorted(dims)}")
        dim = dims.pop()
        shape = self.naive.buffer(buffer).shape
        extent = shape[dim]
        # One panel as wide as the innermost dimension is the buffer's own layout: a copy that
        # buys nothing.
        same_layout = extent if dim == len(shape) - 1 else None
        return [{"": f} for f in pack_factors(extent) if f != same_layout]

    def _split_tree(self, group: str, paths: Iterable[str],
                    complete: bool = False) -> dict[str, list[str]]:
        """The pieces of each split piece above `paths`, outer to inner. A piece split two ways
        is refused; a missing sibling piece is added if `complete`, else refused."""
        children: dict[str, dict[int, str]] = defaultdict(dict)
        ways_of: dict[str, int] = {}
        for path in paths:
            while path:
                parent, index, ways = parent_path(path)
                if ways_of.setdefault(parent, ways) != ways:
                    raise SpaceError(f"group {group} splits piece {parent!r} both "
                                     f"{ways_of[parent]} and {ways} ways")
                children[parent][index] = path
                path = parent
        for parent, kids in children.items():
            missing = sorted(set(range(ways_of[parent])) - set(kids))
            if missing and not complete:
                raise SpaceError(f"group {group} uses pieces {sorted(kids.values())} of a "
                                 f"{ways_of[parent]}-way split but not piece(s) {missing}")
            kids.update((i, split_path(parent, i, ways_of[parent])) for i in missing)
        return {parent: [kids[i] for i in sorted(kids)] for parent, kids in children.items()}

    def _tile_sizes(self, group: str, uses: frozenset) -> list[dict[str, int]]:
        kinds: dict[str, set[str]] = defaultdict(set)
        for path, kind in uses:
            kinds[path].add(kind)

        def allowed(path: str, extent: int) -> bool:
            return all(extent_allowed(k, extent, self.vector_lanes)
                       for k in kinds.get(path, ()))

        full = _assignments(self._split_tree(group, kinds), "", self.facts.extents[group],
                            allowed)
        return [{p: e for p, e in sizes.items() if p in kinds} for sizes in full]

    # ---- programs by index -----------------------------------------------------------------

    def _raw_keys_into(self, slot: Slot, open_key: int) -> list[int]:
        """The slot's raw keys that settle into `open_key`, in key order."""
        table = self._settled_into.get(slot)
        if table is None:
            table = defaultdict(list)
            for key in sorted(self._raw_table(slot)):
                table[key & ~sum(p for _, p in self._settling_groups(slot, key))].append(key)
            self._settled_into[slot] = table
        return table.get(open_key, [])

    def _narrow(self, omega: Omega, key: int, narrower: int) -> Omega:
        """Profile indices under tree key `key` as indices under `narrower`, a subset of it."""
        if key == narrower:
            return omega
        out = list(omega)
        for group, axis in self._axis.items():
            mask = self._group_mask[group]
            if key & mask != narrower & mask:
                out[axis] = (self._restriction(group, key & mask, narrower & mask)[omega[axis]]
                             if narrower & mask else 0)
        return tuple(out)

    def _combos(self, node: _Node, key: int) -> list[tuple[int, ...]]:
        """The children's keys that unite (with the node's own) into `key`."""
        found = self._combo_cache.get((node.index, key))
        if found is None:
            subsets = [sorted(k for k in self._slot_table(c) if not k & ~key)
                       for c in node.children]
            found = []
            for keys in product(*subsets):
                whole = node.own
                for k in keys:
                    whole |= k
                if whole == key:
                    found.append(keys)
            self._combo_cache[(node.index, key)] = found
        return found

    def _unrank_slot(self, slot: Slot, key: int, omega: Omega, index: int, sizes: Sizes) -> Any:
        for raw_key in self._raw_keys_into(slot, key):
            array = self._raw_table(slot)[raw_key]
            groups = self._settling_groups(slot, raw_key)
            if not groups:  # most slots settle nothing: one count, no sizes to pick
                n = _value(array, omega)
                if index < n:
                    return self._unrank_raw(slot, raw_key, omega, index, sizes)
                index -= n
                continue
            settled_axes = {self._axis[g] for g, _ in groups if g in self._axis}
            # The raw counts at the open groups' profiles, over every profile of the settled
            # ones, times the assignments each profile stands for.
            here = array[tuple(slice(None) if axis in settled_axes else
                               slice(i, i + 1) if size > 1 else slice(0, 1)
                               for axis, (i, size) in enumerate(zip(omega, array.shape)))]
            weights = np.ones((1,) * self._ndim, dtype=object)
            for group, part in groups:
                weights = weights * (self._along(group, self._complete(group, part).weights)
                                     if group in self._axis else len(self._options(group, part)))
            programs = here * weights
            for position, n in enumerate(programs.flat):
                if index < n:
                    break
                index -= n
            else:
                continue
            where = np.unravel_index(position, programs.shape)
            choice, index = divmod(index, np.broadcast_to(here, programs.shape)[where])
            for group, part in groups:
                if group in self._axis:
                    options = self._complete(group, part).assignments[where[self._axis[group]]]
                else:
                    options = self._options(group, part)
                choice, pick = divmod(choice, len(options))
                sizes.update(((group, p), e) for p, e in options[pick].items())
            full = tuple(int(where[axis]) if axis in settled_axes else i
                         for axis, i in enumerate(omega))
            return self._unrank_raw(slot, raw_key, full, index, sizes)
        raise AssertionError(f"index past the end of class {slot}")

    def _unrank_raw(self, slot: Slot, key: int, omega: Omega, index: int, sizes: Sizes) -> Any:
        for node in self._slot_nodes(slot):
            array = self._node_table(node).get(key)
            n = 0 if array is None else _value(array, omega)
            if index < n:
                return self._unrank_node(node, key, omega, index, sizes)
            index -= n
        raise AssertionError(f"index past the end of class {slot}")

    def _unrank_node(self, node: _Node, key: int, omega: Omega, index: int,
                     sizes: Sizes) -> Any:
        tables = [self._slot_table(c) for c in node.children]
        for keys in self._combos(node, key):
            omegas = [self._narrow(omega, key, k) for k in keys]
            counts = [_value(t[k], w) for t, k, w in zip(tables, keys, omegas)]
            if index < math.prod(counts):
                break
            index -= math.prod(counts)
        else:
            raise AssertionError(f"index past the end of node {node.op} {node.literals}")
        values = []
        for child, k, w, n in zip(node.children, keys, omegas, counts):
            index, sub = divmod(index, n)
            values.append(self._unrank_slot(child, k, w, sub, sizes))
        return _build(node, values)

    def program(self, index: int) -> tuple[Term, Sizes]:
        """The program with this index in [0, count()), in the space's content-based order."""
        if not 0 <= index < self.count():
            raise SpaceError(f"program index {index} is outside [0, {self.count()})")
        sizes: Sizes = {}
        packs, inlined, body = self._unrank_slot(self.root_slot, 0, (0,) * self._ndim, index,
                                                 sizes)
        term = Term(body, inlined, packs)
        used = symbols(term)
        # Settling records whole split trees; an unsplit group's one extent is its own.
        sizes.update(((g, ""), self.facts.extents[g]) for g, p in used if p == ""
                     and (g, p) not in sizes)
        return term, {s: e for s, e in sorted(sizes.items()) if s in used}

    def sample(self, n: int, seed: int = 0) -> list[tuple[Term, Sizes]]:
        """`n` programs drawn independently and uniformly (with replacement)."""
        total = self.count()
        if total == 0:
            raise SpaceError("the space holds no program to sample")
        rng = random.Random(seed)
        return [self.program(rng.randrange(total)) for _ in range(n)]

    def enumerate(self, limit: int = 10_000) -> list[tuple[Term, Sizes]]:
        """Every program, in index order; refuses spaces larger than `limit`."""
        total = self.count()
        if total > limit:
            raise SpaceError(f"the space holds {total} programs, more than the limit {limit}")
        return [self.program(i) for i in range(total)]

    # ---- membership ------------------------------------------------------------------------

    def contains(self, term: Term, sizes: Sizes) -> bool:
        """Is this concrete program one of the space's?"""
        key = self._key_of(term)
        if set(sizes) != symbols(term):
            return False
        for group, options in self._size_lists(key):
            mine = {path: extent for (g, path), extent in sizes.items() if g == group}
            if mine not in options:
                return False
        return self._match_root(self.root_slot, term.packs, term.inlined, term.body) is not None

    def contains_program(self, prog: Program) -> bool:
        from .encode import encode

        return self.contains(*encode(prog, self.facts))

    def _match_root(self, slot: Slot, packs: tuple, inlined: tuple, body: tuple) -> int | None:
        """The index (in `choices(slot)`) of the first node spelling this root list, if any."""
        for i, node in enumerate(self._slot_nodes(slot)):
            ch = node.children
            if node.op == "inlined" and inlined:
                ok = node.literals == (inlined[0],) \
                    and self._match_root(ch[0], packs, inlined[1:], body) is not None
            elif node.op == "rcons" and not inlined and body:
                ok = self._match_stmt(ch[0], body[0]) is not None \
                    and self._match_root(ch[1], packs, (), body[1:]) is not None
            elif node.op == "packed" and packs and not (inlined or body):
                p = packs[0]
                ok = node.literals == (p.block, p.buffer, p.dim) \
                    and self._match_root(ch[0], packs[1:], (), ()) is not None
            else:
                ok = node.op == "rnil" and not (packs or inlined or body)
            if ok:
                return i
        return None

    def _match_body(self, slot: Slot, stmts: tuple[Stmt, ...]) -> int | None:
        for i, node in enumerate(self._slot_nodes(slot)):
            if node.op == "nil" and not stmts:
                return i
            if node.op == "cons" and stmts \
                    and self._match_stmt(node.children[0], stmts[0]) is not None \
                    and self._match_body(node.children[1], stmts[1:]) is not None:
                return i
        return None

    def _match_stmt(self, slot: Slot, stmt: Stmt) -> int | None:
        for i, node in enumerate(self._slot_nodes(slot)):
            if isinstance(stmt, BlockRef) and node.op == "block":
                ok = node.literals == (stmt.name,)
            elif isinstance(stmt, PieceLoop) and node.op == _loop_op(stmt):
                ok = node.literals == (stmt.group, stmt.path, stmt.kind) \
                    and self._match_body(node.children[0], stmt.body) is not None
            elif isinstance(stmt, Cached) and node.op == "cached":
                ok = node.literals == (stmt.stage,) \
                    and self._match_body(node.children[0], stmt.body) is not None
            else:
                ok = False
            if ok:
                return i
        return None

    # ---- walking: structures chosen node by node, for searches that never count ----------

    @property
    def root_slot(self) -> Slot:
        return (self.root_class, INLINES)

    def choices(self, slot: Slot) -> tuple[_Node, ...]:
        """The nodes a program may take at `slot`, in the space's content-based order."""
        return self._slot_nodes(slot)

    def walk(self, pick: Callable[[Slot, tuple[_Node, ...]], _Node]) -> Term:
        """The structure made by choosing, top-down, the node `pick(slot, choices)` at every slot
        the walk reaches (the e-graph is acyclic, so every walk ends)."""

        def visit(slot: Slot) -> Any:
            node = pick(slot, self._slot_nodes(slot))
            return _build(node, [visit(child) for child in node.children])

        packs, inlined, body = visit(self.root_slot)
        return Term(body, inlined, packs)

    def picks_for(self, term: Term) -> dict[Slot, int]:
        """The walk choices (slot -> index into `choices(slot)`) that spell `term`: at each slot
        the first node whose subterm matches. A slot reached twice keeps its first choice, so
        a walk with these picks may spell a different term when the term takes one class two
        ways. Raises SpaceError for a term that is not in the space."""
        picks: dict[Slot, int] = {}

        def chosen(slot: Slot, index: int | None) -> _Node:
            if index is None:
                raise SpaceError(f"the term is not in the space: {show(term)}")
            picks.setdefault(slot, index)
            return self._slot_nodes(slot)[index]

        def root(slot: Slot, packs: tuple, inlined: tuple, body: tuple) -> None:
            node = chosen(slot, self._match_root(slot, packs, inlined, body))
            if node.op == "inlined":
                root(node.children[0], packs, inlined[1:], body)
            elif node.op == "rcons":
                stmt(node.children[0], body[0])
                root(node.children[1], packs, (), body[1:])
            elif node.op == "packed":
                root(node.children[0], packs[1:], (), ())

        def body_of(slot: Slot, stmts: tuple) -> None:
            node = chosen(slot, self._match_body(slot, stmts))
            if node.op == "cons":
                stmt(node.children[0], stmts[0])
                body_of(node.children[1], stmts[1:])

        def stmt(slot: Slot, s: Stmt) -> None:
            node = chosen(slot, self._match_stmt(slot, s))
            if node.op in ("loop", "rloop", "cached"):
                body_of(node.children[0], s.body)

        root(self.root_slot, term.packs, term.inlined, term.body)
        return picks

    def size_options(self, term: Term) -> list[tuple[str, list[dict[str, int]]]]:
        """Per dimension group the term uses (sorted), every valid {path: extent} assignment;
        a group with no valid assignment has an empty list (the structure has no program)."""
        return self._size_lists(self._key_of(term))

    # ---- export ----------------------------------------------------------------------------

    def to_json(self) -> dict:
        """The DAG of reachable classes, named c0.. in a content-based order, with counts."""
        names = {cid: f"c{i}" for i, cid in enumerate(reversed(self._order))}
        classes = {}
        for cid in reversed(self._order):
            classes[names[cid]] = {
                "structures": self._structures((cid, 0)),
                "nodes": [{"op": n.op, "literals": list(n.literals),
                           "children": [names[c] for c, _ in n.children]}
                          for n in self._nodes[cid]],
            }
        return {"root": names[self.root_class], "programs": self.count(),
                "structures": self.count_structures(), "classes": classes}

    def to_dot(self, max_classes: int = 300) -> str:
        from .dot import dag_to_dot

        if len(self._order) > max_classes:
            raise SpaceError(f"the space has {len(self._order)} classes; graphviz output is for "
                             f"spaces of at most {max_classes}")
        return dag_to_dot(self.to_json())


def _build(node: _Node, values: list) -> Any:
    """The Term fragment of a node from its children's fragments."""
    op, lit = node.op, node.literals
    if op == "nil":
        return ()
    if op == "cons":
        return (values[0],) + values[1]
    if op == "loop":
        return PieceLoop(lit[0], lit[1], lit[2], values[0])
    if op == "rloop":
        return RfactorLoop(lit[0], lit[1], lit[2], values[0])
    if op == "block":
        return BlockRef(lit[0])
    if op == "cached":
        return Cached(lit[0], values[0])
    if op == "rnil":
        return (), (), ()
    packs, inlined, body = values[-1]
    if op == "rcons":
        return packs, inlined, (values[0],) + body
    if op == "inlined":
        return packs, (lit[0],) + inlined, body
    return (PackRef(*lit),) + packs, inlined, body  # packed


def _loop_op(stmt: PieceLoop) -> str:
    return "rloop" if isinstance(stmt, RfactorLoop) else "loop"


def _key_of(term: Term) -> Key:
    key = {(s.group, s.path, _constraint(s.kind)) for s, _ in walk(term.body)
           if isinstance(s, PieceLoop)}
    key |= {(f"pack:{p.buffer}", "", f"pack:{p.dim}") for p in term.packs}
    return frozenset(key)


def build_space(naive: Program, rules: Sequence[RewriteRule], limits: Limits | None = None,
                vector_lanes: Sequence[int] = VECTOR_LANES) -> Space:
    """Saturate the naive program's e-graph with `rules` and wrap it as a Space."""
    return Space(saturate(naive, rules, limits), vector_lanes)


def rule_contributions(naive: Program, rules: Sequence[RewriteRule], limits: Limits | None = None,
                       vector_lanes: Sequence[int] = VECTOR_LANES) -> dict[str, int]:
    """For each rule, the number of programs in the space built without it."""
    return {rule.name: build_space(naive, [r for r in rules if r is not rule], limits,
                                   vector_lanes).count()
            for rule in rules}
