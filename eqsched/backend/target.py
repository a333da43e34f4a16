"""The host CPU as LLVM sees it, and the optimization pipeline run on generated modules.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import functools

import llvmlite
import llvmlite.binding as llvm

from .options import CompileOptions


@functools.cache
def _initialized() -> bool:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return True


@functools.cache
def host() -> dict[str, str]:
    """CPU name, feature string and triple of this machine."""
    _initialized()
    # The name alone can be an older core than the machine (docs/ARCHITECTURE.md §17.1), so
    # the feature string is passed as well: it is what enables AVX-512.
    return {
        "cpu_name": llvm.get_host_cpu_name(),
        "cpu_features": llvm.get_host_cpu_features().flatten(),
        "triple": llvm.get_process_triple(),
    }


def create_target_machine(opt_level: int) -> llvm.TargetMachine:
    """A new host target machine (an execution engine takes ownership of the one it gets)."""
    cpu = host()
    target = llvm.Target.from_triple(cpu["triple"])
    return target.create_target_machine(
        cpu=cpu["cpu_name"], features=cpu["cpu_features"], opt=opt_level, codemodel="jitdefault"
    )


@functools.cache
def target_machine(opt_level: int) -> llvm.TargetMachine:
    """The shared target machine for optimization and assembly printing."""
    return create_target_machine(opt_level)


def optimize(module: llvm.ModuleRef, options: CompileOptions) -> None:
    """Run LLVM's default O<n> pipeline with the vectorizers/unroller set as `options` say."""
    tm = target_machine(options.opt_level)
    pto = llvm.create_pipeline_tuning_options(speed_level=options.opt_level)
    pto.loop_vectorization = options.loop_vectorize
    pto.slp_vectorization = options.slp_vectorize
    pto.loop_unrolling = options.loop_unroll
    pto.loop_interleaving = options.loop_unroll
    builder = llvm.create_pass_builder(tm, pto)
    builder.getModulePassManager().run(module, builder)


def describe(options: CompileOptions) -> dict[str, object]:
    """Everything about the compiler and CPU a timing depends on."""
    return {
        "llvm_version": ".".join(map(str, llvm.llvm_version_info)),
        "llvmlite_version": llvmlite.__version__,
        **host(),
        "opt_level": options.opt_level,
        "loop_vectorize": options.loop_vectorize,
        "slp_vectorize": options.slp_vectorize,
        "loop_unroll": options.loop_unroll,
        "threads": options.thread_count,
    }
