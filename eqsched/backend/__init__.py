"""The LLVM backend: compile a loop program for this CPU and run it on numpy arrays.

    kernel = compile_program(prog)            # CompileOptions() by default
    kernel(A, B, C)                           # prog.inputs + prog.outputs, float32, in place
    kernel.info                               # LLVM/CPU/pass settings to store with a timing

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from .compiler import compile_program
from .errors import BackendError
from .kernel import Kernel, aligned_empty
from .options import CompileOptions

__all__ = ["BackendError", "CompileOptions", "Kernel", "aligned_empty", "compile_program"]
