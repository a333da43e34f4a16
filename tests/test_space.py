"""The space object on small hand-built e-graphs: exact counts (checked against brute force),
uniform and deterministic sampling, membership, size constraints, cycles, export."""

import functools
import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from itertools import product

import pytest
from egglog import EGraph, union

from eqsched.backend import compile_program
from eqsched.egraph.derive import realize
from eqsched.egraph.dot import write_dot
from eqsched.egraph.encode import encode
from eqsched.egraph.facts import Facts, facts_of, partials_limit
from eqsched.egraph.lang import SERIALIZED_OPS, Root, root_expr, stmt_expr
from eqsched.egraph.space import Space, SpaceError
from eqsched.egraph.term import (
    REGISTER_TILES,
    VECTOR_LANES,
    BlockRef,
    Cached,
    PackRef,
    PieceLoop,
    RfactorLoop,
    Term,
    extent_allowed,
    pack_symbol,
    parent_path,
    partials_constraint,
    symbols,
    vector_lanes,
    walk,
)
from eqsched.ir import Program, naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload

NAIVE = naive_program(get_workload("matmul").build(4, 16, 2))  # C.i 4, C.j 16, C.k 2


def L(group, path, *body, kind="serial"):  # noqa: N802 - reads like the term it builds
    return PieceLoop(group, path, kind, tuple(body))


INIT, UPDATE = BlockRef("C.init"), BlockRef("C.update")
INIT_NEST = L("C.i", "", L("C.j", "", INIT))
UPDATE_NEST = L("C.i", "", L("C.j", "", L("C.k", "", UPDATE)))
NAIVE_TERM = Term((INIT_NEST, UPDATE_NEST))


@dataclass
class HandSaturation:
    """What Space reads from a saturation, for an e-graph built by hand with unions."""

    naive: Program
    facts: Facts
    data: dict
    root_class: str

    def serialized(self) -> dict:
        return self.data


def hand_space(root: Term, unions=(), naive: Program = NAIVE, lanes=VECTOR_LANES) -> Space:
    """The space of an e-graph holding `root` with each pair of statements or roots unioned
    (vector pieces of `lanes`)."""
    eg = EGraph()
    top = eg.let("top", root_expr(root))
    for a, b in unions:
        lhs, rhs = (root_expr(x) if isinstance(x, Term) else stmt_expr(x) for x in (a, b))
        eg.register(union(top if a is root else lhs).with_(rhs))
    eg.run(1)
    data = json.loads(eg._serialize().to_json())
    root_class = next(c for c, d in data["class_data"].items() if d.get("let") == "$top")
    return Space(HandSaturation(naive, facts_of(naive), data, root_class), lanes)


# The test space: the init nest reordered or not, its j loop split in two (inner piece serial or
# vector), the update nest's k loop outermost or not, and a packed variant of the whole root.
SPLIT_INIT_J = L("C.j", "0/2", L("C.j", "1/2", INIT))
VECTOR_INIT_J = L("C.j", "0/2", L("C.j", "1/2", INIT, kind="vector"))
K_OUTER = L("C.k", "", L("C.i", "", L("C.j", "", UPDATE)))
PACKED = Term((INIT_NEST, K_OUTER), packs=(PackRef("C.update", "B", 1),))
UNIONS = [
    (L("C.j", "", INIT), SPLIT_INIT_J),
    (L("C.j", "1/2", INIT), L("C.j", "1/2", INIT, kind="vector")),
    (INIT_NEST, L("C.j", "", L("C.i", "", INIT))),
    (NAIVE_TERM, PACKED),
]


@pytest.fixture(scope="module")
def space() -> Space:
    return hand_space(NAIVE_TERM, UNIONS)


# ---- an independent brute force over the serialized e-graph --------------------------------


def brute_force(sp: Space) -> set:
    """Every (Term, Sizes) by trying all node choices and all assignments of divisors (of the
    extent, of powers of two below twice the extent, and ceilings of the extent by them)."""
    data = sp.saturation.serialized()
    nodes, members = data["nodes"], {}
    for nid, n in nodes.items():
        members.setdefault(n["eclass"], []).append(n)

    def leaf(cls):
        (n,) = members[cls]
        op = n["op"]
        return json.loads(op) if op.startswith('"') else SERIALIZED_OPS.get(op) or int(op)

    def choices(cls):
        for n in members[cls]:
            op, ch = SERIALIZED_OPS.get(n["op"]), [nodes[c]["eclass"] for c in n["children"]]
            if op in ("nil", "rnil"):
                yield () if op == "nil" else ((), (), ())
            elif op == "block":
                yield BlockRef(leaf(ch[0]))
            elif op in ("cons", "rcons"):
                for head, tail in product(choices(ch[0]), choices(ch[1])):
                    if op == "cons":
                        yield (head,) + tail
                    elif not tail[1]:  # inlined stages come before the statements
                        yield tail[0], tail[1], (head,) + tail[2]
            elif op in ("loop", "rloop"):
                make = PieceLoop if op == "loop" else RfactorLoop
                for body in choices(ch[3]):
                    yield make(leaf(ch[0]), leaf(ch[1]), leaf(ch[2]), body)
            elif op == "cached":
                for body in choices(ch[1]):
                    yield Cached(leaf(ch[0]), body)
            elif op == "packed":
                for p, i, b in choices(ch[3]):
                    if not i and not b:  # packs are the tail of a root list
                        yield (PackRef(leaf(ch[0]), leaf(ch[1]), leaf(ch[2])),) + p, i, b
            elif op == "inlined":
                for p, i, b in choices(ch[1]):
                    yield p, (leaf(ch[0]),) + i, b

    parent = functools.cache(parent_path)  # asked millions of times, of a few paths

    def valid(loops, group, sizes):
        """Whether `sizes` of `group`'s symbols suit its `loops` (kind, path) of one term:
        every condition on sizes concerns the loops of one group."""
        for kind, path in loops:
            if not extent_allowed(kind, sizes[(group, path)], sp.vector_lanes):
                return False
        if group in sp.facts.extents:  # not a pack: every width listed is one
            extent = sp.facts.extents[group]
            used = {p for g, p in sizes if g == group}
            tree = set(used)
            for p in used:
                while p:
                    p = parent(p)[0]
                    tree.add(p)

            def ext(p):
                kids = [q for q in tree if q and parent(q)[0] == p]
                whole = math.prod(ext(q) for q in kids) if kids else None
                if p in used:
                    return sizes[(group, p)] if whole in (None, sizes[(group, p)]) else -1
                return whole

            top = sorted((q for q in tree if q and parent(q)[0] == ""),
                         key=lambda q: parent(q)[1])
            if "" in used and sizes[(group, "")] != extent:
                return False
            parts = [ext(q) for q in top]
            if top and (-1 in parts or not fits(extent, parts)):
                return False
        return True

    def fits(extent, top):
        """The top split multiplies to the extent, or leaves a remainder: a power-of-two inner
        tile from the narrowest vector to below twice the extent, or a register tile (3, 5, 6,
        7, or but for a power of two three times a power of two from 12) of less than half the
        extent, the outermost piece short by less than one step."""
        outer, tile = top[0], math.prod(top[1:])
        if outer * tile == extent:
            return True
        power = tile & (tile - 1) == 0 and min(VECTOR_LANES) <= tile < 2 * extent
        third = tile // 3
        triple = (tile % 3 == 0 and third >= 4 and third & (third - 1) == 0
                  and extent & (extent - 1) != 0)
        register = (tile in REGISTER_TILES or triple) and 2 * tile < extent
        return (power or register) and (outer - 1) * tile < extent < outer * tile

    def options(group, packs):
        """Every size a symbol of `group` is tried with."""
        if group.startswith("pack:"):
            dim = next(p.dim for p in packs if pack_symbol(p.buffer)[0] == group)
            shape = sp.naive.buffer(group[5:]).shape
            n = shape[dim]
            # divisors, and padded widths: powers of two from a vector up, below 2n; not n
            # itself along the innermost dimension (the buffer's own layout)
            return [d for d in range(2, 2 * n) if (n % d == 0
                    or (d & (d - 1) == 0 and d >= min(VECTOR_LANES)))
                    and not (d == n and dim == len(shape) - 1)]
        # Powers of two from 2n on are left out: `fits` takes no tile of 2n or more, and every
        # piece is at most its top-level piece, so no valid size reaches 2n; the register tiles
        # below n / 2.
        n = sp.facts.extents[group]
        tiles = [1 << a for a in range(n.bit_length() + 1) if 1 << a < 2 * n]
        tiles += [t for t in REGISTER_TILES if 2 * t < n]
        if n & (n - 1):  # three vectors across: not for a power of two
            tiles += [3 << a for a in range(2, n.bit_length()) if 2 * (3 << a) < n]
        return sorted({d for d in range(1, n + 1) if n % d == 0}
                      | {d for t in tiles for d in range(1, t + 1) if t % d == 0}
                      | {-(-n // t) for t in tiles})

    # Every assignment of every group's symbols is tried; since each condition concerns one
    # group, a group's valid assignments are found on their own (once per shape of its loops:
    # terms share them) and the term's sizes are every combination of them.
    valid_of_group: dict = {}
    out = set()
    for packs, inlined, body in choices(sp.root_class):
        term = Term(body, inlined, packs)
        syms = sorted(symbols(term))
        per_group = []
        for group in sorted({g for g, _ in syms}):
            mine = tuple(s for s in syms if s[0] == group)
            loops = tuple((s.kind, s.path) for s, _ in walk(term.body)
                          if isinstance(s, PieceLoop) and s.group == group)
            loops += tuple((partials_constraint(partials_limit(sp.facts, group)), s.path)
                           for s, _ in walk(term.body)
                           if isinstance(s, RfactorLoop) and s.group == group)
            key = (mine, loops, tuple(packs) if group.startswith("pack:") else ())
            if key not in valid_of_group:
                assignments = (dict(zip(mine, values))
                               for values in product(*(options(group, packs) for _ in mine)))
                valid_of_group[key] = [a for a in assignments if valid(loops, group, a)]
            per_group.append(valid_of_group[key])
        for parts in product(*per_group):
            sizes = {sym: size for part in parts for sym, size in part.items()}
            out.add((term, tuple(sorted(sizes.items()))))
    return out


def as_set(programs) -> set:
    return {(t, tuple(sorted(s.items()))) for t, s in programs}


# ---- counting ------------------------------------------------------------------------------


def test_count_matches_brute_force_enumeration(space):
    brute = brute_force(space)
    programs = space.enumerate()
    assert space.count() == len(programs) == len(brute)
    assert as_set(programs) == brute


def test_counts_by_hand(space):
    # The init nest: naive, reordered, j split with a serial inner piece (9 sizes: the divisors
    # 1..16, and register tiles of 3, 5, 6 and 7 with a short last step) or a vector one (8 or
    # 16 lanes) = 4 structures, 13 programs. The packed root shares that nest and multiplies by
    # 3 pack factors (2, 4, 8 of B's 16 columns: a panel of all 16 is B's own layout).
    assert space.count() == 13 + 13 * 3
    assert space.count_structures() == 4 + 4


def test_a_split_may_leave_a_remainder_counted_like_brute_force():
    # C.j of 12 in two pieces: the factorizations (1,12) .. (12,1), and inner tiles of 5, 8 and
    # 16 under a ceiling (3 x 5, 2 x 8, 1 x 16): 9 serial splits; only the powers of two give
    # vector lanes.
    twelve = naive_program(get_workload("matmul").build(4, 12, 2))
    sp = hand_space(NAIVE_TERM, UNIONS, twelve)
    programs, brute = sp.enumerate(), brute_force(sp)
    assert sp.count() == len(programs) == len(brute)
    assert as_set(programs) == brute
    only_serial = Term((SPLIT_INIT_J, UPDATE_NEST))
    vector = Term((VECTOR_INIT_J, UPDATE_NEST))
    assert hand_space(only_serial, naive=twelve).count() == 9
    assert [s for _, s in hand_space(vector, naive=twelve).enumerate()] == [
        {("C.i", ""): 4, ("C.j", ""): 12, ("C.j", "0/2"): 2, ("C.j", "1/2"): 8, ("C.k", ""): 2},
        {("C.i", ""): 4, ("C.j", ""): 12, ("C.j", "0/2"): 1, ("C.j", "1/2"): 16,
         ("C.k", ""): 2}]
    for term, sizes in programs:
        assert sp.contains(term, sizes)
        realize(term, sizes, twelve)


def test_the_vector_lanes_follow_the_target():
    # A 256-bit register (AVX2: 8 lanes) allows vector pieces of 4, 8, 16 and 32 lanes: the
    # init nest's vector piece of 16 columns has 3 sizes (4, 8, 16) instead of 2 (8, 16); the
    # 9 serial splits stay.
    avx2 = hand_space(NAIVE_TERM, UNIONS, lanes=vector_lanes(8))
    assert avx2.vector_lanes == (4, 8, 16, 32)
    assert avx2.count() == 14 + 14 * 3
    assert avx2.count_structures() == 4 + 4
    programs = avx2.enumerate()
    assert len(programs) == avx2.count() and as_set(programs) == brute_force(avx2)


def test_a_pack_factor_may_pad_the_packed_dimension():
    # B has 12 columns: its divisors 2, 3, 4, 6 (not 12: one panel of every column is B's own
    # layout), and the padded panels of 8 and 16 (one vector's width, panels 2 x 8 and 1 x 16
    # holding the 12 columns and a pad).
    twelve = naive_program(get_workload("matmul").build(4, 12, 2))
    sp = hand_space(NAIVE_TERM, UNIONS, twelve)
    packed = hand_space(PACKED, naive=twelve)
    assert [s[pack_symbol("B")] for _, s in packed.enumerate()] == [2, 3, 4, 6, 8, 16]
    programs, brute = sp.enumerate(), brute_force(sp)
    assert sp.count() == len(programs) == len(brute)
    assert as_set(programs) == brute
    for term, sizes in programs:
        if term.packs:
            assert sp.contains(term, sizes)
            realize(term, sizes, twelve)


def test_a_piece_vectorized_anywhere_takes_the_vector_constraint():
    both = Term((VECTOR_INIT_J, L("C.j", "0/2", L("C.j", "1/2", UPDATE))))
    only_serial = Term((SPLIT_INIT_J, L("C.j", "0/2", L("C.j", "1/2", UPDATE))))
    assert hand_space(both).count() == 2  # inner piece 8 or 16 lanes
    assert hand_space(only_serial).count() == 9  # 1, 2, 4, 8, 16 and 3, 5, 6, 7 with a remainder


def test_a_missing_sibling_piece_is_refused():
    with pytest.raises(SpaceError, match="not piece"):
        hand_space(Term((L("C.j", "0/2", INIT),))).count()


def test_a_piece_split_two_ways_is_refused():
    two = L("C.j", "0/2", L("C.j", "1/2", INIT))
    four = L("C.j", "0/4", L("C.j", "1/4", L("C.j", "2/4", L("C.j", "3/4", UPDATE))))
    with pytest.raises(SpaceError, match="both 2 and 4 ways|both 4 and 2 ways"):
        hand_space(Term((two, four))).count()


# A space where one group's tree differs between the nests that share it: the update nest splits
# piece 1/2 of C.j again, the init nest does not, so the init nest's counts are lifted to the
# deeper tree; limits come from loops of both nests (vector lanes, unroll <= 16) and the
# alternatives mix the deeper tree with an unsplit update nest.
def deep_update(kind="serial"):
    return L("C.i", "", L("C.j", "0/2", L("C.j", "1/2.0/2", L(
        "C.j", "1/2.1/2", L("C.k", "", UPDATE), kind=kind))))


INIT_SPLIT = L("C.i", "", SPLIT_INIT_J)
DEEP = Term((INIT_SPLIT, deep_update()))
DEEP_UNIONS = [
    (L("C.j", "1/2", INIT), L("C.j", "1/2", INIT, kind="vector")),
    (L("C.j", "1/2", INIT), L("C.j", "1/2", INIT, kind="unroll")),
    (L("C.j", "1/2.1/2", L("C.k", "", UPDATE)),
     L("C.j", "1/2.1/2", L("C.k", "", UPDATE), kind="vector")),
    (L("C.j", "1/2.1/2", L("C.k", "", UPDATE)),
     L("C.j", "1/2.1/2", L("C.k", "", UPDATE), kind="unroll")),
    (deep_update(), UPDATE_NEST),
    (INIT_SPLIT, INIT_NEST),
]


@pytest.mark.parametrize("extents", [(4, 16, 2), (3, 32, 2)])
def test_a_tree_split_deeper_in_one_nest_counts_like_brute_force(extents):
    naive = naive_program(get_workload("matmul").build(*extents))
    sp = hand_space(DEEP, DEEP_UNIONS, naive)
    programs, brute = sp.enumerate(limit=100_000), brute_force(sp)
    assert len(programs) == sp.count() == len(brute) > 0
    assert as_set(programs) == brute
    assert all(sp.contains(t, s) for t, s in programs)


def test_an_rfactor_loop_takes_at_most_its_partials_limit_counted_like_brute_force():
    naive = naive_program(get_workload("gemv").build(4096, 128))  # C.i 1, C.j 4096, C.k 128
    assert partials_limit(facts_of(naive), "C.k") == 64  # 64 copies of C fill 2^18 elements
    init = L("C.i", "", L("C.j", "", INIT))
    inner = L("C.k", "1/2", L("C.j", "", UPDATE))
    plain = L("C.k", "0/2", L("C.i", "", inner))
    factored = RfactorLoop("C.k", "0/2", "serial", (L("C.i", "", inner),))
    threads = RfactorLoop("C.k", "0/2", "parallel", (L("C.i", "", inner),))
    sp = hand_space(Term((init, plain)), [(plain, factored), (plain, threads)], naive=naive)
    programs, brute = sp.enumerate(), brute_force(sp)
    assert sp.count() == len(programs) == len(brute)
    assert as_set(programs) == brute
    partials = [sizes[("C.k", "0/2")] for term, sizes in programs
                if isinstance(term.body[1], RfactorLoop)]
    assert max(partials) == 64 and 128 not in partials and 2 in partials
    plain_count = len(programs) - len(partials)
    # serial and parallel, each with every split of the plain nest but 128 x 1 (128 partials)
    assert len(partials) == 2 * (plain_count - 1)
    term, sizes = next(p for p in programs if isinstance(p[0].body[1], RfactorLoop))
    assert encode(realize(term, sizes, naive)) == (term, sizes)


def test_an_rfactor_lane_loop_takes_vector_lanes_within_its_partials_limit():
    naive = naive_program(get_workload("gemv").build(8192, 128))  # C.i 1, C.j 8192, C.k 128
    assert partials_limit(facts_of(naive), "C.k") == 32  # 32 copies of C fill 2^18 elements
    init = L("C.i", "", L("C.j", "", INIT))
    plain = L("C.i", "", L("C.j", "", L("C.k", "0/2", L("C.k", "1/2", UPDATE))))
    lanes = L("C.i", "", L("C.j", "", L("C.k", "0/2",
                                         RfactorLoop("C.k", "1/2", "vector", (UPDATE,)))))
    root = Term((init, plain))
    sp = hand_space(root, [(root, Term((init, lanes)))], naive=naive)
    programs, brute = sp.enumerate(), brute_force(sp)
    assert sp.count() == len(programs) == len(brute)
    assert as_set(programs) == brute
    factored = [(term, sizes) for term, sizes in programs if term.body[1] == lanes]
    # vector lanes 8..64, of which 64 is more partials than fit
    assert sorted(sizes[("C.k", "1/2")] for _, sizes in factored) == [8, 16, 32]
    term, sizes = factored[0]
    program = realize(term, sizes, naive)
    assert encode(program) == (term, sizes)
    inputs = random_inputs(naive.computation, seed=0)
    ok, _, message = compare(compile_program(program).run(inputs),
                             reference(naive.computation, inputs), tolerance(naive.computation))
    assert ok, message


def test_whole_extent_limits_decide_at_once():
    # C.j has 16 = a vector width; C.i has 4, no vector width.
    vector_j = Term((L("C.i", "", L("C.j", "", INIT, kind="vector")),))
    vector_i = Term((L("C.j", "", L("C.i", "", INIT, kind="vector")),))
    assert hand_space(vector_j).count() == 1
    assert hand_space(vector_i).count() == 0


def test_a_cycle_is_refused_naming_its_classes():
    eg = EGraph()
    top = eg.let("top", root_expr(NAIVE_TERM))
    eg.register(union(top).with_(Root.packed("C.update", "B", 1, top)))
    eg.run(1)
    data = json.loads(eg._serialize().to_json())
    root_class = next(c for c, d in data["class_data"].items() if d.get("let") == "$top")
    with pytest.raises(SpaceError, match="cycle.*" + root_class):
        Space(HandSaturation(NAIVE, facts_of(NAIVE), data, root_class))


def test_one_spelling_of_the_root_list():
    # inlined(X, rcons(s, r)) and rcons(s, inlined(X, r)) would be the same Term: only the first
    # (the one root_expr writes) is a program.
    naive = naive_program(get_workload("mm_exp_mm").build(4, 8, 4, 8))
    stmt = L("C.i", "", INIT)
    canonical = Term((stmt,), inlined=("D",))
    eg = EGraph()
    top = eg.let("top", root_expr(canonical))
    eg.register(union(top).with_(Root.rcons(stmt_expr(stmt), Root.inlined("D", Root.rnil()))))
    eg.run(1)
    data = json.loads(eg._serialize().to_json())
    root_class = next(c for c, d in data["class_data"].items() if d.get("let") == "$top")
    sp = Space(HandSaturation(naive, facts_of(naive), data, root_class))
    assert [t for t, _ in sp.enumerate()] == [canonical]


# ---- sampling and enumeration --------------------------------------------------------------


def test_sampling_is_uniform_over_programs(space):
    n, draws = space.count(), 4500
    seen = Counter((t, tuple(sorted(s.items()))) for t, s in space.sample(draws, seed=7))
    assert set(seen) == as_set(space.enumerate())
    expected = draws / n
    chi2 = sum((seen[p] - expected) ** 2 / expected for p in seen)
    assert chi2 < 90  # 44 degrees of freedom: p ~ 1e-4; a structure-uniform one gives > 1000


def test_sampling_and_order_depend_on_content_not_on_egglog_ids(space):
    again = hand_space(NAIVE_TERM, list(reversed(UNIONS)))
    assert again.sample(50, seed=3) == space.sample(50, seed=3)
    assert again.enumerate() == space.enumerate()
    assert space.sample(50, seed=3) != space.sample(50, seed=4)


def test_program_indices_cover_the_space_once(space):
    assert len(as_set(space.program(i) for i in range(space.count()))) == space.count()
    with pytest.raises(SpaceError, match="outside"):
        space.program(space.count())
    with pytest.raises(SpaceError, match="more than the limit"):
        space.enumerate(limit=3)


# ---- membership ----------------------------------------------------------------------------


def test_every_enumerated_program_is_a_member(space):
    assert all(space.contains(t, s) for t, s in space.enumerate())


def test_non_members(space):
    sizes = {("C.i", ""): 4, ("C.j", "0/2"): 2, ("C.j", "1/2"): 8, ("C.j", ""): 16,
             ("C.k", ""): 2}
    vector_init = Term((L("C.i", "", VECTOR_INIT_J), UPDATE_NEST))
    assert space.contains(vector_init, sizes)
    assert not space.contains(vector_init, {**sizes, ("C.j", "0/2"): 4, ("C.j", "1/2"): 4})
    assert not space.contains(vector_init, {**sizes, ("C.k", ""): 1})  # not the extent
    assert not space.contains(vector_init, {k: v for k, v in sizes.items() if k[0] != "C.k"})
    reordered_update = Term((INIT_NEST, L("C.j", "", L("C.i", "", L("C.k", "", UPDATE)))))
    assert not space.contains(reordered_update, {("C.i", ""): 4, ("C.j", ""): 16,
                                                 ("C.k", ""): 2})
    packed_other = Term(NAIVE_TERM.body, packs=(PackRef("C.update", "B", 1),))
    assert not space.contains(packed_other, {("C.i", ""): 4, ("C.j", ""): 16, ("C.k", ""): 2,
                                             pack_symbol("B"): 4})
    assert space.contains(PACKED, {("C.i", ""): 4, ("C.j", ""): 16, ("C.k", ""): 2,
                                   pack_symbol("B"): 4})


def test_membership_of_a_program(space):
    assert space.contains_program(NAIVE)


# ---- export --------------------------------------------------------------------------------


def test_json_export_names_classes_by_content(space):
    dag = space.to_json()
    assert dag["programs"] == space.count() and dag["structures"] == space.count_structures()
    assert dag["root"] == "c0" and dag["classes"]["c0"]["structures"] == 8
    assert json.loads(json.dumps(dag)) == hand_space(NAIVE_TERM, UNIONS[::-1]).to_json()
    ops = {n["op"] for c in dag["classes"].values() for n in c["nodes"]}
    assert ops == {"packed", "rcons", "rnil", "loop", "cons", "nil", "block"}


def test_graphviz_export(space, tmp_path):
    text = space.to_dot()
    assert text.startswith("digraph space {") and "cluster_c0" in text
    assert '"loop C.j 1/2 vector"' in text
    dot_file, svg_file = write_dot(text, tmp_path / "space.svg")
    assert dot_file.read_text() == text
    assert svg_file is None or svg_file.exists()


def test_programs_built_by_the_manual_api_are_members(space):
    sch = Schedule(NAIVE)
    sch.split("C.init.j", [2, 8])
    sch.vectorize("C.init.j.1")
    assert space.contains_program(sch.program)
    sch.reorder("C.j", "C.i")  # the update nest is never reordered in this space
    assert not space.contains_program(sch.program)


def test_every_program_is_realized_by_its_derivation(space):
    for term, sizes in space.enumerate():
        assert encode(realize(term, sizes, NAIVE), space.facts) == (term, sizes)


def test_only_vector_and_unroll_constrain_extents():
    # The space counts serial and parallel loops under one key; that is exact only while these
    # kinds accept every extent.
    assert all(extent_allowed(k, e) for k in ("serial", "parallel") for e in range(1, 4097))


def test_a_walk_reaches_members_of_the_space(space):
    rng = random.Random(3)
    found = 0
    for _ in range(40):
        term = space.walk(lambda slot, choices: rng.choice(choices))
        options = space.size_options(term)
        if all(opts for _, opts in options):
            sizes = {(g, p): e for g, opts in options for p, e in rng.choice(opts).items()}
            assert space.contains(term, sizes)
            found += 1
    assert found > 0


def test_a_saturation_stopped_early_leaves_every_walk_a_choice():
    """One iteration leaves a helper node (`append`) not yet rewritten into a program node: the
    nodes over its class spell no program and are not offered to a walk (explore's search
    walks the space at random)."""
    from eqsched.egraph.saturate import Limits, saturate
    from eqsched.rules import resolve

    naive = naive_program(get_workload("matmul").build(16, 16, 16))
    sp = Space(saturate(naive, resolve(None), Limits(iterations=1)), VECTOR_LANES)
    rng = random.Random(0)

    def pick(slot, choices):
        assert choices, f"slot {slot} offers nothing to pick"
        return rng.choice(choices)

    for _ in range(50):
        sp.walk(pick)
    assert sp.count() > 0


def test_a_walk_that_always_takes_the_first_choice_is_deterministic(space):
    first = space.walk(lambda slot, choices: choices[0])
    assert first == space.walk(lambda slot, choices: choices[0])


def test_picks_for_a_sampled_term_walk_back_to_it(space):
    for term, _ in space.sample(20, seed=9):
        picks = space.picks_for(term)
        assert space.walk(lambda slot, choices: choices[picks[slot]]) == term


def test_picks_for_a_term_outside_the_space_are_refused(space):
    outside = Term((BlockRef("C.update"),))
    with pytest.raises(SpaceError, match="not in the space"):
        space.picks_for(outside)
