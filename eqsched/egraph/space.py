"""The schedule space: the programs a saturated e-graph represents, counted, sampled, matched.

A program is a choice of one e-node per reachable e-class (never an `append` node: its class also
holds the cons list it evaluates to) plus an extent for every piece symbol the chosen structure
uses. Structure and sizes are counted together because kinds constrain sizes: a vector piece has
8..64 lanes, an unroll piece at most 16 iterations (`term.extent_allowed`).

    node count  = {constraint key: count}   key = {(group, path, vector|unroll|"") of its loops}
                = children's counts merged key by key (keys unite, counts multiply)
    class count = its nodes' counts added, then its *settled* groups multiplied out
    programs    = the root's count (every group is settled at the root)

A group's size assignments are the ordered factorizations of its extent down the split tree its
paths form, every piece's extent allowed for every kind it occurs with (a piece vectorized in one
place and serial in another takes the vector constraint); a pack factor is any divisor > 1 of the
packed dimension. A group is settled at a class when no program uses it outside that class: its
constraints are complete there, so its assignments multiply the count and its bits leave the key.
Without settling, the keys at the root are the product of every group's variety (167k keys and
46 s for a small matmul; 0.7 s with it). Keys are ints, one bit per constraint triple. Counts are
exact Python ints.

Every program has an index in [0, count): `program(index)` unranks it, `sample` draws indices
uniformly, `enumerate` walks them. The order depends only on content: nodes are sorted by a hash
of their op, literals and children's hashes, never by egglog's ids (they vary run to run).

The root list is read in one spelling, the one the rules write and `lang.root_expr` mirrors:
inlined stages first, then the statements, then the packs at its tail; any other interleaving
would spell a Term twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from itertools import product
from typing import Any

from ..ir import Program
from .facts import Facts, facts_of
from .lang import SERIALIZED_OPS
from .term import (
    KINDS,
    BlockRef,
    Cached,
    Loop,
    PackRef,
    Sizes,
    Stmt,
    Term,
    extent_allowed,
    parent_path,
    symbols,
    walk,
)

Key = frozenset  # of (group, path, constraint); a pack is ("pack:" + buffer, "", "pack:<dim>")
Slot = tuple[str, int]  # (e-class, root phase); the phase is 0 outside the root list

INLINES, STMTS, PACKS = 0, 1, 2  # the part of the root list a class may start in, in order
PROGRAM_OPS = {"nil", "cons", "loop", "block", "cached", "rnil", "rcons", "inlined", "packed"}
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
    own: int = 0  # the same as a bit set (`Space._bit`)


def _constraint(kind: str) -> str:
    """What a loop kind asks of its extent. Kinds that ask nothing share one value, so keys
    differing only in them (a parallel or a serial outer loop) are counted together."""
    return kind if kind in ("vector", "unroll") else ""


def _allowed(op: str, phase: int) -> bool:
    if op == "inlined":
        return phase == INLINES
    if op == "rcons":
        return phase <= STMTS
    return True


def _ordered_factorizations(extent: int, ways: int) -> list[tuple[int, ...]]:
    if ways == 1:
        return [(extent,)]
    return [(d,) + rest for d in range(1, extent + 1) if extent % d == 0
            for rest in _ordered_factorizations(extent // d, ways - 1)]


class Space:
    """The programs of a saturation (`eqsched.egraph.saturate.Saturation`)."""

    def __init__(self, sat: Any):
        self.saturation = sat
        self.naive: Program = sat.naive
        self.facts: Facts = getattr(sat, "facts", None) or facts_of(sat.naive)
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
        self._nodes = {cid: [replace(n, own=sum(self._bit[t] for t in n.triples)) for n in nodes]
                       for cid, nodes in self._nodes.items()}
        # Counts by constraint key (an int, one bit per triple): per node, per slot before and
        # after settling groups, and the tables unranking walks.
        self._node_counts: dict[int, dict[int, int]] = {}
        self._raw_counts: dict[Slot, dict[int, int]] = {}
        self._counts: dict[Slot, dict[int, int]] = {}
        self._structure_counts: dict[Slot, int] = {}
        self._settle_tables: dict[Slot, dict[int, list[tuple[int, int, int]]]] = {}
        self._combo_cache: dict[tuple[int, int], list[tuple[tuple[int, ...], int]]] = {}
        self._group_sizes_cache: dict[tuple[str, frozenset], list[dict[str, int]]] = {}
        # Membership is matched top-down; shared subterms meet shared classes again.
        self._has_body = cache(self._has_body)
        self._has_stmt = cache(self._has_stmt)

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
        if op == "loop":
            group, path, kind = self._leaf(ch[0]), self._leaf(ch[1]), self._leaf(ch[2])
            if kind not in KINDS:
                raise SpaceError(f"loop over {group}[{path}] has kind {kind!r}")
            own = frozenset({(group, path, _constraint(kind))})
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
        """Give every constraint triple a bit (in content order) and find, for each class, the
        groups that no program can use outside it: their sizes are settled there."""
        triples = sorted({t for nodes in self._nodes.values() for n in nodes for t in n.triples})
        self._bit = {t: 1 << i for i, t in enumerate(triples)}
        self._group_mask: dict[str, int] = defaultdict(int)
        for (group, _, _), bit in self._bit.items():
            self._group_mask[group] |= bit
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

    def _slot_nodes(self, slot: Slot) -> list[_Node]:
        return [n for n in self._nodes[slot[0]] if _allowed(n.op, slot[1])]

    def _merge(self, a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
        out: dict[int, int] = defaultdict(int)
        for ka, va in a.items():
            for kb, vb in b.items():
                out[ka | kb] += va * vb
        return out

    def _count_node(self, node: _Node) -> dict[int, int]:
        out = self._node_counts.get(node.index)
        if out is None:
            out = {node.own: 1}
            for child in node.children:
                out = self._merge(out, self._count_slot(child))
            self._node_counts[node.index] = out
        return out

    def _raw_slot(self, slot: Slot) -> dict[int, int]:
        """Structures of the slot by constraint key, sizes of no group settled here yet."""
        out = self._raw_counts.get(slot)
        if out is None:
            acc: dict[int, int] = defaultdict(int)
            for node in self._slot_nodes(slot):
                for key, n in self._count_node(node).items():
                    acc[key] += n
            out = self._raw_counts[slot] = dict(acc)
        return out

    def _count_slot(self, slot: Slot) -> dict[int, int]:
        """Programs of the slot by the constraint key of its open groups: the groups settled
        here are multiplied by their size assignments and leave the key."""
        out = self._counts.get(slot)
        if out is None:
            out = defaultdict(int)
            for key, n in self._raw_slot(slot).items():
                open_key, assignments = self._settle(slot, key)
                if assignments:
                    out[open_key] += n * assignments
            out = self._counts[slot] = dict(out)
        return out

    def _settle(self, slot: Slot, key: int) -> tuple[int, int]:
        assignments = 1
        for group in self._settled[slot[0]]:
            part = key & self._group_mask[group]
            if part:
                assignments *= len(self._options(group, part))
                key &= ~part
        return key, assignments

    def _options(self, group: str, part: int) -> list[dict[str, int]]:
        uses = frozenset((p, c) for (g, p, c), bit in self._bit.items() if bit & part)
        return self._group_sizes(group, uses)

    def _structures(self, slot: Slot) -> int:
        out = self._structure_counts.get(slot)
        if out is None:
            out = sum(math.prod(self._structures(c) for c in n.children)
                      for n in self._slot_nodes(slot))
            self._structure_counts[slot] = out
        return out

    def count(self) -> int:
        """The number of distinct programs: structures x tile-size assignments."""
        return self._count_slot((self.root_class, INLINES)).get(0, 0)

    def count_structures(self) -> int:
        """The number of distinct structures, sizes ignored."""
        return self._structures((self.root_class, INLINES))

    # ---- sizes -----------------------------------------------------------------------------

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
        extent = self.naive.buffer(buffer).shape[dims.pop()]
        return [{"": f} for f in range(2, extent + 1) if extent % f == 0]

    def _tile_sizes(self, group: str, uses: frozenset) -> list[dict[str, int]]:
        kinds: dict[str, set[str]] = defaultdict(set)
        for path, kind in uses:
            kinds[path].add(kind)
        children: dict[str, dict[int, str]] = defaultdict(dict)
        ways_of: dict[str, int] = {}
        for path in kinds:
            while path:
                parent, index, ways = parent_path(path)
                if ways_of.setdefault(parent, ways) != ways:
                    raise SpaceError(f"group {group} splits piece {parent!r} both "
                                     f"{ways_of[parent]} and {ways} ways")
                children[parent][index] = path
                path = parent
        for parent, kids in children.items():
            missing = sorted(set(range(ways_of[parent])) - set(kids))
            if missing:
                raise SpaceError(f"group {group} uses pieces {sorted(kids.values())} of a "
                                 f"{ways_of[parent]}-way split but not piece(s) {missing}")

        def expand(path: str, extent: int) -> list[dict[str, int]]:
            if not all(extent_allowed(k, extent) for k in kinds.get(path, ())):
                return []
            kids = [children[path][i] for i in sorted(children[path])] if path in children else []
            if not kids:
                return [{path: extent}]
            out = []
            for factors in _ordered_factorizations(extent, len(kids)):
                for parts in product(*(expand(k, f) for k, f in zip(kids, factors))):
                    merged = {path: extent}
                    for part in parts:
                        merged.update(part)
                    out.append(merged)
            return out

        used = set(kinds)
        return [{p: e for p, e in full.items() if p in used}
                for full in expand("", self.facts.extents[group])]

    # ---- programs by index -----------------------------------------------------------------

    def _settling(self, slot: Slot, open_key: int) -> list[tuple[int, int, int]]:
        """(raw key, programs, size assignments) of the slot's raw keys that settle into
        `open_key`, in key order."""
        table = self._settle_tables.get(slot)
        if table is None:
            table = defaultdict(list)
            for key, n in sorted(self._raw_slot(slot).items()):
                settled, assignments = self._settle(slot, key)
                if assignments:
                    table[settled].append((key, n * assignments, assignments))
            self._settle_tables[slot] = table
        return table[open_key]

    def _combos(self, node: _Node, key: int) -> list[tuple[tuple[int, ...], int]]:
        """The children's keys that unite (with the node's own) into `key`, with weights."""
        found = self._combo_cache.get((node.index, key))
        if found is None:
            counts = [self._count_slot(c) for c in node.children]
            subsets = [sorted(k for k in c if not k & ~key) for c in counts]
            found = []
            for keys in product(*subsets):
                whole = node.own
                for k in keys:
                    whole |= k
                if whole == key:
                    found.append((keys, math.prod(c[k] for c, k in zip(counts, keys))))
            self._combo_cache[(node.index, key)] = found
        return found

    def _unrank_slot(self, slot: Slot, key: int, index: int, sizes: Sizes) -> Any:
        for raw_key, n, assignments in self._settling(slot, key):
            if index < n:
                index, pick = divmod(index, assignments)
                for group in self._settled[slot[0]]:
                    part = raw_key & self._group_mask[group]
                    if part:
                        options = self._options(group, part)
                        pick, choice = divmod(pick, len(options))
                        sizes.update(((group, p), e) for p, e in options[choice].items())
                return self._unrank_raw(slot, raw_key, index, sizes)
            index -= n
        raise AssertionError(f"index past the end of class {slot}")

    def _unrank_raw(self, slot: Slot, key: int, index: int, sizes: Sizes) -> Any:
        for node in self._slot_nodes(slot):
            n = self._count_node(node).get(key, 0)
            if index < n:
                return self._unrank_node(node, key, index, sizes)
            index -= n
        raise AssertionError(f"index past the end of class {slot}")

    def _unrank_node(self, node: _Node, key: int, index: int, sizes: Sizes) -> Any:
        for keys, weight in self._combos(node, key):
            if index < weight:
                break
            index -= weight
        values = []
        for child, k in zip(node.children, keys):
            index, sub = divmod(index, self._count_slot(child)[k])
            values.append(self._unrank_slot(child, k, sub, sizes))
        return _build(node, values)

    def program(self, index: int) -> tuple[Term, Sizes]:
        """The program with this index in [0, count()), in the space's content-based order."""
        if not 0 <= index < self.count():
            raise SpaceError(f"program index {index} is outside [0, {self.count()})")
        sizes: Sizes = {}
        packs, inlined, body = self._unrank_slot((self.root_class, INLINES), 0, index, sizes)
        return Term(body, inlined, packs), dict(sorted(sizes.items()))

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
        key = _key_of(term)
        if set(sizes) != symbols(term):
            return False
        for group, options in self._size_lists(key):
            mine = {path: extent for (g, path), extent in sizes.items() if g == group}
            if mine not in options:
                return False
        return self._has_root(self.root_class, INLINES, term.packs, term.inlined, term.body)

    def contains_program(self, prog: Program) -> bool:
        from .encode import encode

        return self.contains(*encode(prog, self.facts))

    def _has_root(self, cid: str, phase: int, packs: tuple, inlined: tuple, body: tuple) -> bool:
        for node in self._slot_nodes((cid, phase)):
            child = node.children[0][0] if node.children else None
            if node.op == "inlined" and inlined:
                if node.literals == (inlined[0],) and self._has_root(
                        child, INLINES, packs, inlined[1:], body):
                    return True
            elif node.op == "rcons" and not inlined and body:
                if self._has_stmt(child, body[0]) and self._has_root(
                        node.children[1][0], STMTS, packs, (), body[1:]):
                    return True
            elif node.op == "packed" and packs and not (inlined or body):
                p = packs[0]
                if node.literals == (p.block, p.buffer, p.dim) and self._has_root(
                        child, PACKS, packs[1:], (), ()):
                    return True
            elif node.op == "rnil" and not (packs or inlined or body):
                return True
        return False

    def _has_body(self, cid: str, stmts: tuple[Stmt, ...]) -> bool:
        for node in self._nodes[cid]:
            if node.op == "nil" and not stmts:
                return True
            if node.op == "cons" and stmts and self._has_stmt(node.children[0][0], stmts[0]) \
                    and self._has_body(node.children[1][0], stmts[1:]):
                return True
        return False

    def _has_stmt(self, cid: str, stmt: Stmt) -> bool:
        for node in self._nodes[cid]:
            if isinstance(stmt, BlockRef) and node.op == "block":
                if node.literals == (stmt.name,):
                    return True
            elif isinstance(stmt, Loop) and node.op == "loop":
                if node.literals == (stmt.group, stmt.path, stmt.kind) and self._has_body(
                        node.children[0][0], stmt.body):
                    return True
            elif isinstance(stmt, Cached) and node.op == "cached":
                if node.literals == (stmt.stage,) and self._has_body(node.children[0][0],
                                                                     stmt.body):
                    return True
        return False

    # ---- walking: structures chosen node by node, for searches that never count ----------

    @property
    def root_slot(self) -> Slot:
        return (self.root_class, INLINES)

    def choices(self, slot: Slot) -> list[_Node]:
        """The nodes a program may take at `slot`, in the space's content-based order."""
        return self._slot_nodes(slot)

    def walk(self, pick: Callable[[Slot, list[_Node]], _Node]) -> Term:
        """The structure made by choosing, top-down, the node `pick(slot, choices)` at every slot
        the walk reaches (the e-graph is acyclic, so every walk ends)."""

        def visit(slot: Slot) -> Any:
            node = pick(slot, self._slot_nodes(slot))
            return _build(node, [visit(child) for child in node.children])

        packs, inlined, body = visit(self.root_slot)
        return Term(body, inlined, packs)

    def size_options(self, term: Term) -> list[tuple[str, list[dict[str, int]]]]:
        """Per dimension group the term uses (sorted), every valid {path: extent} assignment;
        a group with no valid assignment has an empty list (the structure has no program)."""
        return self._size_lists(_key_of(term))

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
        return Loop(lit[0], lit[1], lit[2], values[0])
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


def _key_of(term: Term) -> Key:
    key = {(s.group, s.path, _constraint(s.kind)) for s, _ in walk(term.body)
           if isinstance(s, Loop)}
    key |= {(f"pack:{p.buffer}", "", f"pack:{p.dim}") for p in term.packs}
    return frozenset(key)


def build_space(naive: Program, rules: Any = None, limits: Any = None) -> Space:
    """Saturate the naive program's e-graph with `rules` (default set) and wrap it as a Space."""
    from .saturate import saturate

    return Space(saturate(naive, rules, limits))


def rule_contributions(naive: Program, rules: Any = None, limits: Any = None) -> dict[str, int]:
    """For each rule, the number of programs in the space built without it."""
    from eqsched.rules import default_rules, resolve

    chosen = list(default_rules() if rules is None else resolve(rules))
    return {rule.name: build_space(naive, [r for r in chosen if r is not rule], limits).count()
            for rule in chosen}
