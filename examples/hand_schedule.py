"""Write a matmul schedule by hand with the manual API and save it as a replayable trace.

    python examples/hand_schedule.py 512 examples/schedules/matmul-512.json
    eqsched run matmul --size 512,512,512 --schedule examples/schedules/matmul-512.json

The schedule is the classic CPU matmul recipe (docs/ARCHITECTURE.md §17.1, packing): B copied
into 32-wide column panels, an 8x32 register tile (8 rows x two 16-lane vectors) accumulated in a
local buffer over the whole k loop, the init fused into the tile, every tile loop unrolled or
vectorized.
"""

from __future__ import annotations

import sys

from eqsched.ir import naive_program
from eqsched.schedule import Schedule, save_trace
from eqsched.workloads import get_workload


def packed_register_tile(sch: Schedule, rows: int = 8) -> None:
    sch.pack("C.update", "B", dim=1, factor=32)  # B[k, j] -> B_packed[j // 32, k, j % 32]
    sch.split("C.i", [-1, rows])
    sch.split("C.j", [-1, 2, 16])
    sch.reorder("C.j.0", "C.i.0", "C.k", "C.i.1", "C.j.1", "C.j.2")
    sch.fuse("C.init", at="C.i.0")  # zero the tile right where it is accumulated
    sch.cache_write("C.update", at="C.i.0")  # C.local: the tile lives in registers
    for tile_loop in ("C.i.1", "C.j.1", "C.init.i.1", "C.init.j.1", "C.write.i.1", "C.write.j.1"):
        sch.unroll(tile_loop)  # constant tile indices: what lets LLVM keep C.local in registers
    for lanes in ("C.j.2", "C.init.j.2", "C.write.j.2"):
        sch.vectorize(lanes)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    sch = Schedule(naive_program(get_workload("matmul").build(n, n, n)))
    packed_register_tile(sch)
    print(sch.program.text())
    if len(sys.argv) > 2:
        save_trace(sys.argv[2], sch.trace, workload="matmul", size=[n, n, n])
        print(f"saved {len(sch.trace)} steps to {sys.argv[2]}")


if __name__ == "__main__":
    main()
