"""Kernels bound once to their arrays and run in order by one native call.

    chain = Chain([(matmul, (x, w, h)), (softmax, (h, p))])   # arrays checked and bound here
    chain()                                                    # one native call

Calling a kernel from Python costs more than a small kernel runs: every call checks its arrays
and reads each one's address through numpy's ctypes interface. A chain does that once: it binds
every kernel's functions to their arrays (`Kernel.bind`) and compiles a glue function that calls
them one after the other with the addresses as constants, so a run is one ctypes call, which
releases the GIL for all of it. A function whose parallel loop is shared among threads is called
through its team (`team_run`, natively too), with its pointers in an array the chain keeps.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from contextlib import ExitStack

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from .kernel import Kernel, Step
from .options import CompileOptions
from .target import create_target_machine, host, target_machine
from .team import Team, team_for

PTR = ir.PointerType()
I64 = ir.IntType(64)


class Chain:
    """`calls`: (kernel, its arrays in `program.inputs + program.outputs` order) in running
    order. Calling the chain runs them all in place; the arrays' contents are read and written
    as the kernels' calls would, the arrays themselves stay bound (one run at a time). No calls:
    a chain that runs nothing (a model whose outputs are its inputs). `prepared`: each kernel's
    `Program.preparation` runs once, here (`Kernel.bind`), so its constant inputs must keep
    their values while the chain is used."""

    def __init__(self, calls: Sequence[tuple[Kernel, Sequence[np.ndarray]]],
                 prepared: bool = False):
        # The machine code and the memory the addresses point to live as long as the chain.
        self._bound = [(kernel, tuple(arrays)) for kernel, arrays in calls]
        steps = [step for kernel, arrays in self._bound
                 for step in kernel.bind(*arrays, prepared=prepared)]
        self._steps = steps  # they hold the buffers a preparation filled
        self._teams = {step.team_size: team_for(step.team_size)
                       for step in steps if not step.serial}
        self._packed_args = {n: (ctypes.c_void_p * len(step.pointers))(*step.pointers)
                             for n, step in enumerate(steps) if not step.serial}
        self._run = None
        if steps:
            self._engine = _glue_engine(steps, self._teams, self._packed_args,
                                        calls[0][0].options)
            self._run = ctypes.CFUNCTYPE(None)(self._engine.get_function_address("run"))

    @property
    def native_calls(self) -> int:
        """The native calls a run makes from the calling thread: one, or none for no calls."""
        return 0 if self._run is None else 1

    def __call__(self) -> None:
        if self._run is None:
            return
        with ExitStack() as held:  # its teams are this chain's for the run
            for size in sorted(self._teams):
                held.enter_context(self._teams[size].lock)
            self._run()


def _glue_engine(steps: list[Step], teams: dict[int, Team], packed_args: dict[int, ctypes.Array],
                 options: CompileOptions) -> llvm.ExecutionEngine:
    """An engine holding `run()`, which calls every step in order: a serial one on its
    pointers (a chunk function on its whole extent), a shared one through its team."""
    module = ir.Module(name="chain")
    module.triple = host()["triple"]
    module.data_layout = str(target_machine(options.opt_level, options.target).target_data)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "run")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    callees: dict[int, ir.Function] = {}  # address -> its declaration

    def callee(address: int, parameters: list[ir.Type]) -> ir.Function:
        if address not in callees:
            signature = ir.FunctionType(ir.VoidType(), parameters)
            callees[address] = ir.Function(module, signature, f"callee{len(callees)}")
        return callees[address]

    def constant(address: int) -> ir.Value:
        return ir.Constant(I64, address).inttoptr(PTR)

    for n, step in enumerate(steps):
        if step.serial:
            chunked = step.parallel_extent is not None
            arguments = [constant(p) for p in step.pointers]
            if chunked:
                arguments += [ir.Constant(I64, 0), ir.Constant(I64, step.parallel_extent)]
            builder.call(callee(step.address, [PTR] * len(step.pointers)
                                + ([I64, I64] if chunked else [])), arguments)
            continue
        team = teams[step.team_size]
        run = callee(team.run_address, [PTR, PTR, PTR, I64, I64, I64])
        builder.call(run, [constant(team.state_address), constant(step.packed),
                           constant(ctypes.addressof(packed_args[n])),
                           ir.Constant(I64, step.parallel_extent),
                           ir.Constant(I64, team.chunk(step.parallel_extent)),
                           ir.Constant(I64, team.helpers)])
    builder.ret_void()
    llvm_module = llvm.parse_assembly(str(module))
    llvm_module.verify()
    engine = llvm.create_mcjit_compiler(
        llvm_module, create_target_machine(options.opt_level, options.target))
    for address, declaration in callees.items():
        engine.add_global_mapping(llvm_module.get_function(declaration.name), address)
    engine.finalize_object()
    return engine


__all__ = ["Chain"]
