"""A workload of your own: a fully-connected layer with bias and ReLU, registered, checked
against numpy and explored.

    python examples/custom_workload.py            # 256 x 512 -> 256, 24 trials, ~30 s
    python examples/custom_workload.py --small    # tiny, seconds

Once registered (import this module first), the workload is a name like any built-in one.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from eqsched.explore import Settings, explore
from eqsched.expr import relu
from eqsched.interp import run_program
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, tolerance
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_
from eqsched.workloads import get_workload, workload


def dense_relu_numpy(ins: dict[str, np.ndarray], *size: int) -> dict[str, np.ndarray]:
    return {"Y": np.maximum(ins["X"] @ ins["W"] + ins["bias"], 0)}


@workload("dense_relu", params=("batch", "n_in", "n_out"), default=(256, 512, 256),
          small=(4, 8, 16), numpy_fn=dense_relu_numpy)
def dense_relu(batch: int, n_in: int, n_out: int) -> Computation:
    """Y = relu(X @ W + bias): a matmul stage and an elementwise stage the rules may fuse."""
    X = placeholder((batch, n_in), "X")
    W = placeholder((n_in, n_out), "W")
    bias = placeholder((n_out,), "bias")
    k = reduce_axis(n_in, "k")
    H = compute((batch, n_out), lambda i, j: sum_(X[i, k] * W[k, j], axis=k), "H")
    Y = compute((batch, n_out), lambda i, j: relu(H[i, j] + bias[j]), "Y")
    return Computation("dense_relu", [H, Y], flops=2 * batch * n_in * n_out + 2 * batch * n_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny size and budget")
    parser.add_argument("--out", help="directory for the results database (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eqsched-workload-"))
    out.mkdir(parents=True, exist_ok=True)
    wl = get_workload("dense_relu")
    size = wl.small_size if args.small else wl.default_size

    # The naive loops, interpreted, must agree with the numpy function before anything else.
    comp = wl.build(*size)
    inputs = random_inputs(comp, seed=0)
    ok, max_err, message = compare(run_program(naive_program(comp), inputs),
                                   wl.numpy_fn(inputs, *size), tolerance(comp))
    print(f"naive program vs numpy: {'agree' if ok else message} (max error {max_err:.2g})")
    print(naive_program(comp).text())

    result = explore("dense_relu", size, trials=4 if args.small else 24, db=out / "eqsched.db",
                     settings=Settings(repeats=3, threads=1),
                     **({"population": 16} if args.small else {}))  # a small run's small search
    print(f"best: {result.best.gflops:.2f} GFLOPS; its schedule:")
    for step in result.best_trace:
        print(f"  {step['op']}({step['args']})")


if __name__ == "__main__":
    main()
