r"""Backend speed probe: a hand-built packed, register-tiled matmul against numpy sgemm (one core).

    cd /work/main && env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=. \
        /tmp/venv/bin/python bench/backend_probe.py 512 1024

The program is the structure the schedule layer produces for `pack` + `cache_write` + tiling: B is
copied into 32-wide column panels, each R x 32 tile of C accumulates in a local buffer (R rows of
two 16-lane vectors) over the whole k range, then is written out.
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy is imported: compare one core to one core

import argparse
import statistics
import time

import numpy as np

from eqsched import te
from eqsched.backend import CompileOptions, compile_program
from eqsched.expr import Const, Load, Var
from eqsched.ir import Alloc, Binding, Block, Buffer, Loop, LoopKind, Program, Scope
from eqsched.workloads import get_workload

S, U, V = LoopKind.SERIAL, LoopKind.UNROLL, LoopKind.VECTOR
PANEL = 32  # columns of B per packed panel = columns of C per register tile (two 16-lane zmm)


def matmul(m: int, n: int, k: int) -> te.Computation:
    a = te.placeholder((m, k), "A")
    b = te.placeholder((k, n), "B")
    r = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum_(a[i, r] * b[r, j], axis=r), "C")
    return te.Computation("matmul", [c])


def packed_matmul(m: int, n: int, k: int, rows: int, outer: LoopKind = S) -> Program:
    """`outer` is the kind of the two root loops (pack panels, column panels of C)."""
    comp = matmul(m, n, k)
    i, j, kk = Var("i"), Var("j"), Var("k")
    p0, p1, p2 = Var("p0"), Var("p1"), Var("p2")
    spatial = te.Axis
    pack = Block("B_packed", "B_packed",
                 (spatial("p0", n // PANEL), spatial("p1", k), spatial("p2", PANEL)),
                 (Binding("p0", (("B_packed.p0", 1),)), Binding("p1", (("B_packed.p1", 1),)),
                  Binding("p2", (("B_packed.p2", 1),))),
                 "B_packed", (p0, p1, p2), Load("B", (p1, p0 * PANEL + p2)))
    pack_nest = Loop("B_packed.p0", n // PANEL, outer, (
        Loop("B_packed.p1", k, S, (Loop("B_packed.p2", PANEL, V, (pack,)),)),))

    local = (i % rows, (j // 16) % 2, j % 16)

    def ij(prefix: str) -> tuple[Binding, Binding]:
        return (Binding("i", (("C.i.0", rows), (f"{prefix}.i.1", 1))),
                Binding("j", (("C.j.0", PANEL), (f"{prefix}.j.1", 16), (f"{prefix}.j.2", 1))))

    def tile(prefix: str, inner: Block) -> Loop:
        return Loop(f"{prefix}.i.1", rows, U, (
            Loop(f"{prefix}.j.1", 2, U, (Loop(f"{prefix}.j.2", 16, V, (inner,)),)),))

    ax_i, ax_j, ax_k = spatial("i", m), spatial("j", n), spatial("k", k, "reduce")
    init = Block("C.init", "C", (ax_i, ax_j), ij("C.init"), "C.local", local, Const(0.0))
    update = Block("C.update", "C", (ax_i, ax_j, ax_k),
                   ij("C") + (Binding("k", (("C.k", 1),)),), "C.local", local,
                   Load("A", (i, kk)) * Load("B_packed", (j // PANEL, kk, j % PANEL)), "sum")
    write = Block("C.write", "C", (ax_i, ax_j), ij("C.write"), "C", (i, j),
                  Load("C.local", local))
    nest = Loop("C.j.0", n // PANEL, outer, (Loop("C.i.0", m // rows, S, (Alloc("C.local", (
        tile("C.init", init),
        Loop("C.k", k, S, (tile("C", update),)),
        tile("C.write", write),
    )),)),))
    buffers = (Buffer("A", (m, k), Scope.INPUT), Buffer("B", (k, n), Scope.INPUT),
               Buffer("C", (m, n), Scope.OUTPUT),
               Buffer("B_packed", (n // PANEL, k, PANEL), Scope.GLOBAL),
               Buffer("C.local", (rows, 2, 16), Scope.LOCAL))
    return Program("matmul", buffers, (pack_nest, nest), comp)


def median_seconds(fn, args: tuple, repeats: int) -> float:
    fn(*args)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[512, 1024])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1,
                        help="> 1: run the root loops in parallel (numpy stays on one core)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for size in args.sizes:
        outer = LoopKind.PARALLEL if args.threads > 1 else S
        prog = packed_matmul(size, size, size, args.rows, outer)
        kernel = compile_program(prog, CompileOptions(threads=args.threads))
        a = rng.standard_normal((size, size), dtype=np.float32)
        b = rng.standard_normal((size, size), dtype=np.float32)
        c = np.empty((size, size), np.float32)
        kernel(a, b, c)
        err = np.abs(c - a @ b).max()
        flop = 2.0 * size**3
        ours = median_seconds(kernel, (a, b, c), args.repeats)
        numpy_run = get_workload("matmul").numpy_baseline({"A": a, "B": b}, size, size, size)
        ref = median_seconds(numpy_run, (), args.repeats)
        print(f"{size}^3 rows={args.rows} threads={args.threads}: "
              f"eqsched {flop / ours / 1e9:6.1f} GFLOPS  numpy {flop / ref / 1e9:6.1f} GFLOPS  "
              f"ratio {ref / ours:.2f}  "
              f"max|err| {err:.2e}  compile {kernel.info['compile_seconds']} s")


if __name__ == "__main__":
    main()
