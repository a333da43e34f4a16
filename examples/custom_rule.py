"""A rewrite rule of your own: written in a few lines, registered, fuzzed for soundness and
measured for its effect on the space (the API behind `eqsched rules check`).

    python examples/custom_rule.py            # all seven workloads, 3 programs each, a short run
    python examples/custom_rule.py --small    # one workload, no exploration, seconds

The rule here unrolls any serial innermost loop (rules/template.py explains each part). It is
sound, and the check shows what else it says: the default `unroll` rule already covers it, so it
adds no program to the space.
"""

from __future__ import annotations

import argparse

from egglog import rewrite

from eqsched.egraph.lang import Kind, loop
from eqsched.rules import Rule, register
from eqsched.rules.analysis import b, blocks_only, g, p
from eqsched.tools.rulekit import check_rule


@register
class UnrollAnyInnermost(Rule):
    """Unroll a serial loop whose body is blocks only.

        loop(C.k, "1/2", serial, [C.update]) -> loop(C.k, "1/2", unroll, [C.update])
    """

    name = "unroll_any_innermost"
    requires = ("nesting",)  # the analysis rule that derives `blocks_only`

    def rewrites(self, facts):
        return [rewrite(loop(g, p, Kind.serial(), b))
                .to(loop(g, p, Kind.unroll(), b), blocks_only(b))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="one workload, no exploration")
    parser.add_argument("--out", help="unused: the check keeps nothing on disk")
    args = parser.parse_args()

    check = check_rule(UnrollAnyInnermost(), workloads=["softmax"] if args.small else None,
                       programs=1 if args.small else 3, measure=not args.small, trials=8)
    print(f"{check.rule}: {'sound' if check.sound else 'UNSOUND'} on "
          f"{check.programs_checked} programs it changed ({check.seconds:.0f} s)")
    for f in check.failures[:1]:
        print(f"smallest failing case: {f.workload} {f.size}: {f.kind}: {f.detail}")
    for row in check.effect:
        print(f"  {row['workload']}: {float(row['with']['programs']):.3g} programs with it, "
              f"{float(row['without']['programs']):.3g} without")
    if check.measured:
        m = check.measured
        print(f"best GFLOPS on matmul {m['size']}: {m['with']} with, {m['without']} without")


if __name__ == "__main__":
    main()
