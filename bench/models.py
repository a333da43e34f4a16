"""Whole models end to end: each built-in model tuned by `tune_model`, then its latency beside
numpy's own evaluation of the graph and onnxruntime's, one thread and two, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/models.py --trials 1000
    ... --only mlp --trials 64 --threads 1
    ... --schedulers --only bert_layer --budgets 200 500 1000   # gradient vs round-robin

Per model and thread count, the model is tuned into a fresh database with that many threads
(a one-thread program has no parallel loop to use a second core), then the compiled model,
`Model.evaluate` (numpy, one BLAS thread per thread asked) and an onnxruntime session of the
model's ONNX export (`intra_op_num_threads` = threads) are timed alternately, so all three see
the same machine noise; each figure is a median. Bar (issue 15): the BERT layer and the ResNet
block at >= 1.0x onnxruntime's speed on one thread with at most 1,000 trials in all.

`--schedulers` instead tunes one model with each task scheduler and prints the end-to-end
latency after each budget (one database per scheduler, grown budget after budget: a larger
budget re-uses what the smaller one measured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

MODELS = {"mlp": {}, "mlp-64": {"batch": 64}, "bert_layer": {}, "resnet_block": {}}
BAR_MODELS, BAR = ("bert_layer", "resnet_block"), 1.0


def _threads_for_libraries(threads: int) -> None:
    """Must run before numpy is imported."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(threads)


def onnxruntime_run(model, threads: int, inputs: dict):
    import onnxruntime as ort

    from eqsched.model import to_onnx

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(to_onnx(model).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    named = model.source_names
    feed = {named.get(k, k): v for k, v in inputs.items()}
    return lambda: session.run(None, feed)


def part_model(name: str, threads: int, trials: int, seed: int, repeats: int) -> dict:
    from portability import timed

    from eqsched.backend import CompileOptions, Target
    from eqsched.compiled_model import CompiledModel
    from eqsched.model import get_model
    from eqsched.tools.tune_model import tune_model

    model = get_model(name.split("-")[0], **MODELS[name])
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "models.db"
        tuned = tune_model(model, trials, db=db, seed=seed, threads=threads,
                           progress=lambda event, data: event == "tasks" and print(
                               f"  {name} x{threads}: {data['trials']}/{data['of']} trials",
                               file=sys.stderr, flush=True))
        compiled = CompiledModel(model, db=db, options=CompileOptions(
            threads=threads, target=Target.parse("host")))
        inputs = compiled.random_inputs(seed)
        verdict = compiled.check(inputs)
        if not verdict:
            raise SystemExit(f"{name} x{threads}: {verdict.message}")
        ours, theirs, numpy_eval = timed([lambda: compiled(inputs),
                                          onnxruntime_run(model, threads, inputs),
                                          lambda: model.evaluate(inputs)], repeats)
    return {"model": name, "threads": threads, "trials": tuned.trials,
            "eqsched_s": ours[0], "onnxruntime_s": theirs[0], "numpy_s": numpy_eval[0],
            "default_s": tuned.default_latency_s, "spread": max(ours[1], theirs[1]),
            "tasks": tuned.tasks}


def part_schedulers(name: str, budgets: list[int], seed: int) -> list[dict]:
    from eqsched.model import get_model
    from eqsched.tools.tune_model import tune_model

    model = get_model(name.split("-")[0], **MODELS[name])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheduler in ("gradient", "round-robin"):
            db = Path(tmp) / f"{scheduler}.db"
            for budget in budgets:
                result = tune_model(model, budget, scheduler=scheduler, db=db, seed=seed,
                                    threads=1)
                rows.append({"model": name, "scheduler": scheduler, "trials": budget,
                             "latency_s": result.latency_s, "correct": result.correct})
                print(f"  {name} {scheduler} {budget}: {result.latency_s * 1e3:.3f} ms",
                      file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="models (default all)")
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--trials", type=int, default=1000, help="trials per model, in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=15, help="alternating timing runs")
    ap.add_argument("--schedulers", action="store_true",
                    help="gradient vs round-robin instead, after each of --budgets")
    ap.add_argument("--budgets", nargs="*", type=int, default=[200, 500, 1000])
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = args.only or list(MODELS)
    if args.part:  # one thread count in a child, its BLAS and OpenMP set before numpy loads
        threads = int(args.part)
        _threads_for_libraries(threads)
        rows = [part_model(n, threads, args.trials, args.seed, args.repeats) for n in names]
        print(json.dumps(rows))
        return
    if args.schedulers:
        _threads_for_libraries(1)
        rows = [r for n in names for r in part_schedulers(n, args.budgets, args.seed)]
        print("model         scheduler     trials  latency ms")
        for r in rows:
            print(f"{r['model']:<13} {r['scheduler']:<13} {r['trials']:>6}  "
                  f"{r['latency_s'] * 1e3:10.3f}{'' if r['correct'] else '  WRONG'}")
    else:
        import subprocess

        rows = []
        for threads in args.threads:
            done = subprocess.run([sys.executable, __file__, "--part", str(threads), "--only",
                                   *names, "--trials", str(args.trials), "--seed",
                                   str(args.seed), "--repeats", str(args.repeats)],
                                  stdout=subprocess.PIPE, text=True, check=True)
            rows += json.loads(done.stdout)
        print("model         threads  trials  eqsched ms  onnxrt ms  numpy ms  default ms  "
              "vs onnxrt  spread")
        for r in rows:
            speed = r["onnxruntime_s"] / r["eqsched_s"]
            bar = (r["model"] in BAR_MODELS and r["threads"] == 1
                   and r["trials"] <= 1000)
            verdict = ("ok" if speed >= BAR else "BELOW") if bar else ""
            print(f"{r['model']:<13} {r['threads']:>7}  {r['trials']:>6}  "
                  f"{r['eqsched_s'] * 1e3:10.3f}  {r['onnxruntime_s'] * 1e3:9.3f}  "
                  f"{r['numpy_s'] * 1e3:8.3f}  {r['default_s'] * 1e3:10.3f}  "
                  f"{speed:8.2f}x  {r['spread']:5.1%}  {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
