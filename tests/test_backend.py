"""The LLVM backend runs every node and loop kind correctly, and refuses what it cannot compile."""

import gc
import re
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest

from eqsched import expr, te
from eqsched.backend import (
    BackendError,
    CompileOptions,
    Target,
    TargetError,
    aligned_copy,
    compile_program,
)
from eqsched.backend.lower import PEEL_LIMIT, body_copies, lower
from eqsched.expr import Const, Load, Var
from eqsched.interp import run_program
from eqsched.ir import (
    Alloc,
    Binding,
    Block,
    Buffer,
    Loop,
    LoopKind,
    Program,
    Scope,
    naive_program,
    nest,
)
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload, list_workloads

S, U, V, P = LoopKind.SERIAL, LoopKind.UNROLL, LoopKind.VECTOR, LoopKind.PARALLEL
rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def matmul(m: int, n: int, k: int) -> te.Computation:
    a, b = te.placeholder((m, k), "A"), te.placeholder((k, n), "B")
    r = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum_(a[i, r] * b[r, j], axis=r), "C")
    return te.Computation("matmul", [c])


def unary(n: int, fn) -> te.Computation:
    x = te.placeholder((n,), "X")
    return te.Computation("unary", [te.compute((n,), lambda i: fn(x, i), "Y")])


def retile(prog: Program, block: str, loops: list[tuple[str, int, LoopKind, str, int]]) -> Program:
    """Replace the whole program by one nest around `block`: loops (name, extent, kind, axis,
    stride) outermost first; each axis becomes the sum of stride * loop over its loops."""
    blk = prog.block(block)
    terms: dict[str, list[tuple[str, int]]] = {a.name: [] for a in blk.axes}
    for name, _, _, axis, stride in loops:
        terms[axis].append((name, stride))
    blk = replace(blk, bindings=tuple(Binding(a, tuple(t)) for a, t in terms.items()))
    return prog.with_body(nest([(n, e, k) for n, e, k, _, _ in loops], (blk,)))


def vectorized_unary(n: int, fn) -> Program:
    return retile(naive_program(unary(n, fn)), "Y",
                  [("Y.i.0", n // 16, S, "i", 16), ("Y.i.1", 16, V, "i", 1)])


def run(prog: Program, *arrays: np.ndarray, options: CompileOptions | None = None) -> None:
    compile_program(prog, options)(*arrays)


# ---- naive programs from the front end --------------------------------------------------------


def test_naive_matmul_with_global_intermediate_matches_numpy():
    a, b = te.placeholder((5, 7), "A"), te.placeholder((7, 6), "B")
    k = te.reduce_axis(7, "k")
    c = te.compute((5, 6), lambda i, j: te.sum_(a[i, k] * b[k, j], axis=k), "C")
    d = te.compute((5, 6), lambda i, j: expr.exp(c[i, j] * 0.5) - 1.0, "D")
    prog = naive_program(te.Computation("chain", [d]))
    assert [buf.name for buf in prog.buffers if buf.scope == Scope.GLOBAL] == ["C"]
    x, y, out = rand(5, 7), rand(7, 6), np.zeros((5, 6), np.float32)
    kernel = compile_program(prog)
    kernel(x, y, out)
    np.testing.assert_allclose(out, np.exp((x @ y) * 0.5) - 1.0, rtol=1e-5, atol=1e-5)
    out2 = np.zeros_like(out)
    kernel(x, y, out2)  # the intermediate is reused, and reinitialized by the program
    np.testing.assert_array_equal(out, out2)


@pytest.mark.parametrize("workload", list_workloads(), ids=lambda w: w.name)
def test_every_workload_naive_program_matches_the_reference(workload):
    comp = workload.build(*workload.small_size)
    prog = naive_program(comp)
    inputs = random_inputs(comp, seed=1)
    outputs = compile_program(prog).run(inputs)
    ok, _, message = compare(outputs, reference(comp, inputs), tolerance(comp))
    assert ok, message


BINARY = {
    "+": (lambda x, y: x + y, np.add), "-": (lambda x, y: x - y, np.subtract),
    "*": (lambda x, y: x * y, np.multiply), "/": (lambda x, y: x / y, np.divide),
    "max": (expr.maximum, np.maximum), "min": (expr.minimum, np.minimum),
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_operators_scalar_and_vector(op):
    build, ref = BINARY[op]
    a, b = te.placeholder((32,), "A"), te.placeholder((32,), "B")
    c = te.compute((32,), lambda i: build(a[i], b[i]), "C")
    scalar = naive_program(te.Computation("binary", [c]))
    vector = retile(scalar, "C", [("C.i.0", 2, S, "i", 16), ("C.i.1", 16, V, "i", 1)])
    x, y = rand(32), rand(32) + 3.0
    for prog in (scalar, vector):
        out = np.empty(32, np.float32)
        run(prog, x, y, out)
        np.testing.assert_allclose(out, ref(x, y), rtol=1e-6)


@pytest.mark.parametrize("fn, ref", [
    (lambda x, i: -x[i], np.negative),
    (lambda x, i: expr.Call("abs", (x[i],)), np.abs),
    (lambda x, i: expr.relu(x[i]), lambda v: np.maximum(v, 0)),
])
def test_neg_abs_relu_scalar_and_vector(fn, ref):
    x = rand(32)
    x[5] = np.nan  # max/min propagate NaN, as numpy's do
    for prog in (naive_program(unary(32, fn)), vectorized_unary(32, fn)):
        out = np.empty(32, np.float32)
        run(prog, x, out)
        np.testing.assert_array_equal(out, ref(x))


def test_max_reduction_matches_numpy():
    x = te.placeholder((6, 9), "X")
    k = te.reduce_axis(9, "k")
    m = te.compute((6,), lambda i: te.max_(x[i, k], axis=k), "M")
    data = rand(6, 9)
    data[2, 4] = np.nan
    out = np.empty(6, np.float32)
    run(naive_program(te.Computation("rowmax", [m])), data, out)
    np.testing.assert_array_equal(out, data.max(axis=1))


# ---- scheduled forms built by hand -------------------------------------------------------------


def packed_matmul(m: int, n: int, k: int, rows: int) -> Program:
    """B packed into 32-wide panels; each rows x 32 tile of C accumulated in a local buffer
    (unrolled rows x 2 unrolled x 16 vectorized) over k, then written out (bench/backend_probe)."""
    i, j, kk, p0, p1, p2 = (Var(v) for v in ("i", "j", "k", "p0", "p1", "p2"))
    ax = te.Axis
    pack = Block("B_packed", "B_packed", (ax("p0", n // 32), ax("p1", k), ax("p2", 32)),
                 tuple(Binding(p, ((f"B_packed.{p}", 1),)) for p in ("p0", "p1", "p2")),
                 "B_packed", (p0, p1, p2), Load("B", (p1, p0 * 32 + p2)))
    local = (i % rows, (j // 16) % 2, j % 16)

    def ij(pre: str) -> tuple[Binding, Binding]:
        return (Binding("i", (("C.i.0", rows), (f"{pre}.i.1", 1))),
                Binding("j", (("C.j.0", 32), (f"{pre}.j.1", 16), (f"{pre}.j.2", 1))))

    def tile(pre: str, inner: Block) -> tuple[Loop]:
        return nest([(f"{pre}.i.1", rows, U), (f"{pre}.j.1", 2, U), (f"{pre}.j.2", 16, V)],
                    (inner,))  # type: ignore[return-value]

    axes = (ax("i", m), ax("j", n))
    init = Block("C.init", "C", axes, ij("C.init"), "C.local", local, Const(0.0))
    update = Block("C.update", "C", axes + (ax("k", k, "reduce"),),
                   ij("C") + (Binding("k", (("C.k", 1),)),), "C.local", local,
                   Load("A", (i, kk)) * Load("B_packed", (j // 32, kk, j % 32)), "sum")
    write = Block("C.write", "C", axes, ij("C.write"), "C", (i, j), Load("C.local", local))
    body = (Alloc("C.local", tile("C.init", init) + (Loop("C.k", k, S, tile("C", update)),)
                  + tile("C.write", write)),)
    buffers = (Buffer("A", (m, k), Scope.INPUT), Buffer("B", (k, n), Scope.INPUT),
               Buffer("C", (m, n), Scope.OUTPUT),
               Buffer("B_packed", (n // 32, k, 32), Scope.GLOBAL),
               Buffer("C.local", (rows, 2, 16), Scope.LOCAL))
    return Program("matmul", buffers, nest([("B_packed.p0", n // 32, S), ("B_packed.p1", k, S),
                                            ("B_packed.p2", 32, V)], (pack,))
                   + nest([("C.j.0", n // 32, S), ("C.i.0", m // rows, S)], body),
                   matmul(m, n, k))


def test_packed_register_tiled_matmul_matches_numpy_and_interpreter():
    prog = packed_matmul(8, 64, 9, rows=4)
    a, b, c = rand(8, 9), rand(9, 64), np.empty((8, 64), np.float32)
    kernel = compile_program(prog)
    kernel(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c, run_program(prog, {"A": a, "B": b})["C"], rtol=1e-5, atol=1e-5)


def test_register_tile_is_promoted_and_uses_the_widest_fmas():
    kernel = compile_program(packed_matmul(8, 64, 9, rows=4))
    assert "alloca" not in kernel.llvm_ir()  # SROA turned C.local into vector registers
    register = "zmm" if Target.host().vector_lanes == 16 else "ymm"
    assert re.search(rf"vfmadd\w*ps\s+[^\n]*{register}", kernel.asm())


def test_transpose_vectorized_on_the_store_side_gathers_the_loads():
    x = te.placeholder((16, 16), "X")
    y = te.compute((16, 16), lambda i, j: x[j, i] * 2.0, "Y")
    prog = retile(naive_program(te.Computation("transpose", [y])), "Y",
                  [("Y.i", 16, S, "i", 1), ("Y.j", 16, V, "j", 1)])
    data, out = rand(16, 16), np.empty((16, 16), np.float32)
    run(prog, data, out)
    np.testing.assert_array_equal(out, data.T * 2.0)


def test_non_affine_index_scalar_and_vectorized():
    def squares(x, i):
        return x[(i * i) % 32]

    data = rand(32)
    for prog in (naive_program(unary(32, squares)), vectorized_unary(32, squares)):
        out = np.empty(32, np.float32)
        run(prog, data, out)
        np.testing.assert_array_equal(out, data[(np.arange(32) ** 2) % 32])


def test_unrolled_loops_with_a_vector_inside():
    x = rand(64)
    prog = retile(naive_program(unary(64, lambda v, i: v[i] + 1.0)), "Y",
                  [("Y.i.0", 2, U, "i", 32), ("Y.i.1", 2, U, "i", 16), ("Y.i.2", 16, V, "i", 1)])
    out = np.empty(64, np.float32)
    run(prog, x, out)
    np.testing.assert_array_equal(out, x + 1.0)


# ---- padding: the untaken side of a select never touches memory --------------------------------

FAR = 1 << 40  # an element offset far outside any mapping: a load there would crash


def test_select_loads_only_on_the_side_each_lane_takes():
    data = rand(16)
    x = te.placeholder((16,), "X")
    y = te.compute((16,), lambda i: expr.select(i < 1, x[i * FAR], x[i] + 1.0), "Y")
    naive = naive_program(te.Computation("guard", [y]))
    per_lane = retile(naive, "Y", [("Y.i", 16, V, "i", 1)])  # masked gather + masked load
    expected = np.concatenate([data[:1], data[1:] + 1.0])
    for prog in (naive, per_lane):
        out = np.empty(16, np.float32)
        run(prog, data, out)
        np.testing.assert_array_equal(out, expected)


def test_select_on_an_outer_loop_branches_around_the_vector_code():
    data = rand(16)
    x = te.placeholder((16,), "X")
    y = te.compute((2, 16), lambda r, c: expr.select(r < 1, x[r * FAR + c], 0.0), "Y")
    naive = naive_program(te.Computation("guard", [y]))
    uniform = retile(naive, "Y", [("Y.r", 2, S, "r", 1), ("Y.c", 16, V, "c", 1)])
    for prog in (naive, uniform):
        out = np.empty((2, 16), np.float32)
        run(prog, data, out)
        np.testing.assert_array_equal(out, [data, np.zeros(16)])


def conv1d_over_its_padding(n: int, taps: int) -> Program:
    """A 1-D convolution reading its input through a zero padding's select, naive."""
    x, w = te.placeholder((n,), "X"), te.placeholder((taps,), "W")
    k = te.reduce_axis(taps, "k")
    y = te.compute((n,), lambda i: te.sum_(
        expr.select(expr.all_of(i + k >= 1, i + k < n + 1), x[i + k - 1], 0.0) * w[k], axis=k), "Y")
    return naive_program(te.Computation("conv1d", [y]))


def test_padded_convolution_matches_numpy():
    n, taps = 32, 3
    naive = conv1d_over_its_padding(n, taps)
    vector = naive.with_body((naive.body[0],) + nest(
        [("Y.k", taps, S), ("Y.i.0", n // 16, S), ("Y.i.1", 16, V)],
        (replace(naive.block("Y.update"), bindings=(
            Binding("i", (("Y.i.0", 16), ("Y.i.1", 1))), Binding("k", (("Y.k", 1),)))),)))
    data, weights = rand(n), rand(taps)
    named = {"X": data, "W": weights}
    expected = np.convolve(np.pad(data, 1), weights[::-1], mode="valid")
    for prog in (naive, vector):
        out = np.empty(n, np.float32)
        run(prog, *(named[buf.name] for buf in prog.inputs), out)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_a_padded_loop_runs_its_border_steps_apart_and_its_inside_untested():
    # conv1d over the padding's select, i serial and the taps unrolled: i runs as step 0, the
    # steps [1, n - 1) and step n - 1, each of which decides every tap's test when it is
    # emitted, so no test (a branch around a load) is left in the code.
    n, taps = 32, 3
    naive = conv1d_over_its_padding(n, taps)
    prog = naive.with_body((naive.body[0],) + nest(
        [("Y.i", n, S), ("Y.k", taps, U)],
        (replace(naive.block("Y.update"), bindings=(
            Binding("i", (("Y.i", 1),)), Binding("k", (("Y.k", 1),)))),)))
    text = str(lower(prog, "", "")[0])
    assert "then" not in text and "select" not in text
    named = {"X": rand(n), "W": rand(taps)}
    out = np.empty(n, np.float32)
    run(prog, *(named[buf.name] for buf in prog.inputs), out)
    expected = np.convolve(np.pad(named["X"], 1), named["W"][::-1], mode="valid")
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


# ---- splits that leave a remainder: full tiles, then a peeled tail -----------------------------


def plus_one(n: int, loops: list[tuple[str, int, LoopKind, str, int]]) -> Program:
    return retile(naive_program(unary(n, lambda v, i: v[i] + 1.0)), "Y", loops)


def assert_matches_reference(prog: Program, seed: int) -> None:
    """The compiled program computes what numpy does on random inputs drawn with `seed`."""
    comp = prog.computation
    inputs = random_inputs(comp, seed=seed)
    ok, _, msg = compare(compile_program(prog).run(inputs), reference(comp, inputs),
                         tolerance(comp))
    assert ok, msg


def full_tile_loop(prog: Program) -> str:
    """The IR of the loop over full tiles, its trip count taken out."""
    text = str(lower(prog, "", "")[0])
    body = text[text.index("Y.i.0:"):text.index("Y.i.0.done:")]
    return re.sub(r"icmp slt i64 (%\S+), \d+", r"icmp slt i64 \1, N", body)


def masked_lanes(text: str, width: int) -> list[int]:
    """How many leading lanes each masked load or store of <width x float> in `text` sets (its
    mask a constant: a tail vector's)."""
    masks = re.findall(rf"llvm\.masked\.(?:load|store)\.v{width}f32[^\n]*<{width} x i1> <([^>]*)>",
                       text)
    return [mask.count("true") for mask in masks]


def test_full_tiles_of_a_remainder_compile_like_an_exact_split():
    # 37 = 2 x 16 + 5: the same loop as 48 = 3 x 16 over two steps, then one <5 x float> step
    # (narrower than a register: its exact width).
    exact = plus_one(48, [("Y.i.0", 3, S, "i", 16), ("Y.i.1", 16, V, "i", 1)])
    tail = plus_one(37, [("Y.i.0", 3, S, "i", 16), ("Y.i.1", 16, V, "i", 1)])
    assert full_tile_loop(tail) == full_tile_loop(exact)
    text = str(lower(tail, "", "")[0])
    assert "<5 x float>" in text and "masked" not in text and "if" not in text
    x, out = rand(37), np.empty(37, np.float32)
    run(tail, x, out)
    np.testing.assert_array_equal(out, x + 1.0)


def test_nested_remainders_peel_down_to_each_piece():
    # 61 = 1 x 48 + 13; the tail's 13 = 1 x 8 + 5 of an unrolled piece of 2 x 8 lanes.
    prog = plus_one(61, [("Y.i.0", 2, S, "i", 48), ("Y.i.1", 3, U, "i", 16),
                         ("Y.i.2", 2, U, "i", 8), ("Y.i.3", 8, V, "i", 1)])
    text = str(lower(prog, "", "")[0])
    assert "<5 x float>" in text and "masked" not in text
    x, out = rand(61), np.empty(61, np.float32)
    run(prog, x, out)
    np.testing.assert_array_equal(out, x + 1.0)


def rows_in_one_vector_step(n: int) -> Program:
    """matmul 3 x n x 5 with each row of C one step of a 64-lane vector, inside k."""
    sch = Schedule(naive_program(matmul(3, n, 5)))
    sch.split("C.j", [-1, 64])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.vectorize("C.j.1")
    return sch.program


def test_a_tail_of_a_register_or_more_runs_in_power_of_two_pieces():
    # conv2d's 56-wide rows in one step of a 64-lane vector: the body once per piece of 32, 16
    # and 8 lanes, each an exact vector (its arithmetic too: a ymm FMA for the last 8 lanes,
    # not a zmm one for 16 of which 8 do not exist); no <56 x float>, no masked access.
    prog = rows_in_one_vector_step(56)
    text = str(lower(prog, "", "", register_lanes=16)[0])
    assert "<56 x float>" not in text and "<64 x float>" not in text and "masked" not in text
    for lanes in (32, 16, 8):
        assert f"load <{lanes} x float>" in text and f"store <{lanes} x float>" in text
        assert f"llvm.fma.v{lanes}f32" in text
    narrow = str(lower(prog, "", "", register_lanes=64)[0])
    assert "<56 x float>" in narrow and "masked" not in narrow  # a narrower tail keeps its width
    assert_matches_reference(prog, seed=1)


def test_a_tail_of_odd_lanes_runs_as_a_masked_power_of_two_vector():
    # 63 lanes would be six pieces, four narrower than a ymm: one <64 x float> instead, its
    # operand loads masked to 63 lanes (three plain zmm loads and one masked to 15 lanes) and
    # its accumulator (C, in memory) loaded and stored in pieces of 32, 16, 8, 4, 2 and 1
    # (exact, so LLVM can keep it in a register).
    prog = rows_in_one_vector_step(63)
    text = str(lower(prog, "", "", register_lanes=16)[0])
    assert "<63 x float>" not in text and "masked.store" not in text
    assert "masked.load.v64f32" not in text
    assert set(masked_lanes(text, 16)) == {15}  # the loads of B
    for lanes in (32, 16, 8, 4, 2):
        assert f"load <{lanes} x float>" in text and f"store <{lanes} x float>" in text
    assert_matches_reference(prog, seed=1)


def test_each_piece_of_a_scattered_tail_stores_the_lanes_from_its_first():
    # gemv's 40-long row factored along a 64-lane vector (rfactor's lanes): its partials
    # C_rf[lane, 0, j] are 24 floats apart, so each piece (32 lanes, then 8 from lane 32)
    # gathers and scatters them; the address's scalar part holds the piece's first lane, the
    # lane offsets count from 0 (counted twice, the pieces wrote past the partials).
    comp = get_workload("gemv").build(24, 40)
    sch = Schedule(naive_program(comp))
    sch.split("C.k", [-1, 64])
    sch.reorder("C.i", "C.j", "C.k.0", "C.k.1")
    sch.rfactor("C.update", "C.k.1")
    sch.vectorize("C.k.1")
    text = str(lower(sch.program, "", "", register_lanes=16)[0])
    assert "scatter.v32f32" in text and "scatter.v8f32" in text
    assert_matches_reference(sch.program, seed=3)


def test_each_piece_of_a_tail_reads_the_lanes_from_its_first():
    # 104 = 64 + 40: the second step's 40 lanes run as pieces of 32 and 8, the second from
    # lane 32 (its loop variable <32, .., 39>: column 96 + lane of each row).
    comp = matmul(2, 104, 3)
    sch = Schedule(naive_program(comp))
    sch.split("C.j", [-1, 64])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.vectorize("C.j.1")
    text = str(lower(sch.program, "", "", register_lanes=16)[0])
    assert "llvm.fma.v32f32" in text and "llvm.fma.v8f32" in text and "masked" not in text
    assert_matches_reference(sch.program, seed=2)


def test_a_padded_pack_copies_whole_panels_then_peels_the_last():
    # 1000 columns in 63 panels of 16: 62 copied whole, one vector each, the last 8 columns
    # peeled; the 32-wide register tile reads the panels with plain vector loads and peels its
    # own 8-lane tail.
    comp = matmul(6, 1000, 5)
    sch = Schedule(naive_program(comp))
    sch.pack("C.update", "B", dim=1, factor=16)
    copy = str(lower(sch.program, "", "", most_copies=1)[0])
    assert re.search(r'add nuw nsw i64 %"B_packed.p0.1", 1\n.*icmp slt i64 %"\.\d+", 62',
                     copy)  # the whole panels' loop
    assert re.search(r'load <16 x float>.*\n.*store <16 x float>', copy)
    assert re.search(r'load <8 x float>.*\n.*store <8 x float>', copy)  # the last panel's run
    sch.split("C.j", [-1, 2, 16])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1", "C.j.2")
    sch.unroll("C.j.1")
    sch.vectorize("C.j.2")
    text = str(lower(sch.program, "", "")[0])
    assert "masked" not in text and "gather" not in text and "<8 x float>" in text
    assert ".if" not in text  # no block guarded at run time: every tail is peeled
    assert_matches_reference(sch.program, seed=4)


def panels_under_a_wide_vector(n: int, factor: int) -> Program:
    """B packed in `factor`-wide panels under a 64-wide vector of j: each register's lanes are
    contiguous in one panel, the 64 lanes are not."""
    sch = Schedule(naive_program(matmul(6, n, 5)))
    sch.pack("C.update", "B", dim=1, factor=factor)
    sch.split("C.j", [-1, 64])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.vectorize("C.j.1")
    return sch.program


def test_a_vector_over_several_packed_panels_loads_each_panels_run():
    text = str(lower(panels_under_a_wide_vector(128, 16), "", "")[0])
    assert "gather" not in text
    # B_packed's four runs, in each of the 3 bodies of the 5-step C.k (2 copies per step, the
    # fifth step peeled), after the pack's own copy.
    update = text[text.index("\nC.i:"):]
    assert len(re.findall(r"load <16 x float>", update)) == 4 * 3
    assert_matches_reference(panels_under_a_wide_vector(128, 16), seed=5)


def register_tile(m: int, n: int, k: int, rows: int) -> Program:
    """C's rows in unrolled groups of `rows` with j a vector, k the innermost serial loop."""
    sch = Schedule(naive_program(matmul(m, n, k)))
    sch.split("C.i", [-1, rows])
    sch.reorder("C.i.0", "C.k", "C.i.1", "C.j")
    sch.unroll("C.i.1")
    sch.vectorize("C.j")
    return sch.program


def test_a_small_innermost_loop_body_runs_in_copies_per_step():
    prog = register_tile(4, 64, 100, rows=4)
    assert body_copies(prog.loop("C.k"), register_lanes=16) == 4  # 4 rows x 4 registers each
    assert body_copies(prog.loop("C.k"), register_lanes=4) == 1  # 64 registers' worth: too big
    assert body_copies(prog.loop("C.i.0"), register_lanes=16) == 1  # C.k inside: not innermost
    assert body_copies(register_tile(4, 64, 5, rows=4).loop("C.k"), 16) == 2  # 5 steps: 2 + 2 + 1
    assert body_copies(register_tile(4, 64, 3, rows=4).loop("C.k"), 16) == 1
    text = str(lower(prog, "", "")[0])
    assert re.search(r'add nuw nsw i64 %"C\.k\.1", 4', text)  # the step advances by the copies
    assert len(re.findall(r"llvm.fma", text)) == 4 * 4 + 1  # 4 copies of the 4 rows' FMAs
    single = str(lower(prog, "", "", most_copies=1)[0])  # CompileOptions(body_copies=1)
    assert len(re.findall(r"llvm.fma", single)) == 4 + 1
    kernel = compile_program(prog, CompileOptions(body_copies=1, threads=1))
    assert kernel is not compile_program(prog, CompileOptions(threads=1))  # a key of the cache
    assert kernel.info["body_copies"] == 1


@pytest.mark.parametrize("k", [100, 7, 11, 2])
def test_loops_run_in_copies_with_a_peeled_remainder_match_the_reference(k):
    # 7 and 11 steps leave 1 and 3 steps past the copies (2 and 4 per step), peeled.
    assert_matches_reference(register_tile(6, 48, k, rows=3), seed=k)


def test_a_masked_vector_over_packed_panels_gathers_its_runs():
    # 127 columns: the last step's 63 active lanes read the padded panels through the mask.
    prog = panels_under_a_wide_vector(127, 16)
    assert "gather" in str(lower(prog, "", "")[0])
    assert_matches_reference(prog, seed=7)


def test_a_tail_over_packed_panels_reads_each_pieces_runs():
    # 120 columns: the last step's 56 lanes run as pieces of 32, 16 and 8 lanes, from lanes 0,
    # 32 and 48: each reads its panels' runs with plain loads (the 8 lanes half a panel).
    prog = panels_under_a_wide_vector(120, 16)
    text = str(lower(prog, "", "")[0])
    assert "gather" not in text and "masked" not in text
    assert_matches_reference(prog, seed=6)


def two_rows_in_registers(comp: te.Computation, lanes: int) -> Schedule:
    """C's rows two at a time in a local tile of `lanes`-wide vector steps, inside k."""
    sch = Schedule(naive_program(comp))
    sch.split("C.j", [-1, lanes])
    sch.split("C.i", [-1, 2])
    sch.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
    sch.fuse("C.init", "C.j.0")
    sch.cache_write("C.update", "C.j.0")
    for loop in ("C.i.1", "C.init.i.1", "C.write.i.1"):
        sch.unroll(loop)
    for loop in ("C.j.1", "C.init.j.1", "C.write.j.1"):
        sch.vectorize(loop)
    return sch


@pytest.mark.parametrize("n", [56, 63])
def test_a_register_tile_over_a_tail_stays_in_registers(n):
    # conv2d's 56-wide rows in one step of a 64-lane tile: a local 2 x 64 accumulator tile over
    # 56 columns, accessed in pieces of 32, 16 and 8 lanes at fixed offsets; over 63, accessed
    # whole (in the tile's bounds; the lanes past the row are never written back) while the
    # output's and inputs' accesses are masked to 63 lanes. Either way it stays in registers.
    comp = matmul(4, n, 9)
    sch = two_rows_in_registers(comp, 64)
    kernel = compile_program(sch.program)
    assert "alloca" not in kernel.llvm_ir()
    masked = set(masked_lanes(str(lower(sch.program, "", "")[0]), 16))
    assert masked == ({15} if n == 63 else set())
    inputs = random_inputs(comp, seed=1)
    ok, _, msg = compare(kernel.run(inputs), reference(comp, inputs), tolerance(comp))
    assert ok, msg


def test_a_vector_of_three_registers_runs_as_power_of_two_pieces():
    # A register tile three vectors across (24 lanes on AVX2's 8): LLVM widens a <24 x float>
    # to a <32 x float> and moves its accumulators through memory lane by lane; as pieces of
    # 16 and 8 lanes from their first lanes the tile stays in registers. 56 columns in steps of
    # 24 also leave a tail of 8 lanes.
    comp = matmul(4, 56, 9)
    sch = two_rows_in_registers(comp, 24)
    text = str(lower(sch.program, "", "", register_lanes=8)[0])
    assert "<24 x float>" not in text and "<32 x float>" not in text
    assert "llvm.fma.v16f32" in text and "llvm.fma.v8f32" in text
    kernel = compile_program(sch.program)
    assert "alloca" not in kernel.llvm_ir()
    inputs = random_inputs(comp, seed=2)
    ok, _, msg = compare(kernel.run(inputs), reference(comp, inputs), tolerance(comp))
    assert ok, msg


def test_a_tail_too_big_to_peel_runs_guarded_instead():
    # 700 = 1 x 512 + 188: the tail of Y.i.0 would copy 32 x 16 unrolled blocks (over
    # PEEL_LIMIT), so it runs them as they are, each guarded (here decided block by block).
    big = plus_one(700, [("Y.i.0", 2, S, "i", 512), ("Y.i.1", 32, U, "i", 16),
                         ("Y.i.2", 16, U, "i", 1)])
    small = plus_one(700, [("Y.i.0", 2, S, "i", 512), ("Y.i.1", 32, S, "i", 16),
                           ("Y.i.2", 16, V, "i", 1)])
    assert 32 * 16 > PEEL_LIMIT >= 32  # the unrolled blocks each tail would copy
    x = rand(700)
    for prog in (big, small):
        out = np.empty(700, np.float32)
        run(prog, x, out)
        np.testing.assert_array_equal(out, x + 1.0)


def test_a_parallel_piece_with_a_remainder_runs_its_tail_in_one_chunk():
    comp = matmul(13, 10, 7)
    sch = Schedule(naive_program(comp))
    sch.split("C.i", [-1, 4])
    sch.fuse("C.init", "C.i.0")
    sch.parallel("C.i.0")
    inputs = random_inputs(comp, seed=1)
    for threads in (1, 2, 3):
        got = compile_program(sch.program, CompileOptions(threads=threads)).run(inputs)
        ok, _, msg = compare(got, reference(comp, inputs), tolerance(comp))
        assert ok, msg


def test_pieces_that_cannot_be_peeled_are_guarded_point_by_point():
    # Illegal (a remainder's inner piece encloses its outer one) but built unchecked, as rule
    # fuzzing does: the backend still runs only the points that exist, by a branch around the
    # block for the rows and a masked store for the lanes.
    comp = matmul(13, 127, 5)
    sch = Schedule(naive_program(comp), checked=False)
    sch.split("C.j", [-1, 2, 16])
    sch.split("C.i", [-1, 4])
    sch.reorder("C.i.1", "C.i.0", "C.j.1", "C.j.0", "C.k", "C.j.2")
    sch.vectorize("C.j.2")
    assert "masked.store" in str(lower(sch.program, "", "")[0])
    assert_matches_reference(sch.program, seed=1)


def test_a_local_tile_allocated_after_straight_line_code_keeps_the_code_in_order():
    # Unrolled loops open no block: the init's stores and then the tile's alloca share the entry
    # block (as peeled tails do).
    comp = matmul(2, 16, 4)
    sch = Schedule(naive_program(comp))
    sch.unroll("C.init.i")
    sch.unroll("C.init.j")
    sch.cache_write("C.update", "C.i")
    sch.unroll("C.i")
    assert_matches_reference(sch.program, seed=1)


# ---- parallel loops -----------------------------------------------------------------------------


def test_parallel_root_loops_give_the_serial_result():
    serial = naive_program(matmul(13, 10, 7))
    parallel = serial.with_body(tuple(replace(lp, kind=P) for lp in serial.body))
    a, b = rand(13, 7), rand(7, 10)
    expected = np.empty((13, 10), np.float32)
    run(serial, a, b, expected)
    for threads in (1, 2, 3):
        out = np.full((13, 10), np.nan, np.float32)
        kernel = compile_program(parallel, CompileOptions(threads=threads))
        kernel(a, b, out)
        np.testing.assert_array_equal(out, expected)
        assert kernel.info["threads"] == threads and kernel.info["segments"] == 2


def test_parallel_kernels_called_from_several_threads_take_turns_with_the_helpers():
    serial = naive_program(matmul(13, 10, 7))
    parallel = serial.with_body(tuple(replace(lp, kind=P) for lp in serial.body))
    kernel = compile_program(parallel, CompileOptions(threads=3))
    inputs = [(rand(13, 7), rand(7, 10)) for _ in range(4)]
    expected = [a @ b for a, b in inputs]

    def many_calls(index: int) -> bool:
        a, b = inputs[index]
        out = np.empty((13, 10), np.float32)
        for _ in range(50):
            out.fill(np.nan)
            kernel(a, b, out)
            if not np.allclose(out, expected[index], rtol=1e-5, atol=1e-5):
                return False
        return True

    with ThreadPoolExecutor(4) as callers:
        assert all(callers.map(many_calls, range(4)))


def test_consecutive_serial_root_nests_share_one_function():
    kernel = compile_program(naive_program(matmul(4, 4, 4)))
    assert kernel.info["segments"] == 1


def test_parallel_loop_below_the_root_is_refused():
    prog = naive_program(matmul(4, 4, 4))
    inner = prog.body[1].body[0]
    bad = prog.with_body((prog.body[0], replace(prog.body[1], body=(replace(inner, kind=P),))))
    with pytest.raises(BackendError, match="parallel loop C.j is not at the root"):
        compile_program(bad)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_a_collapsed_parallel_nest_with_remainders_shares_every_step_once(threads):
    # Rows in 16 steps of 4 (61: the last has one), columns in 10 of 3 (29: the last has two),
    # under a one-step loop: 160 steps counted as one, which three or five threads claim in
    # chunks (of 6, of 4) that cut across rows.
    comp = matmul(61, 29, 7)
    sch = Schedule(naive_program(comp))
    sch.split("C.i", [-1, 1, 4])
    sch.split("C.j", [-1, 3])
    sch.reorder("C.i.0", "C.i.1", "C.j.0", "C.i.2", "C.k", "C.j.1")
    sch.fuse("C.init", "C.j.0")
    for loop in ("C.i.0", "C.i.1", "C.j.0"):
        sch.parallel(loop)
    kernel = compile_program(sch.program, CompileOptions(threads=threads))
    assert kernel.info["segments"] == 1
    assert [seg.parallel_extent for seg in lower(sch.program, "", "")[1]] == [16 * 1 * 10]
    inputs = random_inputs(comp, seed=1)
    ok, _, msg = compare(kernel.run(inputs), reference(comp, inputs), tolerance(comp))
    assert ok, msg


# ---- illegal vectorization ----------------------------------------------------------------------


def test_vectorizing_a_reduce_axis_of_an_accumulation_is_refused():
    prog = naive_program(matmul(4, 4, 16))
    loop_k = prog.loop("C.k")
    bad = prog.with_body((prog.body[0], replace(prog.body[1], body=(replace(
        prog.body[1].body[0], body=(replace(loop_k, kind=V),)),))))
    # the lanes would all accumulate into C[i, j]: the store does not move along C.k
    with pytest.raises(BackendError, match="vectorized loop C.k needs stores to distinct "
                       "elements, but block C.update stores C with stride 0"):
        compile_program(bad)


def test_vectorized_loop_with_strided_store_scatters_its_lanes():
    x = te.placeholder((16, 16), "X")
    y = te.compute((16, 16), lambda i, j: x[i, j], "Y")
    prog = retile(naive_program(te.Computation("copy", [y])), "Y",
                  [("Y.j", 16, S, "j", 1), ("Y.i", 16, V, "i", 1)])
    xs, ys = rand(16, 16), np.full((16, 16), np.nan, np.float32)
    run(prog, xs, ys)
    np.testing.assert_array_equal(ys, xs)
    assert "scatter" in compile_program(prog).llvm_ir()


def test_a_strided_vector_store_unrolled_along_its_rows_is_stored_as_transposed_runs():
    # A channel-vector tile's write-back, Y[k, p, q] = X[p, q, k] with q unrolled 8 and k
    # vectorized 16: 8 x 8 transposes of the 8 vectors and 16 runs of 8 columns, no scatter.
    # 12 columns (not a power of two) keep the scatter.
    x = te.placeholder((6, 16, 32), "X")
    y = te.compute((32, 6, 16), lambda k, p, q: x[p, q, k] * 2.0, "Y")
    comp = te.Computation("relayout", [y])
    for cols, scatters in ((8, False), (12, True)):
        sch = Schedule(naive_program(comp))
        k = sch.split("Y.k", [-1, 16])
        q = sch.split("Y.q", [-1, cols])
        sch.reorder(k[0], "Y.p", q[0], q[1], k[1])
        sch.unroll(q[1])
        sch.vectorize(k[1])
        text = str(lower(sch.program, "", "", register_lanes=16)[0])
        assert ("scatter" in text) == scatters
        assert ("store <8 x float>" in text) != scatters
        assert_matches_reference(sch.program, seed=4)


def test_strided_vector_accumulation_gathers_then_scatters():
    # C[i, j] += ... vectorized over i (stride 6 in C): each lane updates its own row.
    prog = retile(naive_program(matmul(16, 6, 5)), "C.update",
                  [("C.j", 6, S, "j", 1), ("C.k", 5, S, "k", 1), ("C.i", 16, V, "i", 1)])
    prog = prog.with_body(naive_program(matmul(16, 6, 5)).body[:1] + prog.body)
    a, b, c = rand(16, 5), rand(5, 6), np.full((16, 6), np.nan, np.float32)
    run(prog, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_vectorized_loop_whose_lanes_store_one_element_is_refused():
    prog = naive_program(unary(16, lambda x, i: expr.exp(x[i])))
    (blk,) = prog.blocks()
    bad = prog.with_body(nest([("Y.i", 16, S), ("Y.v", 8, V)], (blk,)))  # Y.v binds no axis
    with pytest.raises(BackendError, match="vectorized loop Y.v needs stores to distinct "
                                           "elements.*Y with stride 0"):
        compile_program(bad)


# ---- the kernel's calling convention ------------------------------------------------------------


@pytest.fixture(scope="module")
def small_matmul():
    return compile_program(naive_program(matmul(4, 3, 2)))


@pytest.mark.parametrize("arrays, message", [
    (lambda: (rand(4, 2), rand(2, 3)), "takes 3 arrays"),
    (lambda: (rand(4, 2).astype(np.float64), rand(2, 3), rand(4, 3)), "A must be float32"),
    (lambda: (rand(4, 2), rand(3, 2), rand(4, 3)), r"B must have shape \(2, 3\)"),
    (lambda: (rand(2, 4).T, rand(2, 3), rand(4, 3)), "A must be C-contiguous"),
    (lambda: (rand(4, 2), rand(2, 3), [[0.0] * 3] * 4), "C must be a numpy array"),
])
def test_bad_arrays_are_refused(small_matmul, arrays, message):
    with pytest.raises(BackendError, match=message):
        small_matmul(*arrays())


def test_output_overlapping_an_input_or_read_only_is_refused(small_matmul):
    out = rand(4, 3)
    with pytest.raises(BackendError, match="output C overlaps A"):
        small_matmul(out.reshape(-1)[:8].reshape(4, 2), rand(2, 3), out)
    out = np.empty((4, 3), np.float32)
    out.flags.writeable = False
    with pytest.raises(BackendError, match="output C is read-only"):
        small_matmul(rand(4, 2), rand(2, 3), out)


def test_compile_cache_returns_the_same_kernel_per_program_and_options():
    prog = naive_program(matmul(3, 3, 3))
    first = compile_program(prog)
    assert compile_program(naive_program(matmul(3, 3, 3))) is first
    assert compile_program(prog, CompileOptions(opt_level=1)) is not first


def test_info_records_compiler_cpu_and_pass_settings():
    options = CompileOptions(loop_vectorize=True, threads=1)
    info = compile_program(naive_program(matmul(3, 5, 2)), options).info
    assert info["cpu_name"] and info["cpu_features"]
    assert info["llvm_version"].count(".") == 2 and info["llvmlite_version"]
    assert (info["opt_level"], info["loop_vectorize"], info["slp_vectorize"]) == (3, True, False)
    assert info["threads"] == 1 and info["triple"]


def test_options_are_checked():
    with pytest.raises(BackendError, match="opt_level"):
        CompileOptions(opt_level=4)
    with pytest.raises(BackendError, match="threads"):
        CompileOptions(threads=0)
    with pytest.raises(BackendError, match="body_copies"):
        CompileOptions(body_copies=0)


def test_run_takes_named_inputs_and_starts_outputs_as_nan():
    a = te.placeholder((4, 8), "A")
    half = te.compute((2, 8), lambda i, j: a[i, j] * 2.0, "H")  # writes only the first 2 rows
    prog = naive_program(te.Computation("half", [half]))
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = compile_program(prog).run({"A": x})
    assert list(out) == ["H"] and out["H"].ctypes.data % 64 == 0
    np.testing.assert_array_equal(out["H"], x[:2] * 2)
    partial = replace(prog, buffers=tuple(
        replace(b, shape=(3, 8)) if b.name == "H" else b for b in prog.buffers))
    assert np.isnan(compile_program(partial).run({"A": x})["H"][2]).all()


def test_run_starts_intermediates_as_nan_on_every_call():
    # Without its init, T accumulates into whatever T held: NaN on every run, never a stale
    # or zeroed buffer that would make the sum come out right.
    x = te.placeholder((8, 4), "X")
    k = te.reduce_axis(4, "k")
    t = te.compute((8,), lambda i: te.sum_(x[i, k], axis=k), "T")
    y = te.compute((8,), lambda i: t[i] * 2.0, "Y")
    prog = naive_program(te.Computation("twice_row_sums", [y]))
    assert prog.buffer("T").scope == Scope.GLOBAL
    kernel = compile_program(prog)
    inputs = {"X": np.ones((8, 4), np.float32)}
    np.testing.assert_array_equal(kernel.run(inputs)["Y"], np.full(8, 8.0))
    no_init = prog.with_body(tuple(n for n in prog.body if n.name != "T.init.i"))
    assert len(no_init.body) == len(prog.body) - 1
    broken = compile_program(no_init)
    for _ in range(2):  # the second run starts from NaN again, not from the first run's T
        assert np.isnan(broken.run(inputs)["Y"]).all()


def test_aligned_copy_starts_on_a_cache_line_whatever_the_original_offset():
    raw = np.arange(64 * 3 + 16, dtype=np.float32)
    for skip in range(16):  # every 4-byte offset from a 64-byte boundary
        original = raw[skip:skip + 64 * 3].reshape(3, 64)
        copy = aligned_copy(original)
        assert copy.ctypes.data % 64 == 0 and copy.dtype == np.float32
        assert copy.flags.c_contiguous and np.array_equal(copy, original)
        assert not np.may_share_memory(copy, original)


@pytest.mark.parametrize("spec", ["host,-avx512f", "haswell"])
def test_an_avx2_target_runs_the_same_program_with_ymm_fmas_only(spec):
    options = CompileOptions(target=Target.parse(spec))
    kernel = compile_program(packed_matmul(8, 64, 9, rows=4), options)
    a, b, c = rand(8, 9), rand(9, 64), np.empty((8, 64), np.float32)
    kernel(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    assert re.search(r"vfmadd\w*ps\s+[^\n]*ymm", kernel.asm())
    assert "zmm" not in kernel.asm()
    assert kernel.info["target"] == spec and kernel.info["vector_bits"] == 256



@pytest.mark.parametrize("spec", ["host,-avx512f", "haswell"])
def test_a_masked_vector_wider_than_a_register_reads_none_of_its_masked_lanes(spec):
    # conv2d's padding along a row of 9 as one 16-lane vector (9 lanes active, the border lanes
    # masked off): LLVM 22 lowered a <16 x float> masked load for AVX2 by loading lane 8 whole,
    # and the border took the next row's first element. One masked access per register reads
    # only the mask's lanes.
    x = te.placeholder((2, 7, 7), "x")
    padded = te.compute((2, 9, 9), lambda c, h, w: expr.select(
        expr.all_of(h >= 1, h < 8, w >= 1, w < 8), x[c, h - 1, w - 1], 0.0), "padded")
    sch = Schedule(naive_program(te.Computation("pad", [padded], flops=1)))
    sch.split("padded.w", [-1, 16])
    sch.vectorize("padded.w.1")
    kernel = compile_program(sch.program, CompileOptions(target=Target.parse(spec)))
    values = np.arange(1, 99, dtype=np.float32).reshape(2, 7, 7)
    got = kernel.run({"x": values})["padded"]
    np.testing.assert_array_equal(got, np.pad(values, ((0, 0), (1, 1), (1, 1))))

def test_targets_say_their_vector_registers():
    haswell = Target.parse("haswell")
    assert (haswell.vector_bits, haswell.vector_registers, haswell.has_fma) == (256, 16, True)
    assert Target.parse("HOST, -avx512f") == Target.parse("host,-avx512f")
    assert Target.parse("host,-avx512f").key != Target.host().key


@pytest.mark.parametrize("spec, message", [
    ("nosuchcpu", "LLVM knows no x86 CPU of that name"),
    ("host,avx2", "is not a feature change"),
    ("host,-nosuchfeature", "not an x86 feature LLVM knows"),
    ("-avx2", "start with a CPU name"),
])
def test_a_target_llvm_does_not_know_is_refused_in_one_line(spec, message):
    with pytest.raises(TargetError, match=message) as err:
        Target.parse(spec)
    assert "\n" not in str(err.value)


def test_a_target_this_cpu_cannot_run_is_refused_before_compiling(monkeypatch):
    from eqsched.backend import target as target_module
    no_avx512 = {**target_module._host_feature_map(), "avx512f": False}
    monkeypatch.setattr(target_module, "_host_feature_map", lambda: no_avx512)
    with pytest.raises(TargetError, match="needs avx512f, which this CPU"):
        compile_program(packed_matmul(8, 64, 9, rows=4),
                        CompileOptions(target=Target.parse("skylake-avx512")))


def test_a_prepared_kernel_packs_its_constant_once_and_each_binding_keeps_its_own_pack():
    prog = packed_matmul(8, 64, 9, rows=4)
    prog = replace(prog, computation=prog.computation.with_constants(["B"]))
    assert prog.prepared_buffers == {"B_packed"}
    kernel = compile_program(prog)
    a, b1, b2 = rand(8, 9), rand(9, 64), rand(9, 64)
    c1, c2 = np.empty((8, 64), np.float32), np.empty((8, 64), np.float32)
    first, second = kernel.prepared(a, b1, c1), kernel.prepared(a, b2, c2)  # two layers' weights
    first(), second()
    np.testing.assert_allclose(c1, a @ b1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c2, a @ b2, rtol=1e-5, atol=1e-5)
    packed_then, b1[...] = b1.copy(), 0.0
    first()  # its calls use the pack made when it was bound
    np.testing.assert_allclose(c1, a @ packed_then, rtol=1e-5, atol=1e-5)
    kernel(a, b1, c1)  # a plain call packs on each call
    assert not c1.any()


def test_a_prepared_call_keeps_the_arrays_it_has_the_addresses_of():
    prog = packed_matmul(8, 64, 9, rows=4)
    kernel = compile_program(replace(prog, computation=prog.computation.with_constants(["B"])))
    a, b, c = rand(8, 9), rand(9, 64), np.empty((8, 64), np.float32)
    expected, out = a @ b, weakref.ref(c)
    call = kernel.prepared(a, b, c)
    del a, b, c
    gc.collect()
    assert out() is not None  # freed, a call would write into memory no longer its own
    call()
    np.testing.assert_allclose(out(), expected, rtol=1e-5, atol=1e-5)
