"""Batch exploration from a script: a suite of workloads x sizes x configurations, resumable.

    python examples/batch_script.py            # examples/suites/paper.toml: 12 explorations
    python examples/batch_script.py --small    # a suite built in code: 4 tiny explorations

The command line does the same: `eqsched batch examples/suites/small.toml --jobs 2`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from eqsched.tools.batch import Suite, run_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a tiny suite built in code")
    parser.add_argument("--out", help="directory for the results database (default: temp)")
    parser.add_argument("--jobs", type=int, default=2, help="explorations at once")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eqsched-batch-"))
    out.mkdir(parents=True, exist_ok=True)

    if args.small:
        # The dict a TOML suite parses to: lists are crossed (2 sizes x 2 cost models).
        suite = Suite.from_dict({
            "defaults": {"trials": 2, "batch": 2, "population": 16, "threads": 1, "repeats": 2},
            "explore": [{"workload": "matmul", "sizes": [[16, 16, 16], "small"],
                         "cost_model": ["analytic", "random"]}],
        })
    else:
        suite = Suite.load(Path(__file__).parent / "suites" / "paper.toml")
    print(f"{len(suite.jobs)} explorations, {args.jobs} at a time")

    def show(event: str, row: dict) -> None:
        print(f"  finished {row['job']}: {row['status']}")

    result = run_batch(suite, out / "batch.db", jobs=args.jobs, progress=show)
    print(result.table())
    # Run the script again with the same --out: every exploration comes from the database.
    print(f"database: {out / 'batch.db'} (render it: eqsched report --db {out / 'batch.db'} "
          f"--out {out / 'report'})")


if __name__ == "__main__":
    main()
