"""A compiled program: callable on numpy arrays, run in place.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from math import prod

import llvmlite.binding as llvm
import numpy as np

from ..ir import Buffer, Program, Scope
from .errors import BackendError
from .lower import Segment
from .options import CompileOptions
from .target import target_machine
from .team import team_for

# The byte boundary every buffer a kernel is tuned and run on starts on (a zmm, a cache line).
ALIGNMENT = 64


@dataclass(frozen=True)
class Step:
    """One compiled function of a kernel bound to arrays (`Kernel.bind`): its machine-code
    address, its pointer arguments in `Program.params` order, and for a chunk function the
    extent of its parallel loop and the threads to split it among."""

    address: int
    pointers: tuple[int, ...]
    parallel_extent: int | None = None
    threads: int = 1
    packed: int | None = None  # a chunk function's packed entry (args, lo, hi), for a team
    # Buffers some pointers point to that the step's binding made (`Kernel.bind(prepared=True)`):
    # held here so they live as long as the step.
    owned: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)

    @property
    def serial(self) -> bool:
        """Whether it runs as one call on one thread (a chunk function given its whole
        extent)."""
        return self.parallel_extent is None or self.team_size == 1

    @property
    def team_size(self) -> int:
        """The threads its parallel loop is shared among."""
        return team_size(self.threads, self.parallel_extent)


def team_size(threads: int, parallel_extent: int | None) -> int:
    """The threads a function's parallel loop is shared among (1: it runs as one call)."""
    return min(threads, parallel_extent or 1)


def aligned_empty(shape: tuple[int, ...], alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized float32 array whose data starts on an `alignment`-byte boundary."""
    return aligned_empty_at(shape, alignment)[0]


def aligned_empty_at(shape: tuple[int, ...], alignment: int = ALIGNMENT
                     ) -> tuple[np.ndarray, int]:
    """`aligned_empty` and the address of its data (reaching an array's address through numpy's
    ctypes interface costs about as much as allocating it)."""
    size = prod(shape)
    raw = np.empty(size + alignment // 4, np.float32)
    address = raw.ctypes.data
    start = (-address % alignment) // 4
    return raw[start:start + size].reshape(shape), address + 4 * start


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A float32 copy of `array` whose data starts on a 64-byte boundary.

    Where numpy's allocator puts an array depends on what was allocated before, so two
    processes handing a kernel the same values can hand it differently aligned rows: an AVX2
    kernel loading 8-float vectors from a row 16 bytes past a cache line splits every other
    load and ran 2x slower (docs/ARCHITECTURE.md §11). Copies made here make timings comparable.
    """
    copy = aligned_empty(array.shape)
    copy[...] = array
    return copy


class Kernel:
    """`kernel(*inputs, *outputs)` runs the program in place on float32 C-contiguous arrays.

    Arrays come in `program.inputs + program.outputs` order; intermediates (GLOBAL buffers) are
    allocated once here and reused by every call.
    """

    def __init__(self, program: Program, engine: llvm.ExecutionEngine, segments: list[Segment],
                 optimized_ir: str, options: CompileOptions, info: dict[str, object]):
        self.program = program
        self.options = options
        self.info = info
        self._engine = engine  # owns the machine code: keep it as long as the kernel
        self._optimized_ir = optimized_ir
        self._args: tuple[Buffer, ...] = program.inputs + program.outputs
        globals_ = [b for b in program.params if b.scope == Scope.GLOBAL]
        self._intermediates = [aligned_empty(b.shape) for b in globals_]
        self._intermediate_ptrs = [a.ctypes.data for a in self._intermediates]
        # The intermediates `program.preparation` fills: a binding to constants gets its own.
        self._prepared_slots = [n for n, b in enumerate(globals_)
                                if b.name in program.prepared_buffers]
        n_ptrs = len(program.params)
        self._segments = [(engine.get_function_address(seg.function), seg.parallel_extent,
                           engine.get_function_address(seg.packed)
                           if seg.parallel_extent is not None else None)
                          for seg in segments]
        self._preparing = [n for n, seg in enumerate(segments) if seg.preparation]
        self._per_call = [n for n, seg in enumerate(segments) if not seg.preparation]
        self._calls: list[Callable[..., None]] = []
        for address, extent, _ in self._segments:
            extra = [ctypes.c_int64] * 2 if extent is not None else []
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_ptrs), *extra)
            self._calls.append(proto(address))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on named inputs into fresh, aligned outputs, returned by name. Outputs and
        intermediates start as NaN, so a point the kernel never writes, or reads before writing,
        cannot pass a comparison (fresh memory is often zero: an accumulator whose init was
        lost would pass)."""
        outputs, arrays = self._fresh(inputs)
        self(*arrays)
        return outputs

    def prepared_run(self, inputs: dict[str, np.ndarray]
                     ) -> tuple[dict[str, np.ndarray], Callable[[], None]]:
        """`run` as a kernel bound to its constants runs (`prepared`): the preparation once,
        then the rest. Returns the outputs and that call, which runs the rest again in place."""
        outputs, arrays = self._fresh(inputs)
        call = self.prepared(*arrays)
        call()
        return outputs, call

    def _fresh(self, inputs: dict[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
        """New aligned outputs by name, and the call's arrays; outputs and intermediates NaN."""
        for intermediate in self._intermediates:
            intermediate.fill(np.nan)
        outputs = {}
        for b in self.program.outputs:
            outputs[b.name] = aligned_empty(b.shape)
            outputs[b.name].fill(np.nan)
        return outputs, (*(inputs[b.name] for b in self.program.inputs), *outputs.values())

    def __call__(self, *arrays: np.ndarray) -> None:
        self._invoke(range(len(self._segments)), self._pointers(arrays) + self._intermediate_ptrs)

    def prepared(self, *arrays: np.ndarray) -> Callable[[], None]:
        """Bind `arrays` and run the program's `preparation` now, once; returns a call that
        runs the rest in place. The constant inputs must keep their values while it is used
        (what it prepared from them is not made again). The intermediates it prepares are its
        own and start as NaN, as `run`'s do. The call holds the arrays and those buffers (it
        has their addresses), so they live as long as it."""
        ptrs, owned = self._prepare(arrays)
        held = (arrays, owned)

        def call() -> None:
            self._invoke(self._per_call, ptrs)

        call.held = held  # type: ignore[attr-defined]
        return call

    def bind(self, *arrays: np.ndarray, prepared: bool = False) -> list[Step]:
        """The kernel's functions bound to `arrays` (checked as a call checks them), to be
        called later by address (`backend.chain`): the arrays and this kernel must outlive
        every such call. `prepared`: run the program's `preparation` now, once (see
        `prepared`), and bind only the rest."""
        if not prepared:
            ptrs = tuple(self._pointers(arrays) + self._intermediate_ptrs)
            return [Step(address, ptrs, extent, self.options.thread_count, packed)
                    for address, extent, packed in self._segments]
        pointers, owned = self._prepare(arrays)
        ptrs = tuple(pointers)
        return [Step(address, ptrs, extent, self.options.thread_count, packed, owned)
                for address, extent, packed in (self._segments[n] for n in self._per_call)]

    def _prepare(self, arrays: tuple[np.ndarray, ...]) -> tuple[list[int], tuple[np.ndarray, ...]]:
        """Pointers to `arrays`, the intermediates and fresh buffers for the prepared ones, with
        the preparation run into them; and those buffers."""
        ptrs = self._pointers(arrays) + self._intermediate_ptrs
        owned = []
        for slot in self._prepared_slots:
            buffer = aligned_empty(self._intermediates[slot].shape)
            buffer.fill(np.nan)
            owned.append(buffer)
            ptrs[len(arrays) + slot] = buffer.ctypes.data
        self._invoke(self._preparing, ptrs)
        return ptrs, tuple(owned)

    def _invoke(self, segments: Iterable[int], ptrs: list[int]) -> None:
        """Run the `segments` (positions in the segment list) in order on `ptrs`."""
        packed_args = None
        for n in segments:
            fn, (_, extent, packed) = self._calls[n], self._segments[n]
            threads = team_size(self.options.thread_count, extent)
            if extent is None:
                fn(*ptrs)
            elif threads == 1:
                fn(*ptrs, 0, extent)
            else:
                if packed_args is None:
                    packed_args = (ctypes.c_void_p * len(ptrs))(*ptrs)
                team_for(threads).run(packed, ctypes.addressof(packed_args), extent)

    def _pointers(self, arrays: tuple[np.ndarray, ...]) -> list[int]:
        name = self.program.name
        if len(arrays) != len(self._args):
            expected = ", ".join(b.name for b in self._args)
            raise BackendError(f"kernel {name} takes {len(self._args)} arrays ({expected}), "
                               f"got {len(arrays)}")
        for arr, buf in zip(arrays, self._args):
            if not isinstance(arr, np.ndarray):
                kind = type(arr).__name__
                raise BackendError(f"{name}: {buf.name} must be a numpy array, got {kind}")
            if arr.dtype != np.float32:
                raise BackendError(f"{name}: {buf.name} must be float32, got {arr.dtype}")
            if arr.shape != buf.shape:
                raise BackendError(
                    f"{name}: {buf.name} must have shape {buf.shape}, got {arr.shape}")
            if not arr.flags.c_contiguous:
                raise BackendError(f"{name}: {buf.name} must be C-contiguous")
            if buf.scope == Scope.OUTPUT and not arr.flags.writeable:
                raise BackendError(f"{name}: output {buf.name} is read-only")
        # Pointer arguments are `noalias`: an output sharing memory would be miscompiled.
        for i, (arr, buf) in enumerate(zip(arrays, self._args)):
            if buf.scope != Scope.OUTPUT:
                continue
            for j, other in enumerate(arrays):
                if j != i and np.may_share_memory(arr, other):
                    raise BackendError(f"{name}: output {buf.name} overlaps {self._args[j].name}")
        return [a.ctypes.data for a in arrays]

    def llvm_ir(self) -> str:
        """The optimized LLVM IR."""
        return self._optimized_ir

    def asm(self) -> str:
        """The machine code as assembly text (from the optimized IR)."""
        module = llvm.parse_assembly(self._optimized_ir)
        return target_machine(self.options.opt_level, self.options.target).emit_assembly(module)
