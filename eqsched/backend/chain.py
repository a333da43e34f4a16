"""Kernels bound once to their arrays and run in order by one native call.

    chain = Chain([(matmul, (x, w, h)), (softmax, (h, p))])   # arrays checked and bound here
    chain()                                                    # one native call

    chain = Chain([(matmul, (x, w, h)), (softmax, (h, p))], per_call=[x, p])
    chain(x2, p2)          # x2 read and p2 written where x and p were: nothing copied

Calling a kernel from Python costs more than a small kernel runs: every call checks its arrays
and reads each one's address through numpy's ctypes interface. A chain does that once: it binds
every kernel's functions to their arrays (`Kernel.bind`) and compiles a glue function that calls
them one after the other with the addresses as constants, so a run is one ctypes call, which
releases the GIL for all of it. The addresses of `per_call` arrays are the run's arguments
instead: a model's inputs and outputs change every call, and copying them in and out of bound
buffers cost a whole pass over each. A function whose parallel loop is shared among threads is
called through its team (`team_run`, natively too), with its pointers in an array the chain
keeps.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from contextlib import ExitStack

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from .errors import BackendError
from .kernel import Kernel, Step
from .options import CompileOptions
from .target import create_target_machine, host, target_machine
from .team import Team, team_for

PTR = ir.PointerType()
I64 = ir.IntType(64)


class Chain:
    """`calls`: (kernel, its arrays in `program.inputs + program.outputs` order) in running
    order. Calling the chain runs them all in place; the arrays' contents are read and written
    as the kernels' calls would, the arrays themselves stay bound (one run at a time) but for
    `per_call` ones, whose place each run's arguments take (`__call__`). No calls:
    a chain that runs nothing (a model whose outputs are its inputs). `prepared`: each kernel's
    `Program.preparation` runs once, here (`Kernel.bind`), so its constant inputs must keep
    their values while the chain is used."""

    def __init__(self, calls: Sequence[tuple[Kernel, Sequence[np.ndarray]]],
                 prepared: bool = False, per_call: Sequence[np.ndarray] = ()):
        """Each `per_call` array must be bound whole wherever its memory is bound."""
        # The machine code and the memory the addresses point to live as long as the chain.
        self._bound = [(kernel, tuple(arrays)) for kernel, arrays in calls]
        self._per_call = tuple(per_call)
        self._written = _written_slots(self._bound, self._per_call)
        steps = [step for kernel, arrays in self._bound
                 for step in kernel.bind(*arrays, prepared=prepared)]
        self._steps = steps  # they hold the buffers a preparation filled
        self._teams = {step.team_size: team_for(step.team_size)
                       for step in steps if not step.serial}
        self._packed_args = {n: (ctypes.c_void_p * len(step.pointers))(*step.pointers)
                             for n, step in enumerate(steps) if not step.serial}
        self._run = None
        if steps:
            slots = {a.ctypes.data: k for k, a in enumerate(self._per_call)}
            self._engine = _glue_engine(steps, self._teams, self._packed_args, slots,
                                        calls[0][0].options)
            self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(
                self._engine.get_function_address("run"))

    @property
    def native_calls(self) -> int:
        """The native calls a run makes from the calling thread: one, or none for no calls."""
        return 0 if self._run is None else 1

    def __call__(self, *arrays: np.ndarray) -> None:
        """Run every kernel, on `arrays` in place of the `per_call` ones (all of them, in
        their order, each of its shape, C-contiguous float32; a written one writable and
        sharing no memory with another). They need only live through the call."""
        if len(arrays) != len(self._per_call):
            raise BackendError(f"a run of this chain takes {len(self._per_call)} arrays, "
                               f"got {len(arrays)}")
        for k, (array, bound) in enumerate(zip(arrays, self._per_call)):
            _check_in_place_of(k, array, bound, k in self._written)
            if k in self._written and any(np.may_share_memory(array, other)
                                          for j, other in enumerate(arrays) if j != k):
                raise BackendError(f"array {k} of the run is written and overlaps another")
        self.run_at([a.ctypes.data for a in arrays])

    def run_at(self, addresses: Sequence[int]) -> None:
        """`__call__` on the arrays at `addresses`, unchecked: for a caller that made them
        (reaching an address through numpy's ctypes interface costs a call of a small
        model more than its kernels run)."""
        if self._run is None:
            return
        passed = (ctypes.c_void_p * len(addresses))(*addresses) if addresses else None
        with ExitStack() as held:  # its teams are this chain's for the run
            for size in sorted(self._teams):
                held.enter_context(self._teams[size].lock)
            self._run(None if passed is None else ctypes.addressof(passed))


def _written_slots(bound: list[tuple[Kernel, tuple[np.ndarray, ...]]],
                   per_call: tuple[np.ndarray, ...]) -> frozenset[int]:
    """The positions in `per_call` of arrays some kernel writes. A bound array that shares
    memory with one of them without being all of it is refused: its address would stay the
    bound one's while the run moves the rest."""
    if len({a.ctypes.data for a in per_call}) != len(per_call):
        raise BackendError("per-call arrays must be distinct")
    written = set()
    for kernel, arrays in bound:
        outputs = {b.name for b in kernel.program.outputs}
        for array, buf in zip(arrays, (*kernel.program.inputs, *kernel.program.outputs)):
            for k, whole in enumerate(per_call):
                if not np.may_share_memory(array, whole):
                    continue
                if array.ctypes.data != whole.ctypes.data or array.nbytes != whole.nbytes:
                    raise BackendError(f"{kernel.program.name}: {buf.name} is bound to part of "
                                       f"per-call array {k}; bind it whole")
                if buf.name in outputs:
                    written.add(k)
    return frozenset(written)


def _check_in_place_of(k: int, array: np.ndarray, bound: np.ndarray, written: bool) -> None:
    if not isinstance(array, np.ndarray):
        raise BackendError(f"array {k} of the run must be a numpy array, got "
                           f"{type(array).__name__}")
    if array.dtype != np.float32 or not array.flags.c_contiguous:
        raise BackendError(f"array {k} of the run must be C-contiguous float32")
    if array.shape != bound.shape:
        raise BackendError(f"array {k} of the run must have shape {bound.shape}, got "
                           f"{array.shape}")
    if written and not array.flags.writeable:
        raise BackendError(f"array {k} of the run is written and is read-only")


def _glue_engine(steps: list[Step], teams: dict[int, Team], packed_args: dict[int, ctypes.Array],
                 slots: dict[int, int], options: CompileOptions) -> llvm.ExecutionEngine:
    """An engine holding `run(arguments)`, which calls every step in order: a serial one on its
    pointers (a chunk function on its whole extent), a shared one through its team. A pointer
    that is a key of `slots` is replaced by `arguments[slots[pointer]]` (stored into a shared
    step's packed pointers before its team runs)."""
    module = ir.Module(name="chain")
    module.triple = host()["triple"]
    module.data_layout = str(target_machine(options.opt_level, options.target).target_data)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "run")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    passed: dict[int, ir.Value] = {}  # slot -> the run's argument, loaded once

    def argument(slot: int) -> ir.Value:
        if slot not in passed:
            at = builder.gep(fn.args[0], [ir.Constant(I64, slot)], source_etype=PTR)
            passed[slot] = builder.load(at, typ=PTR)
        return passed[slot]
    callees: dict[int, ir.Function] = {}  # address -> its declaration

    def callee(address: int, parameters: list[ir.Type]) -> ir.Function:
        if address not in callees:
            signature = ir.FunctionType(ir.VoidType(), parameters)
            callees[address] = ir.Function(module, signature, f"callee{len(callees)}")
        return callees[address]

    def constant(address: int) -> ir.Value:
        return ir.Constant(I64, address).inttoptr(PTR)

    def pointer(address: int) -> ir.Value:
        return argument(slots[address]) if address in slots else constant(address)

    for n, step in enumerate(steps):
        if step.serial:
            chunked = step.parallel_extent is not None
            arguments = [pointer(p) for p in step.pointers]
            if chunked:
                arguments += [ir.Constant(I64, 0), ir.Constant(I64, step.parallel_extent)]
            builder.call(callee(step.address, [PTR] * len(step.pointers)
                                + ([I64, I64] if chunked else [])), arguments)
            continue
        team = teams[step.team_size]
        packed = ctypes.addressof(packed_args[n])
        for k, address in enumerate(step.pointers):
            if address in slots:
                at = constant(packed + k * ctypes.sizeof(ctypes.c_void_p))
                builder.store(argument(slots[address]), at)
        run = callee(team.run_address, [PTR, PTR, PTR, I64, I64, I64])
        builder.call(run, [constant(team.state_address), constant(step.packed),
                           constant(packed),
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
