"""A cost model of your own: one class, one method, registered under a name and used by
`explore` like the built-in ones.

    python examples/custom_cost_model.py            # matmul 256^3, 24 trials per model, ~1 min
    python examples/custom_cost_model.py --small    # tiny, seconds

The model here is deliberately simple: it counts the loop iterations that are not vectorized,
weighted by how far each block's innermost loop strides through memory. The script explores
with it and with the built-in `analytic` model on the same budget and prints how well each
ranked what was measured (Spearman per round) and the best GFLOPS it led to.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from eqsched.explore import Settings, explore
from eqsched.extract import CostModel, register
from eqsched.ir import LoopKind, Program
from eqsched.workloads import get_workload


@register
class ScalarWork(CostModel):
    """Predicted seconds ~ scalar iterations (vector loops count once), x2 per unvectorized
    innermost loop: a coarse stand-in for the analytic model's port model."""

    name = "scalar-work"

    def predict(self, programs: list[Program]) -> np.ndarray:
        return np.array([self._work(p) for p in programs], dtype=float) * 1e-9

    @staticmethod
    def _work(prog: Program) -> float:
        total = 0.0
        for blk in prog.blocks():
            loops = prog.enclosing(blk.name)
            n = float(np.prod([1 if lp.kind == LoopKind.VECTOR else lp.extent
                               for lp in loops]))
            vector_inside = loops and loops[-1].kind == LoopKind.VECTOR
            total += n * (1 if vector_inside else 2)
        return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny size and budget")
    parser.add_argument("--out", help="directory for the results databases (default: temp)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eqsched-model-"))
    out.mkdir(parents=True, exist_ok=True)
    size = get_workload("matmul").small_size if args.small else (256, 256, 256)
    settings = Settings(repeats=3 if args.small else 5, threads=1)
    search = {"population": 16} if args.small else {}  # a small run's small search

    for model in ("scalar-work", "analytic"):  # a registered name, or pass ScalarWork() itself
        # A database per model, so that neither run reuses the other's measurements.
        result = explore("matmul", size, trials=8 if args.small else 24, batch=4 if args.small
                         else 8, db=out / f"{model}.db", cost_model=model, settings=settings,
                         **search)
        rhos = " ".join("n/a" if r.spearman is None else f"{r.spearman:+.2f}"
                        for r in result.rounds)
        print(f"{model:>12}: best {result.best.gflops:7.2f} GFLOPS; Spearman per round: {rhos}")


if __name__ == "__main__":
    main()
