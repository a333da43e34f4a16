"""Facts about this machine, recorded with every measurement so timings can be compared honestly.

Peak GFLOPS is measured, not computed: flops/cycle x nominal frequency is unreliable in a VM, so a
tiny kernel of independent 512-bit FMAs is compiled for the host CPU (the backend's target machine)
and timed. Zen 4, for example, executes 512-bit FMAs double-pumped: 32 float32 flop/cycle/core.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm

from .backend.target import create_target_machine, host

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")

# Enough independent accumulators to cover FMA latency x issue width on current x86 cores
# (4 cycles x 2 pipes needs 8; 16 leaves room); each step is one <16 x float> FMA per accumulator.
_ACCUMULATORS = 16
_LANES = 16
_STEPS = 4_000_000


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass(frozen=True)
class CacheLevel:
    """One cache of core 0 as sysfs describes it; the geometry is None where sysfs omits it."""

    name: str  # L1d, L1i, L2, L3
    size: int  # bytes
    shared: bool  # with another CPU (its shared_cpu_list names more than core 0)
    line_bytes: int | None
    sets: int | None
    ways: int | None


def cache_levels(directory: Path = _CACHE_DIR) -> list[CacheLevel]:
    """Core 0's caches from sysfs (`directory` holds its index* folders), in index order; empty
    if sysfs is unavailable. The one reader of that directory."""
    out = []
    for index in sorted(directory.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out.append(CacheLevel(f"L{level}{suffix}", size,
                              _read(index / "shared_cpu_list", str) not in (None, "0", ""),
                              _read(index / "coherency_line_size", int),
                              _read(index / "number_of_sets", int),
                              _read(index / "ways_of_associativity", int)))
    return out


def _read(path: Path, parse: Callable[[str], Any]) -> Any:
    """The file's stripped text parsed by `parse`, or None if it is missing or malformed."""
    try:
        return parse(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cache_sizes() -> dict[str, int]:
    """Bytes per cache level of core 0, keyed L1d, L1i, L2, L3 (empty if sysfs is unavailable)."""
    return {level.name: level.size for level in cache_levels()}


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(),
           "llvm": ".".join(map(str, llvm.llvm_version_info))}
    for dist in ("eqsched", "numpy", "llvmlite", "egglog", "networkx"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


@functools.cache
def facts() -> dict[str, object]:
    """Static facts (cheap, cached): CPU, LLVM's view of it, cores, caches, versions."""
    cpu = host()
    return {
        "cpu_model": cpu_model(),
        "llvm_cpu_name": cpu["cpu_name"],
        "llvm_cpu_features": cpu["cpu_features"],
        "cores": os.cpu_count() or 1,
        "usable_cores": len(os.sched_getaffinity(0)),
        "caches": cache_sizes(),
        "versions": versions(),
    }


def _fma_ir() -> str:
    vec = f"<{_LANES} x float>"
    names = range(_ACCUMULATORS)
    lines = [
        f"declare {vec} @llvm.fma.v{_LANES}f32({vec}, {vec}, {vec})",
        "",
        # The multiplier and addend come from memory so LLVM cannot fold the chain away;
        # acc = acc * 0.999999 + 1e-3 stays bounded (no overflow, no denormals).
        'define void @fma_peak(i64 %steps, ptr noalias %io) #0 {',
        "entry:",
        "  %m = load float, ptr %io",
        "  %ap = getelementptr float, ptr %io, i64 1",
        "  %a = load float, ptr %ap",
        f"  %mv0 = insertelement {vec} poison, float %m, i64 0",
        f"  %mv = shufflevector {vec} %mv0, {vec} poison, <{_LANES} x i32> zeroinitializer",
        f"  %av0 = insertelement {vec} poison, float %a, i64 0",
        f"  %av = shufflevector {vec} %av0, {vec} poison, <{_LANES} x i32> zeroinitializer",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%i.next, %loop]",
    ]
    lines += [f"  %acc{n} = phi {vec} [%av, %entry], [%acc{n}.next, %loop]" for n in names]
    lines += [f"  %acc{n}.next = call {vec} @llvm.fma.v{_LANES}f32({vec} %acc{n}, {vec} %mv, "
              f"{vec} %av)" for n in names]
    lines += [
        "  %i.next = add i64 %i, 1",
        "  %done = icmp uge i64 %i.next, %steps",
        "  br i1 %done, label %exit, label %loop",
        "exit:",
    ]
    total = "%acc0.next"
    for n in names[1:]:
        lines.append(f"  %sum{n} = fadd {vec} {total}, %acc{n}.next")
        total = f"%sum{n}"
    lines += [
        f"  %first = extractelement {vec} {total}, i64 0",
        "  store float %first, ptr %io",
        "  ret void",
        "}",
        "",
        # Without this, a CPU tuned to prefer 256-bit vectors would split each FMA in two.
        'attributes #0 = { "min-legal-vector-width"="512" }',
    ]
    return "\n".join(lines)


@functools.cache
def _fma_kernel() -> tuple[llvm.ExecutionEngine, ctypes._CFuncPtr]:
    module = llvm.parse_assembly(_fma_ir())
    module.triple = host()["triple"]
    module.verify()
    engine = llvm.create_mcjit_compiler(module, create_target_machine(3))
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.POINTER(ctypes.c_float))
    return engine, proto(engine.get_function_address("fma_peak"))


def fma_kernel_asm() -> str:
    """The peak kernel's assembly (to check that it really issues zmm FMAs)."""
    module = llvm.parse_assembly(_fma_ir())
    module.triple = host()["triple"]
    return create_target_machine(3).emit_assembly(module)


def measure_peak_gflops(steps: int = _STEPS, repeats: int = 5) -> float:
    """Best-of-`repeats` float32 GFLOPS of one core running independent vector FMAs."""
    _, fn = _fma_kernel()
    io = (ctypes.c_float * 2)(0.999999, 1e-3)
    flops = steps * _ACCUMULATORS * _LANES * 2
    best = float("inf")
    fn(steps // 10, io)  # warm the core's clock up
    for _ in range(repeats):
        io[0], io[1] = 0.999999, 1e-3
        start = time.perf_counter()
        fn(steps, io)
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


@functools.cache
def peak_gflops() -> float:
    """This core's measured float32 FMA peak, measured once per process."""
    return round(measure_peak_gflops(), 1)


def describe() -> dict[str, object]:
    """All facts, with the measured peak per core."""
    return {**facts(), "peak_gflops_per_core": peak_gflops()}
