"""A chain runs kernels bound once to their arrays, in order, by one native call (a parallel
loop's team called inside it), and gives what calling each kernel gives."""

from dataclasses import replace

import numpy as np
import pytest

from eqsched import te
from eqsched.backend import BackendError, CompileOptions, aligned_empty, compile_program
from eqsched.backend.chain import Chain
from eqsched.expr import relu as relu_of
from eqsched.ir import LoopKind, naive_program

rng = np.random.default_rng(0)


def matmul(m: int, n: int, k: int) -> te.Computation:
    a, b = te.placeholder((m, k), "A"), te.placeholder((k, n), "B")
    r = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum_(a[i, r] * b[r, j], axis=r), "C")
    return te.Computation("matmul", [c])


def relu(m: int, n: int) -> te.Computation:
    x = te.placeholder((m, n), "X")
    return te.Computation("relu", [te.compute((m, n), lambda i, j: relu_of(x[i, j]), "Y")])


def parallel(comp: te.Computation):
    """The naive program with every root loop parallel (a matmul: two, its init and its
    update)."""
    prog = naive_program(comp)
    return prog.with_body(tuple(replace(lp, kind=LoopKind.PARALLEL) for lp in prog.body))


def arrays(*shapes):
    out = [aligned_empty(s) for s in shapes]
    for a in out:
        a.fill(np.nan)
    return out


def test_two_kernels_run_in_order_by_one_native_call_on_fresh_input_contents():
    options = CompileOptions(threads=1)
    first = compile_program(naive_program(matmul(5, 6, 7)), options)
    second = compile_program(naive_program(relu(5, 6)), options)
    a, b, c, y = arrays((5, 7), (7, 6), (5, 6), (5, 6))
    chain = Chain([(first, (a, b, c)), (second, (c, y))])
    assert chain.native_calls == 1
    for _ in range(3):  # the bound arrays are read anew on every run
        a[...], b[...] = rng.standard_normal((5, 7)), rng.standard_normal((7, 6))
        chain()
        np.testing.assert_allclose(y, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_a_parallel_loop_on_one_thread_is_called_inside_the_one_native_call():
    kernel = compile_program(parallel(matmul(13, 10, 7)), CompileOptions(threads=1))
    a, b, c = arrays((13, 7), (7, 10), (13, 10))
    a[...], b[...] = rng.standard_normal((13, 7)), rng.standard_normal((7, 10))
    chain = Chain([(kernel, (a, b, c))])
    chain()
    assert chain.native_calls == 1
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_parallel_loop_shared_among_threads_runs_inside_the_one_native_call():
    options = CompileOptions(threads=2)
    split = compile_program(parallel(matmul(13, 10, 7)), options)  # two shared loops
    serial = compile_program(naive_program(relu(13, 10)), options)
    a, b, c, y, z = arrays((13, 7), (7, 10), (13, 10), (13, 10), (13, 10))
    chain = Chain([(split, (a, b, c)), (serial, (c, y)), (serial, (y, z))])
    assert chain.native_calls == 1
    for _ in range(3):
        a[...], b[...] = rng.standard_normal((13, 7)), rng.standard_normal((7, 10))
        chain()
        np.testing.assert_allclose(z, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_arrays_are_checked_once_when_bound():
    kernel = compile_program(naive_program(relu(2, 3)), CompileOptions(threads=1))
    x, y = arrays((2, 3), (3, 2))
    with pytest.raises(BackendError, match=r"Y must have shape \(2, 3\), got \(3, 2\)"):
        Chain([(kernel, (x, y))])
    with pytest.raises(BackendError, match="output Y overlaps X"):
        Chain([(kernel, (x, x))])


def test_an_empty_chain_runs_nothing():
    chain = Chain([])
    chain()
    assert chain.native_calls == 0


def test_per_call_arrays_take_the_bound_ones_place_on_each_run():
    for threads in (1, 2):  # a shared loop's packed pointers are replaced too
        options = CompileOptions(threads=threads)
        first = compile_program(parallel(matmul(13, 10, 7)), options)
        second = compile_program(naive_program(relu(13, 10)), options)
        a, b, c, y = arrays((13, 7), (7, 10), (13, 10), (13, 10))
        chain = Chain([(first, (a, b, c)), (second, (c, y))], per_call=[a, y])
        b[...] = rng.standard_normal((7, 10))
        for _ in range(3):
            given, out = rng.standard_normal((13, 7)).astype(np.float32), arrays((13, 10))[0]
            chain(given, out)
            np.testing.assert_allclose(out, np.maximum(given @ b, 0), rtol=1e-5, atol=1e-5)
            assert np.isnan(a).all() and np.isnan(y).all()  # the bound ones: untouched


def test_a_run_s_arrays_are_checked_in_one_line():
    kernel = compile_program(naive_program(relu(2, 3)), CompileOptions(threads=1))
    x, y = arrays((2, 3), (2, 3))
    chain = Chain([(kernel, (x, y))], per_call=[x, y])
    with pytest.raises(BackendError, match="takes 2 arrays, got 1"):
        chain(x)
    with pytest.raises(BackendError, match=r"array 1 of the run must have shape \(2, 3\)"):
        chain(x, np.zeros((3, 2), np.float32))
    with pytest.raises(BackendError, match="array 0 of the run must be C-contiguous float32"):
        chain(np.zeros((2, 3)), y)
    frozen = np.zeros((2, 3), np.float32)
    frozen.flags.writeable = False
    chain(frozen, y)  # read only: fine where it is only read
    with pytest.raises(BackendError, match="array 1 of the run is written and is read-only"):
        chain(x, frozen)
    with pytest.raises(BackendError, match="array 1 of the run is written and overlaps another"):
        chain(x, x)
    with pytest.raises(BackendError, match="X is bound to part of per-call array 0"):
        whole = arrays((4, 3))[0]
        Chain([(kernel, (whole[:2], y))], per_call=[whole])
