"""compile_program: lower, optimize, JIT; cached per (program, options) in this process.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import threading
import time

import llvmlite
import llvmlite.binding as llvm

from ..ir import Program
from .errors import BackendError
from .kernel import Kernel
from .lower import lower
from .options import CompileOptions
from .target import create_target_machine, host, target_machine

# Which code generator made a kernel: raised whenever lowering changes the code a program
# compiles to (its speed), so that a timing stored for the old code is not taken for the new one
# (`codegen`, part of a measurement's lookup key).
CODEGEN_VERSION = 4

_cache: dict[tuple[object, ...], Kernel] = {}
_cache_lock = threading.Lock()


def compile_program(prog: Program, options: CompileOptions | None = None) -> Kernel:
    """Compile `prog` for `options.target`; compiling it again with the same options is free."""
    options = options or CompileOptions()
    options.target.check_runs_here()
    key = (prog.hash(), options)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    kernel = _compile(prog, options)
    with _cache_lock:
        return _cache.setdefault(key, kernel)


def _compile(prog: Program, options: CompileOptions) -> Kernel:
    start = time.perf_counter()
    tm = target_machine(options.opt_level, options.target)
    module, segments = lower(prog, host()["triple"], str(tm.target_data),
                             options.target.vector_lanes, options.body_copies)
    try:
        llvm_module = llvm.parse_assembly(str(module))
        llvm_module.verify()
    except RuntimeError as err:
        detail = str(err).strip().splitlines()
        first = detail[0] if detail else str(err)
        raise BackendError(f"LLVM rejected the code for {prog.name}: {first}") from err
    optimize(llvm_module, options)
    optimized_ir = str(llvm_module)
    machine = create_target_machine(options.opt_level, options.target)
    engine = llvm.create_mcjit_compiler(llvm_module, machine)
    engine.finalize_object()
    info = describe(options)
    info["segments"] = len(segments)
    info["compile_seconds"] = round(time.perf_counter() - start, 4)
    return Kernel(prog, engine, segments, optimized_ir, options, info)


def optimize(module: llvm.ModuleRef, options: CompileOptions) -> None:
    """Run LLVM's default O<n> pipeline with the vectorizers/unroller set as `options` say."""
    tm = target_machine(options.opt_level, options.target)
    pto = llvm.create_pipeline_tuning_options(speed_level=options.opt_level)
    pto.loop_vectorization = options.loop_vectorize
    pto.slp_vectorization = options.slp_vectorize
    pto.loop_unrolling = options.loop_unroll
    pto.loop_interleaving = options.loop_unroll
    builder = llvm.create_pass_builder(tm, pto)
    builder.getModulePassManager().run(module, builder)


def codegen() -> str:
    """This backend's code generator: its own version and LLVM's, like "3/llvm-22.1.0"."""
    return f"{CODEGEN_VERSION}/llvm-{'.'.join(map(str, llvm.llvm_version_info))}"


def describe(options: CompileOptions) -> dict[str, object]:
    """Everything about the compiler and CPU a timing depends on."""
    return {
        "codegen": codegen(),
        "llvm_version": ".".join(map(str, llvm.llvm_version_info)),
        "llvmlite_version": llvmlite.__version__,
        **options.target.describe(),
        "opt_level": options.opt_level,
        "loop_vectorize": options.loop_vectorize,
        "slp_vectorize": options.slp_vectorize,
        "loop_unroll": options.loop_unroll,
        "body_copies": options.body_copies,
        "threads": options.thread_count,
    }
