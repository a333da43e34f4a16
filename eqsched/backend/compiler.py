"""compile_program: lower, optimize, JIT; cached per (program, options) in this process.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import threading
import time

import llvmlite.binding as llvm

from ..ir import Program
from .errors import BackendError
from .kernel import Kernel
from .lower import lower
from .options import CompileOptions
from .target import create_target_machine, describe, host, optimize, target_machine

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
    module, segments = lower(prog, host()["triple"], str(tm.target_data))
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
