"""Kernels bound once to their arrays and run in order by as few native calls as possible.

    chain = Chain([(matmul, (x, w, h)), (softmax, (h, p))])   # arrays checked and bound here
    chain()                                                    # one native call on one thread

Calling a kernel from Python costs more than a small kernel runs: every call checks its arrays
and reads each one's address through numpy's ctypes interface. A chain does that once: it binds
every kernel's functions to their arrays (`Kernel.bind`) and compiles a glue function that calls
them one after the other with the addresses as constants, so a run is one ctypes call, which
releases the GIL for all of it. A function whose parallel loop is split among threads is the
exception: its chunks are handed to threads from Python as a kernel call hands them
(`run_parallel`), and the serial functions between two such are one glue function each.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from .kernel import Kernel, Step, run_parallel
from .options import CompileOptions
from .target import create_target_machine, host, target_machine

PTR = ir.PointerType()
I64 = ir.IntType(64)


class Chain:
    """`calls`: (kernel, its arrays in `program.inputs + program.outputs` order) in running
    order. Calling the chain runs them all in place; the arrays' contents are read and written
    as the kernels' calls would, the arrays themselves stay bound (one run at a time). No calls:
    a chain that runs nothing (a model whose outputs are its inputs)."""

    def __init__(self, calls: Sequence[tuple[Kernel, Sequence[np.ndarray]]]):
        # The machine code and the memory the addresses point to live as long as the chain.
        self._bound = [(kernel, tuple(arrays)) for kernel, arrays in calls]
        steps = [step for kernel, arrays in self._bound for step in kernel.bind(*arrays)]
        groups: list[list[Step]] = []  # runs of serial steps, and each split step alone
        for step in steps:
            if step.serial and groups and groups[-1][0].serial:
                groups[-1].append(step)
            else:
                groups.append([step])
        serial = {f"run{n}": group for n, group in enumerate(groups) if group[0].serial}
        self._engine = _glue_engine(serial, calls[0][0].options) if serial else None
        self._stages: list[tuple[Callable[[], None], Step | None]] = []  # (call, split step)
        for n, group in enumerate(groups):
            step = group[0]
            if step.serial:
                address = self._engine.get_function_address(f"run{n}")
                self._stages.append((ctypes.CFUNCTYPE(None)(address), None))
            else:
                arguments = [ctypes.c_void_p] * len(step.pointers) + [ctypes.c_int64] * 2
                self._stages.append((ctypes.CFUNCTYPE(None, *arguments)(step.address), step))

    @property
    def native_calls(self) -> int:
        """The native calls a run makes from the calling thread: one per run of serial
        functions, one per function split among threads (its helpers make the others)."""
        return len(self._stages)

    def __call__(self) -> None:
        for fn, split in self._stages:
            if split is None:
                fn()
            else:
                run_parallel(fn, split.parallel_extent, split.pointers, split.threads)


def _glue_engine(functions: dict[str, list[Step]], options: CompileOptions
                 ) -> llvm.ExecutionEngine:
    """An engine holding, for each name, a function that calls its steps in order."""
    module = ir.Module(name="chain")
    module.triple = host()["triple"]
    module.data_layout = str(target_machine(options.opt_level, options.target).target_data)
    callees: dict[int, ir.Function] = {}  # address -> its declaration
    for name, steps in functions.items():
        _glue(module, name, steps, callees)
    llvm_module = llvm.parse_assembly(str(module))
    llvm_module.verify()
    engine = llvm.create_mcjit_compiler(
        llvm_module, create_target_machine(options.opt_level, options.target))
    for address, declaration in callees.items():
        engine.add_global_mapping(llvm_module.get_function(declaration.name), address)
    engine.finalize_object()
    return engine


def _glue(module: ir.Module, name: str, steps: list[Step],
          callees: dict[int, ir.Function]) -> None:
    """A function `name()` calling each step's function on its pointers (a chunk function on
    its whole extent), declared once per address and mapped to it when the engine is made."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), name)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    for step in steps:
        chunked = step.parallel_extent is not None
        if step.address not in callees:
            parameters = [PTR] * len(step.pointers) + ([I64, I64] if chunked else [])
            signature = ir.FunctionType(ir.VoidType(), parameters)
            callees[step.address] = ir.Function(module, signature, f"step{len(callees)}")
        arguments = [ir.Constant(I64, p).inttoptr(PTR) for p in step.pointers]
        if chunked:
            arguments += [ir.Constant(I64, 0), ir.Constant(I64, step.parallel_extent)]
        builder.call(callees[step.address], arguments)
    builder.ret_void()


__all__ = ["Chain"]
