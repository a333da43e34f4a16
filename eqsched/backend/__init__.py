"""The LLVM backend: compile a loop program for a target CPU and run it on numpy arrays.

    kernel = compile_program(prog)            # CompileOptions() by default: the host target
    compile_program(prog, CompileOptions(target=Target.parse("host,-avx512f")))
    kernel(A, B, C)                           # prog.inputs + prog.outputs, float32, in place
    kernel.info                               # LLVM/CPU/pass settings to store with a timing

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from .compiler import codegen, compile_program
from .errors import BackendError
from .kernel import ALIGNMENT, Kernel, aligned_copy, aligned_empty, aligned_empty_at
from .options import CompileOptions
from .target import Target, TargetError

__all__ = ["ALIGNMENT", "BackendError", "CompileOptions", "Kernel", "Target", "TargetError",
           "aligned_copy", "aligned_empty", "aligned_empty_at", "codegen", "compile_program"]
