"""Space experiment: how two rule sets' spaces relate, what a random program of one is worth, and
how well cost models rank its programs.

    python examples/space_experiment.py            # matmul 256^3, 32 measured programs, ~20 s
    python examples/space_experiment.py --small    # a tiny matmul, seconds

The same three experiments exist on the command line: `eqsched experiment compare|distribution|
ranking` (see `eqsched experiment --help`).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from eqsched.explore import Settings
from eqsched.tools.compare import compare_spaces
from eqsched.tools.distribution import measure_distribution
from eqsched.tools.ranking import rank_quality
from eqsched.workloads import get_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes and budgets")
    parser.add_argument("--out", help="directory for the results database (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eqsched-space-"))
    out.mkdir(parents=True, exist_ok=True)
    size = get_workload("matmul").small_size if args.small else (256, 256, 256)
    samples = 6 if args.small else 32

    # 1. Two spaces of one workload: the default rules (None) against the same set without
    #    packing. Uniform samples of each are tested for membership in the other.
    cmp = compare_spaces("matmul", size, None, "-pack", samples=20 if args.small else 200)
    print(cmp.text())

    # 2. The speed of programs drawn uniformly from the default space, each compiled, checked
    #    against numpy and timed on one core. The database keeps every measurement: run the
    #    script again with the same --out and nothing is measured twice.
    settings = Settings(repeats=2 if args.small else 5, warmup=0, threads=1)
    dist = measure_distribution("matmul", size, samples=samples, seed=0,
                                db=out / "space.db", settings=settings)
    print(f"\n{len(dist.samples)} uniform programs ({dist.skipped_unrolled} over-unrolled draws "
          f"skipped), {dist.correct_fraction:.0%} correct, {dist.measured} measured now")
    print("GFLOPS percentiles:", {k: round(v, 3) for k, v in dist.percentiles().items()})
    print(dist.histogram(bins=8))

    # 3. How well each cost model orders those programs (Spearman 1 = perfectly). A model's top
    #    pick is what a search that trusts it would run first.
    for name, q in rank_quality(dist, models=("analytic", "random")).items():
        rho = "n/a" if q["spearman"] is None else f"{q['spearman']:+.2f}"
        print(f"{name:>9}: Spearman {rho}, top-10% recall {q['top_recall']:.0%}, "
              f"top pick at {q['top1_fraction']:.0%} of the best")


if __name__ == "__main__":
    main()
