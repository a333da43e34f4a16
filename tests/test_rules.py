"""The rule sets: registry and selection, and each family's guards, checked on saturated e-graphs.

Guards are checked over every program an e-graph holds at once: a class "reaches" the blocks and
loops of any of its members, and any member of every class can be chosen, so "no loop node of
kind vector reaches a loop below it" means no program in the space has one.
"""

import json
from functools import cache

import pytest
from conftest import scaled_relu_matmul
from egglog import eq

import eqsched.rules.fuse as fuse_module
from eqsched.backend import compile_program
from eqsched.egraph.facts import facts_of, partials_limit
from eqsched.egraph.saturate import saturate
from eqsched.egraph.space import Space, build_space
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.rules import (
    DEFAULT,
    RULES,
    Rule,
    RuleError,
    analysis,
    default_rules,
    register,
    resolve,
)
from eqsched.rules.analysis import blocked_groups
from eqsched.rules.fuse import fusible, unsafe_groups
from eqsched.rules.rfactor import factorable
from eqsched.schedule import Schedule
from eqsched.te import Computation, compute, placeholder
from eqsched.workloads import get_workload


def naive(name, *size):
    wl = get_workload(name)
    return naive_program(wl.build(*(size or wl.small_size)))


class Graph:
    """Program nodes of a saturated e-graph by class: (op, literals, child classes)."""

    def __init__(self, sat):
        data = sat.serialized()["nodes"]
        cls = {nid: n["eclass"] for nid, n in data.items()}
        self.root = sat.root_class
        self.nodes: dict[str, list] = {}
        leaf = {}
        for n in data.values():
            op = n["op"]
            if op.startswith('"'):
                leaf[n["eclass"]] = json.loads(op)
            elif op.startswith("Kind."):
                leaf[n["eclass"]] = op[5:]
            elif op.isdigit():
                leaf[n["eclass"]] = int(op)
        for n in data.values():
            op, kids = n["op"], [cls[c] for c in n["children"]]
            if op in ("loop", "rloop"):
                self.nodes.setdefault(n["eclass"], []).append(
                    (op, tuple(leaf[c] for c in kids[:3]), kids[3:]))
            elif op == "block":
                self.nodes.setdefault(n["eclass"], []).append(("block", (leaf[kids[0]],), []))
            elif op in ("Body.cons", "Root.rcons"):
                self.nodes.setdefault(n["eclass"], []).append((op, (), kids))
            elif op in ("cached", "Root.inlined", "Root.packed"):
                self.nodes.setdefault(n["eclass"], []).append(
                    (op, tuple(leaf[c] for c in kids[:-1]), kids[-1:]))
            elif op in ("Body.nil", "Root.rnil"):
                self.nodes.setdefault(n["eclass"], []).append((op, (), []))
        self.reach = cache(self._reach)
        self.spells = cache(self._spells)

    def _spells(self, c) -> bool:
        """Some member spells a program (rfactor's `factor_lanes` leaves classes that do not)."""
        return any(all(self.spells(k) for k in kids) for _, _, kids in self.nodes.get(c, []))

    def loops(self):
        """Every loop node reachable from the root: (group, path, kind, body class)."""
        seen, todo, out = set(), [self.root], []
        while todo:
            c = todo.pop()
            if c in seen:
                continue
            seen.add(c)
            for op, lit, kids in self.nodes.get(c, []):
                if op == "loop":
                    out.append((*lit, kids[0]))
                todo += kids
        return out

    def _reach(self, c):
        """(blocks, loop (group, path) pairs) of any member, anywhere below."""
        blocks, loops = set(), set()
        for op, lit, kids in self.nodes.get(c, []):
            if op == "block":
                blocks.add(lit[0])
            if op in ("loop", "rloop"):
                loops.add(lit[:2])
            for k in kids:
                b, lp = self.reach(k)
                blocks |= b
                loops |= lp
        return frozenset(blocks), frozenset(loops)


@pytest.fixture(scope="module")
def matmul():
    return saturate(naive("matmul"), default_rules())


@pytest.fixture(scope="module")
def chain():
    return saturate(naive("mm_exp_mm"), default_rules())


# ---- registry and selection ----------------------------------------------------------------


def test_default_set_is_the_transformation_families_plus_their_analysis():
    names = [r.name for r in default_rules()]
    assert names[:len(DEFAULT)] == list(DEFAULT)
    assert {"contains", "spatial", "nesting", "unit_stride"} <= set(names)
    assert not any(RULES[n].growth for n in names[len(DEFAULT):])
    for rule in default_rules():
        assert "->" in rule.__doc__


def test_resolve_edits_names_and_objects():
    assert "pack" not in [r.name for r in resolve("-pack")]
    assert [r.name for r in resolve(["tile", "reorder"])] == ["tile", "reorder", "nesting"]
    assert [r.name for r in resolve("tile,+vectorize")][:2] == ["tile", "vectorize"]
    assert "nesting" in [r.name for r in resolve("tile,+vectorize")]  # vectorize's guards

    class Mine(RULES["reorder"].__class__):
        """loop(a, loop(b, y)) -> loop(b, loop(a, y)), my way"""

        name = "my_reorder"

    swapped = resolve(["-reorder", Mine()])
    assert "my_reorder" in [r.name for r in swapped] and "reorder" not in [r.name for r in swapped]
    with pytest.raises(RuleError, match="unknown rule 'tiles'"):
        resolve("tiles")
    for nothing in ("", " , "):  # the default set is None; an empty spec is a typo
        with pytest.raises(RuleError, match="names no rule"):
            resolve(nothing)


def test_a_rule_must_draw_itself():
    with pytest.raises(RuleError, match="before -> after"):
        @register
        class Undocumented(Rule):
            name = "undocumented"


# ---- tile and reorder ----------------------------------------------------------------------


def test_tiles_are_ssrsrs_and_never_nested(matmul):
    g = Graph(matmul)
    paths = {(grp, path) for grp, path, _, _ in g.loops()}
    assert {("C.i", f"{n}/4") for n in range(4)} <= paths
    assert {("C.j", f"{n}/4") for n in range(4)} <= paths
    assert {("C.k", "0/2"), ("C.k", "1/2")} <= paths
    assert not any("." in path for _, path in paths)


def test_pieces_of_a_group_keep_their_order(matmul):
    g = Graph(matmul)
    for group, path, _, body in g.loops():
        if path:
            index, ways = map(int, path.split("/"))
            below = {p for grp, p in g.reach(body)[1] if grp == group and p}
            assert all(int(p.split("/")[0]) > index for p in below), (group, path, below)


def test_reorder_moves_the_reduction_outward(matmul):
    g = Graph(matmul)
    outer_k = [body for grp, path, _, body in g.loops() if grp == "C.k" and path == ""]
    assert any(("C.i", "") in g.reach(b)[1] for b in outer_k)


def test_groups_without_a_useful_split_are_not_tiled():
    # 1 and 3 have no split but the loop itself (3 has no remainder tile: term.remainder_tiles).
    sat = saturate(naive("conv2d_nchw"), default_rules())  # n = 1, C = 3, ry = rx = 3, K = 4
    facts = facts_of(sat.naive)
    whole = {facts.group("Y.update", axis) for axis in ("n", "rc", "ry", "rx")}
    paths = {(grp, path) for grp, path, _, _ in Graph(sat).loops()}
    assert not any(grp in whole and p for grp, p in paths)
    assert ("Y.k", "3/4") in paths


def test_a_prime_group_is_tiled_with_a_remainder():
    sat = saturate(naive_program(get_workload("matmul").build(13, 16, 4)), default_rules())
    loops = Graph(sat).loops()
    assert {("C.i", "3/4"), ("C.j", "3/4")} <= {(grp, path) for grp, path, _, _ in loops}
    assert ("C.i", "3/4", "vector") not in {(grp, path, kind) for grp, path, kind, _ in loops}


# ---- vectorize, unroll, parallel -----------------------------------------------------------


def test_a_vector_loop_is_innermost_over_the_unit_stride_group(matmul):
    g = Graph(matmul)
    vector = [(grp, path, body) for grp, path, kind, body in g.loops() if kind == "vector"]
    assert vector
    # rows of 24 waste a quarter of two 16-lane registers: C is blocked along its 16 rows too
    assert blocked_groups(facts_of(naive("matmul"))) == {"C": "C.i"}
    assert {grp for grp, _, _ in vector} == {"C.j", "C.i"}
    for grp, path, body in vector:
        assert path in ("", "3/4")
        assert not g.reach(body)[1]


def test_unrolled_loops_can_hold_the_register_tile(matmul):
    g = Graph(matmul)

    def register_tile(body):  # some member: blocks and vector or unrolled loops only (an
        # rfactor lane loop is a vector loop)
        return any(op == "Body.nil" or op == "Body.cons" and register_tile(kids[1]) and any(
            o == "block" or o in ("loop", "rloop") and lit[2] in ("vector", "unroll")
            and register_tile(k[0])
            for o, lit, k in g.nodes.get(kids[0], [])) for op, _, kids in g.nodes.get(body, []))

    unrolled = [body for _, _, kind, body in g.loops() if kind == "unroll" and g.spells(body)]
    assert unrolled and all(register_tile(body) for body in unrolled)


@pytest.fixture(scope="module")
def conv():
    return saturate(naive("conv2d_nchw"), default_rules())


@pytest.mark.parametrize("space", ["chain", "conv"])
def test_parallel_only_at_the_root_or_alone_in_a_parallel_loop_never_over_a_reduction(space,
                                                                                     request):
    sat = request.getfixturevalue(space)
    g = Graph(sat)
    facts = facts_of(sat.naive)
    parents = {}  # class: the (op, its class, its other children) of each node holding it
    for owner, members in g.nodes.items():
        for op, _, kids in members:
            for n, kid in enumerate(kids):
                parents.setdefault(kid, []).append((op, owner, kids[:n] + kids[n + 1:]))
    parallel = {c for c, members in g.nodes.items() for op, lit, _ in members
                if op == "loop" and lit[2] == "parallel"}
    nil = {c for c, members in g.nodes.items() for op, _, _ in members if op == "Body.nil"}

    def parallel_body(cls):  # the class is the body of parallel loops only
        return all(op == "loop" and owner in parallel for op, owner, _ in parents[cls])

    assert parallel
    collapsed = 0
    for cls in parallel:
        for op, owner, others in parents[cls]:
            if op == "Body.cons":  # the only statement of a parallel loop's body
                assert others[0] in nil and parallel_body(owner)
                collapsed += 1
            else:
                assert op == "Root.rcons"
        for op, lit, kids in g.nodes[cls]:
            if op == "loop" and lit[2] == "parallel":
                assert not any(lit[0] in facts.reduce_groups[b] for b in g.reach(kids[0])[0])
    assert collapsed


@pytest.mark.parametrize("workload,size", [("conv2d_nchw", ()), ("softmax", (1, 256)),
                                           ("mm_exp_mm", ())])
def test_facts_never_pass_up_through_a_parallel_loop_and_the_space_is_the_same(workload, size,
                                                                               monkeypatch):
    # No guard reads a parallel loop's facts (its root list also holds the serial form; a
    # collapsed inner loop's class is read by none): deriving them, as before, adds rows and
    # time but not one program.
    program = naive(workload, *size)
    lean = saturate(program, default_rules())
    monkeypatch.setattr(analysis, "not_parallel", lambda kind: eq(kind).to(kind))
    full = saturate(program, default_rules())
    assert Space(full).count() == Space(lean).count()
    assert lean.report.enodes < full.report.enodes


def test_a_batch_of_one_shares_the_loop_below_it_among_threads(conv):
    # The batch loop (extent 1) stays at the root of every nest; a loop from under it runs in
    # parallel around it, else a one-image convolution would have nothing to share.
    g = Graph(conv)
    facts = facts_of(conv.naive)
    batch = facts.group("Y.update", "n")
    assert facts.extents[batch] == 1
    shared = {group for group, _, kind, body in g.loops() if kind == "parallel"
              and (batch, "") in g.reach(body)[1]}
    assert {facts.group("Y.update", axis) for axis in ("k", "p", "q")} <= shared


# ---- rfactor -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def row():
    return saturate(naive("softmax", 1, 256), default_rules())


def test_rfactor_only_where_partials_of_the_output_stay_small():
    assert factorable(facts_of(naive("matmul", 512, 512, 512))) == []
    assert factorable(facts_of(naive("conv2d_nchw", 1, 64, 56, 56, 64, 3, 3, 1, 1))) == []
    gemv = facts_of(naive("gemv", 4096, 4096))
    assert factorable(gemv) == [("C.update", "C", "C.k")]
    assert partials_limit(gemv, "C.k") == 64  # 64 copies of a 4,096-long output
    row = facts_of(naive("softmax", 1, 65536))
    assert [(blk, group) for blk, _, group in factorable(row)] == [("M.update", "M.c"),
                                                                   ("S.update", "E.j")]
    assert partials_limit(row, "E.j") == 1 << 18


def test_rfactor_loops_sit_at_the_root_or_are_lanes_around_the_reduction_of_their_body(row):
    g = Graph(row)
    facts = facts_of(row.naive)
    parents = {}
    for members in g.nodes.values():
        for op, _, kids in members:
            for kid in kids:
                parents.setdefault(kid, set()).add(op)
    factored = [(c, lit, kids) for c, members in g.nodes.items() for op, lit, kids in members
                if op == "rloop"]
    assert {kind for _, (_, _, kind), _ in factored} == {"serial", "parallel", "vector"}
    assert {group for _, (group, _, _), _ in factored} == {"M.c", "E.j"}
    for cls, (group, path, kind), (body,) in factored:
        blocks = g.reach(body)[0]
        reducing = [b for b in blocks if group in facts.reduce_groups[b]]
        assert len(reducing) == 1  # the only accumulation the loop runs is the one factored
        if kind == "vector":  # the lanes: the group's innermost piece, a list of blocks
            assert parents[cls] == {"Body.cons"} and path == "1/2"
            assert all(b == reducing[0] or facts.store_inner_group[b] == group for b in blocks)
        else:
            assert parents[cls] == {"Root.rcons"}
            assert {facts.stage_of[b] for b in blocks} == {facts.stage_of[reducing[0]]}


def test_the_space_holds_a_row_softmax_factored_over_threads():
    naive_row = naive("softmax", 1, 256)
    sch = Schedule(naive_row)
    for stage in ("M", "S"):
        outer, _ = sch.split(f"{stage}.c", [-1, 16])
        sch.reorder(outer, f"{stage}.i")
        sch.rfactor(f"{stage}.update", outer)
        sch.parallel(outer)
    for stage in ("E", "Y"):
        outer, inner = sch.split(f"{stage}.j", [-1, 16])
        sch.reorder(outer, f"{stage}.i")
        sch.parallel(outer)
        sch.vectorize(inner)
    assert build_space(naive_row, default_rules()).contains_program(sch.program)
    assert not build_space(naive_row, resolve("-rfactor")).contains_program(sch.program)


def test_the_space_holds_a_row_softmax_with_vector_reductions_and_no_early_reader():
    naive_row = naive("softmax", 1, 256)
    sch = Schedule(naive_row)
    for stage in ("M", "S"):
        _, lanes = sch.split(f"{stage}.c", [-1, 16])
        sch.rfactor(f"{stage}.update", lanes)
        sch.vectorize(lanes)
    for stage in ("E", "Y"):
        sch.vectorize(sch.split(f"{stage}.j", [-1, 16])[1])
    space = build_space(naive_row, default_rules())
    assert space.contains_program(sch.program)
    assert not build_space(naive_row, resolve("-rfactor")).contains_program(sch.program)
    # E fused into the row max's nest reads M before the partials are reduced: not in the space
    early = Schedule(naive_row, checked=False)
    early.fuse("E", at="M.i")
    _, lanes = early.split("M.c", [-1, 16])
    early.rfactor("M.update", lanes)
    early.vectorize(lanes)
    assert not space.contains_program(early.program)


# ---- fuse ----------------------------------------------------------------------------------


def test_a_consumer_never_runs_inside_its_producers_reduction(chain):
    g = Graph(chain)
    for group, _, _, body in g.loops():
        if group == "C.k":
            assert "D" not in g.reach(body)[0]
    fused = [body for group, _, _, body in g.loops() if group == "C.i"
             and {"C.update", "D", "F.update"} <= g.reach(body)[0]]
    assert fused  # the whole chain shares one C.i loop in some program


def shifted(offset):
    X = placeholder((9,), "X")
    C = compute((9,), lambda i: X[i] * 2.0, "C")
    if offset is None:  # C[i] and C[8 - i]: joined by the first read, unsafe by the second
        D = compute((9,), lambda i: C[i] + C[8 - i], "D")
    else:
        D = compute((8,), lambda i: C[i] + C[i + offset], "D")
    return naive_program(Computation("shift", [D]))


@pytest.mark.parametrize("offset", [1, None], ids=["neighbour", "mirror"])
def test_a_consumer_reading_other_points_is_never_fused(offset):
    prog = shifted(offset)
    g = Graph(saturate(prog, default_rules()))
    for _, _, _, body in g.loops():
        assert not {"C", "D"} <= g.reach(body)[0]


def test_the_mirror_read_makes_its_group_unsafe():
    facts = facts_of(shifted(None))
    assert unsafe_groups(facts) == {"C.i"} and not fusible(facts)


def test_init_and_update_fuse(matmul):
    g = Graph(matmul)
    assert any({"C.init", "C.update"} <= g.reach(body)[0] for _, _, _, body in g.loops())


def test_an_epilogue_reads_the_reduction_through_an_inlined_stage_and_fuses_into_its_tile(
        monkeypatch):
    naive_epilogue = scaled_relu_matmul(4, 6, 5)
    sch = Schedule(naive_epilogue)
    sch.inline("D")  # E now reads C itself, a point at a time
    sch.fuse("C.init", at="C.j")
    sch.fuse("E", at="C.j")  # after C.k, inside the tile: C[i, j] is whole there
    assert ("C.update", "E", "C.i") in fusible(facts_of(naive_epilogue))
    assert build_space(naive_epilogue, default_rules()).contains_program(sch.program)
    comp = naive_epilogue.computation
    inputs = random_inputs(comp)
    ok, _, message = compare(compile_program(sch.program).run(inputs),
                             reference(comp, inputs), tolerance(comp))
    assert ok, message
    # Without pairs through the inlined stage, the only pairs join C with D and D with E.
    monkeypatch.setattr(fuse_module, "inlinable", lambda facts: [])
    assert not build_space(naive_epilogue, default_rules()).contains_program(sch.program)


# ---- cache_write, inline, pack -------------------------------------------------------------


def test_local_tiles_hold_one_stage_a_spatial_loop_and_the_whole_reduction(chain):
    g = Graph(chain)
    facts = facts_of(chain.naive)
    tiles = [(op, kids) for members in g.nodes.values() for op, _, kids in members
             if op == "cached"]
    assert tiles
    for _, (body,) in tiles:
        blocks, loops = g.reach(body)
        stages = {facts.stage_of[b] for b in blocks}
        assert len(stages) == 1
        reduce = set().union(*(facts.reduce_groups[b] for b in blocks))
        spatial = {grp for b in blocks for grp in facts.groups_of(b)} - reduce
        assert any(grp in spatial for grp, _ in loops)
        # every reduce loop is inside the tile: its whole loop or its outermost piece
        assert all(any(grp == r and path in ("", "0/2", "0/4") for grp, path in loops)
                   for r in reduce)


def test_inline_takes_the_intermediate_above_the_statement_list(chain):
    g = Graph(chain)
    inlined = [(lit, kids[0]) for op, lit, kids in g.nodes[g.root] if op == "Root.inlined"]
    assert [lit for lit, _ in inlined] == [("D",)]
    assert "D" not in g.reach(inlined[0][1])[0]
    assert {"C.update", "F.update"} <= g.reach(inlined[0][1])[0]


def test_pack_panels_the_operand_along_the_unit_stride_group(chain):
    g = Graph(chain)
    packs = {lit for members in g.nodes.values() for op, lit, _ in members if op == "Root.packed"}
    # the small chain's rows (C[8, 12], F[8, 10]) hold no vector: C is blocked along i and packs
    # A[i, k] along i; F's operand E[m, j] has no i
    assert packs == {("C.update", "A", 0)}
    g = Graph(saturate(naive("matmul", 16, 48, 8), default_rules()))
    packs = {lit for members in g.nodes.values() for op, lit, _ in members if op == "Root.packed"}
    assert packs == {("C.update", "B", 1)}


# ---- vectorizing across the output's innermost axis (a blocked layout) ---------------------


@pytest.fixture(scope="module")
def late_conv():
    """A late ResNet stage in small: 5x5 outputs (no vector fits a row), 16 output channels."""
    return saturate(naive("conv2d_nchw", 1, 3, 5, 5, 16, 3, 3, 1, 1), default_rules())


def test_stages_whose_rows_are_no_whole_registers_are_blocked_along_an_axis_that_is():
    for name in ("matmul", "mm_exp_mm", "softmax", "elementwise_chain"):
        wl = get_workload(name)
        assert blocked_groups(facts_of(naive_program(wl.build(*wl.default_size)))) == {}, name
    # mlp's second layer has 10 outputs a row: it vectorizes over the batch (the group of L1.b)
    assert blocked_groups(facts_of(naive("mlp", 128, 784, 128, 10))) == {"L2": "L1.b"}
    late = facts_of(naive("conv2d_nchw", 1, 512, 7, 7, 512, 3, 3, 1, 1))
    assert blocked_groups(late) == {"Y": "Y.k"}  # Y[n, k, p, q]: q = 7, k = 512
    # 56-wide rows hold 8-lane vectors but end in half a 16-lane register; 64 channels do not
    resnet = get_workload("conv2d_nchw")
    assert blocked_groups(facts_of(naive_program(resnet.build(*resnet.default_size)))) \
        == {"Y": "Y.k"}
    assert blocked_groups(facts_of(naive("matmul", 16, 5, 7))) == {"C": "C.i"}
    assert blocked_groups(facts_of(naive("matmul", 7, 5, 7))) == {}  # nothing holds a vector
    # rows of 24 as two 16-lane registers leave a quarter of their lanes empty; of 200, 1 in 26
    assert blocked_groups(facts_of(naive("matmul", 16, 24, 8))) == {"C": "C.i"}
    assert blocked_groups(facts_of(naive("matmul", 64, 200, 64))) == {}
    assert blocked_groups(facts_of(naive("matmul", 1024, 1000, 64))) == {}


def test_a_blocked_stage_vectorizes_and_tiles_along_its_blocked_group(late_conv):
    g = Graph(late_conv)
    vector = {(grp, path) for grp, path, kind, body in g.loops() if kind == "vector"}
    # the unit-stride rows (Y.q of 5, Xpad.w of 7) keep their rule: no lane count fits them
    # whole, their innermost pieces take 8 lanes with a remainder (term.remainder_tiles)
    assert vector == {("Y.k", ""), ("Y.k", "3/4"), ("Y.q", ""), ("Y.q", "3/4"), ("Xpad.w", ""),
                      ("Xpad.w", "3/4")}
    anchors = {lit[:2] for members in g.nodes.values() for op, lit, kids in members
               if op == "loop" for o, _, head in g.nodes[kids[0]]
               if o == "Body.cons" and any(x[0] == "cached" for x in g.nodes[head[0]])}
    assert anchors == {("Y.k", "1/4")}  # the tile's loops over Y.k end in its vector piece
    packs = {lit for members in g.nodes.values() for op, lit, _ in members if op == "Root.packed"}
    assert packs == {("Y.update", "W", 0)}
