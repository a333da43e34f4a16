"""Loop-program IR: naive lowering, structural names, printing, hashing."""

import numpy as np
import pytest

from eqsched.backend import CompileOptions, compile_program
from eqsched.expr import exp
from eqsched.interp import run_program
from eqsched.ir import Binding, Block, Loop, LoopKind, Scope, embedded, naive_program, walk
from eqsched.schedule import Schedule
from eqsched.te import Computation, WorkloadError, compute, placeholder, reduce_axis, sum_


def mm_exp(m=4, n=8, k=16):
    A = placeholder((m, k), "A")
    B = placeholder((k, n), "B")
    r = reduce_axis(k, "k")
    C = compute((m, n), lambda i, j: sum_(A[i, r] * B[r, j], axis=r), "C")
    D = compute((m, n), lambda i, j: exp(C[i, j]), "D")
    return Computation("mm_exp", [D])


GOLDEN = """\
program mm_exp
  input  A: float32[4, 16]
  input  B: float32[16, 8]
  global C: float32[4, 8]
  output D: float32[4, 8]
for C.init.i in range(4):
  for C.init.j in range(8):
    C.init(i = C.init.i, j = C.init.j):
      C[i, j] = 0.0
for C.i in range(4):
  for C.j in range(8):
    for C.k in range(16):
      C.update(i = C.i, j = C.j, k = C.k):
        C[i, j] += A[i, k] * B[k, j]
for D.i in range(4):
  for D.j in range(8):
    D(i = D.i, j = D.j):
      D[i, j] = exp(C[i, j])
"""


def test_naive_program_prints_as_golden_text():
    assert naive_program(mm_exp()).text() == GOLDEN


def test_buffers_and_params_order():
    p = naive_program(mm_exp())
    assert [(b.name, b.scope) for b in p.buffers] == [
        ("A", Scope.INPUT), ("B", Scope.INPUT), ("C", Scope.GLOBAL), ("D", Scope.OUTPUT)]
    assert [b.name for b in p.params] == ["A", "B", "D", "C"]


def test_queries_by_structural_name():
    p = naive_program(mm_exp())
    assert [lp.name for lp in p.enclosing("C.update")] == ["C.i", "C.j", "C.k"]
    assert p.loop("C.k").extent == 16
    assert p.block("C.update").axis_of_loop("C.k") == "k"
    assert [b.name for b in p.blocks()] == ["C.init", "C.update", "D"]


def test_hash_is_stable_and_content_based():
    a, b = naive_program(mm_exp()), naive_program(mm_exp())
    assert a.hash() == b.hash()
    assert a.hash() != naive_program(mm_exp(m=8)).hash()


def test_binding_expr_rebuilds_a_mixed_radix_axis():
    b = Binding("i", (("C.i.0", 8), ("C.i.1", 1)))
    assert str(b.expr()) == "C.i.0 * 8 + C.i.1"


def test_walk_reports_enclosing_loops():
    p = naive_program(mm_exp())
    paths = {n.name: [x.name for x in path] for n, path in walk(p.body) if isinstance(n, Block)}
    assert paths["D"] == ["D.i", "D.j"]
    loop = p.body[0]
    assert isinstance(loop, Loop) and loop.kind == LoopKind.SERIAL and loop.lanes == 1


def weighted_matmul(constants=("B",), m=4, n=32, k=8):
    """C = A @ B with B declared constant (a model's weight)."""
    A = placeholder((m, k), "A")
    B = placeholder((k, n), "B")
    r = reduce_axis(k, "k")
    C = compute((m, n), lambda i, j: sum_(A[i, r] * B[r, j], axis=r), "C")
    return Computation("mm", [C], constants=constants)


def test_a_pack_of_a_constant_input_is_the_program_s_preparation():
    s = Schedule(naive_program(weighted_matmul()))
    packed = s.pack("C.update", "B", 1, 16)
    prog = s.program
    (k,) = prog.preparation
    assert {b.buffer for b, _ in walk((prog.body[k],)) if isinstance(b, Block)} == {packed}
    assert prog.prepared_buffers == {packed}
    assert [b.name for b in prog.per_call.blocks()] == ["C.init", "C.update"]
    assert prog.per_call.per_call is prog.per_call
    # The word "const" names it, so a weight's programs are not those of a varying input.
    assert "  const  B: float32[8, 32]" in prog.text()
    assert naive_program(weighted_matmul()).hash() != naive_program(weighted_matmul(())).hash()


def test_only_nests_that_read_constants_alone_and_own_their_buffer_are_preparation():
    s = Schedule(naive_program(weighted_matmul()))
    s.pack("C.update", "A", 1, 4)  # A is no constant
    assert s.program.preparation == ()
    s = Schedule(naive_program(weighted_matmul(())))
    s.pack("C.update", "B", 1, 16)
    assert s.program.preparation == () and s.program.per_call is s.program
    # A reduction of a weight alone (its init and update nests, into an intermediate) is
    # preparation; the output, and what reads a varying input, are not.
    A = placeholder((4, 8), "A")
    W = placeholder((8, 8), "W")
    r = reduce_axis(8, "r")
    colsum = compute((8,), lambda j: sum_(W[r, j], axis=r), "colsum")
    out = compute((4, 8), lambda i, j: A[i, j] * colsum[j], "out")
    prog = naive_program(Computation("scaled", [out], constants=["W"]))
    assert [prog.body[k].name for k in prog.preparation] == ["colsum.init.j", "colsum.j"]
    assert prog.prepared_buffers == {"colsum"}


def test_a_constant_must_be_an_input():
    with pytest.raises(WorkloadError, match="constant 'C' is not an input of mm"):
        weighted_matmul(("C",))


def _scheduled_mm_exp():
    """mm_exp with its nests split and vectorized, so moved indices meet split bindings."""
    s = Schedule(naive_program(mm_exp()))
    s.split("C.j", [2, 4])
    s.reorder("C.k", "C.j.1")
    s.vectorize("C.j.1")
    s.split("D.j", [2, 4])
    s.vectorize("D.j.1")
    return s.program


@pytest.mark.parametrize("buffer", ["D", "C"])  # an output, and an intermediate read again
def test_an_embedded_buffer_is_written_and_read_inside_its_border_only(buffer):
    prog = _scheduled_mm_exp()
    border = ((1, 2), (3, 0))
    moved = embedded(prog, buffer, border)
    assert moved.buffer(buffer).shape == (4 + 3, 8 + 3)
    rng = np.random.default_rng(0)
    inputs = {"A": rng.standard_normal((4, 16)), "B": rng.standard_normal((16, 8))}
    want = run_program(prog, inputs)["D"]
    if buffer == "D":
        got = run_program(moved, inputs)["D"]  # the interpreter starts it as NaN
        np.testing.assert_allclose(got[1:5, 3:], want, rtol=1e-12)
        inside = np.zeros(got.shape, bool)
        inside[1:5, 3:] = True
        assert np.isnan(got[~inside]).all()  # never written
        out = np.full(got.shape, -7.0, np.float32)  # the compiled kernel, into a caller's buffer
        kernel = compile_program(moved, CompileOptions(threads=1))
        kernel(*(inputs[k].astype(np.float32) for k in ("A", "B")), out)
        np.testing.assert_allclose(out[1:5, 3:], want, rtol=1e-5)
        assert (out[~inside] == -7.0).all()
    else:
        np.testing.assert_allclose(run_program(moved, inputs)["D"], want, rtol=1e-12)


def test_a_border_names_every_dimension_of_its_buffer():
    with pytest.raises(ValueError, match="one non-negative"):
        embedded(_scheduled_mm_exp(), "D", ((1, 1),))
    with pytest.raises(ValueError, match="one non-negative"):
        embedded(_scheduled_mm_exp(), "D", ((1, 1), (-1, 0)))
