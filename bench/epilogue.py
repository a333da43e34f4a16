"""A convolution's epilogue fused by hand: the ResNet block's first task (conv 3x3, 64 channels,
56x56, then batch norm and ReLU) as a hand schedule of the space, beside onnxruntime's
Conv + BatchNormalization + Relu (weights as initializers) and, given a tuned database, the
task's best stored program, timed alternately on one thread.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/epilogue.py
    ... --db kept/resnet_block.gradient.200.db      # beside that database's winner

The hand schedule: the scale-shift inlined into the ReLU, the ReLU fused into the convolution's
nest under its rows after the reduction loops (4 channels x 56 lanes, r2 and the channels
unrolled), the init and the padding copy vectorized (docs/ARCHITECTURE.md §17.7). `--scalar`
adds the same tile with the epilogue's and init's nests left scalar.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def fused_tile(comp, vectorized: bool = True):
    from eqsched.ir import naive_program
    from eqsched.schedule import Schedule

    s = Schedule(naive_program(comp))
    s.inline("t2")
    s.split("t1.i1", [16, 4])
    s.split("t1.i3", [-1, 64])
    s.reorder("t1.i1.0", "t1.i2", "t1.i3.0", "t1.r0", "t1.r1", "t1.r2", "t1.i1.1", "t1.i3.1")
    s.unroll("t1.r2")
    s.unroll("t1.i1.1")
    s.vectorize("t1.i3.1")
    s.fuse("t1.init", at="t1.i3.0")
    s.fuse("t3", at="t1.i3.0")
    if vectorized:
        for loop in ("t1.init.i3.1", "t3.i3.1"):
            s.vectorize(loop)
        for loop in ("t1.init.i1.1", "t3.i1.1"):
            s.unroll(loop)
        s.split("t0__pad.i3", [-1, 64])
        s.vectorize("t0__pad.i3.1")
    return s.program


def onnxruntime_conv_bn_relu(seed: int = 0):
    import numpy as np
    import onnxruntime as ort
    from portability import session_options

    from eqsched.model import ModelBuilder, to_onnx

    rng = np.random.default_rng(seed)
    b = ModelBuilder("conv_bn_relu")
    x = b.input("x", (1, 64, 56, 56))
    y = b.conv(x, b.weight("w", rng.normal(0, 0.05, (64, 64, 3, 3))), pads=(1, 1, 1, 1))
    y = b.batch_norm(y, b.weight("gamma", rng.uniform(0.5, 1.5, 64)),
                     b.weight("beta", rng.normal(0, 0.1, 64)),
                     b.weight("mean", rng.normal(0, 0.1, 64)),
                     b.weight("var", rng.uniform(0.5, 1.5, 64)))
    session = ort.InferenceSession(to_onnx(b.build(b.relu(y))).SerializeToString(),
                                   session_options(1), providers=["CPUExecutionProvider"])
    feed = {"x": rng.standard_normal((1, 64, 56, 56)).astype(np.float32)}
    return lambda: session.run(None, feed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="a tuned database of the ResNet block: time its winner too")
    ap.add_argument("--scalar", action="store_true", help="also the tile with scalar epilogue")
    ap.add_argument("--repeats", type=int, default=25)
    args = ap.parse_args()

    from portability import paired_speedup, sampled, summary

    from eqsched.backend import CompileOptions, compile_program
    from eqsched.compiled_model import best_record
    from eqsched.db import Database
    from eqsched.ir import naive_program
    from eqsched.model import extract_tasks, get_model
    from eqsched.reference import compare, random_inputs, reference, tolerance
    from eqsched.schedule import Schedule

    options = CompileOptions(threads=1)
    comp = extract_tasks(get_model("resnet_block"))[0].computation
    programs = {"hand": fused_tile(comp)}
    if args.scalar:
        programs["hand, scalar epilogue"] = fused_tile(comp, vectorized=False)
    if args.db:
        with Database(args.db, readonly=True) as db:
            record = best_record(db, comp, options)
        if record is None:
            sys.exit(f"{args.db}: no measurement of {comp.name}")
        programs["database's best"] = Schedule.replay(naive_program(comp), record.trace).program
    inputs = random_inputs(comp, 0)
    expected = reference(comp, inputs)
    calls = {}
    for name, program in programs.items():
        outputs, calls[name] = compile_program(program, options).prepared_run(inputs)
        ok, _, message = compare(outputs, expected, tolerance(comp))
        if not ok:
            sys.exit(f"{name}: {message}")
    names = ["onnxruntime", *calls]
    samples = sampled([onnxruntime_conv_bn_relu(), *calls.values()], args.repeats)
    flops = comp.flops
    print(f"{'program':<24} {'ms':>7} {'GFLOPS':>7} {'vs onnxrt':>9} {'spread':>7}")
    for name, times in zip(names, samples):
        median, spread = summary(times)
        print(f"{name:<24} {median * 1e3:7.3f} {flops / median / 1e9:7.1f} "
              f"{paired_speedup(times, samples[0]):8.3f}x {spread:7.1%}")


if __name__ == "__main__":
    main()
