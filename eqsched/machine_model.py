"""The machine model: every hardware number the analytic cost model uses, for one target on this
machine, measured by a short calibration and cached on disk.

    model = machine_model()                               # the host: cached, else measured
    model = machine_model(Target.parse("host,-avx512f"))  # AVX2 code on this machine
    model = recalibrate(Target.host())                    # measure again, replace the cache
    model.fma_per_cycle, model.fill_cycles("DRAM", threads=2), model.peak_gflops

What follows from the target and the OS is read: float32 lanes and vector registers from the
target's features (AVX-512: 16 lanes, 32 registers; AVX2: 8 and 16), cache sizes, line size and
the L1's and L2's sets and ways from sysfs. The rest is measured by micro-kernels written in LLVM
IR and compiled by the backend's LLVM for the target:

    hz                a chain of dependent integer adds (one cycle each on every x86 core)
    issue_width       independent integer adds per cycle
    fma_per_cycle     independent vector FMAs per cycle, full and half width
    fma_latency       a chain of dependent vector FMAs
    loads/stores      volatile vector loads and stores to an L1-resident buffer, full and half width
    bandwidth         a streaming read of a buffer sized inside each level (L1d, L2, L3) and of
                      one four times the L3 (DRAM), on one core; a level shared between cores
                      (sysfs) and DRAM also on all usable cores at once (a private level
                      scales with the cores)
    strided_fill      the cost of a line fetched a part at a time, 4 KiB apart, from the L3,
                      over the streamed line's (no prefetcher follows such a walk)

Costs are in cycles of the measured reference clock `hz`, and every throughput is measured
against that same clock, so cycles / hz are seconds even where the reference is not the clock
the vector units run at: an AVX-512 down-clock shows as fewer FMAs per cycle, not as a wrong
frequency. Cycles keep the figures recognizable (2 FMAs per cycle, latency 4) and checkable
against bounds. Calls are timed in thread CPU time, so a neighbour that takes the core between
calls does not count; a figure outside its sane bounds is a one-line CalibrationError.

A neighbour on the core's SMT sibling (another tenant of a VM's host) is not so easy: it takes
execution ports, not time, and can halve the issue and FMA rates a kernel reads while leaving
the clock and latencies alone. Contention only ever slows a kernel down, so the port kernels
(issue, FMA, loads, stores, the FMA latency, L1d and L2 reads) run in several passes spaced
in time, each keeping its fastest call, and each figure is the best pass's. A best that no
second pass comes close to may itself be a contended reading among worse ones: such a model is
used for the process but not cached (CalibrationWarning), so the next process measures again.

The model is cached per machine and target as JSON in $EQSCHED_CACHE_DIR, else
$XDG_CACHE_HOME/eqsched, else ~/.cache/eqsched; `machine_model` calibrates on first use.

See docs/ARCHITECTURE.md §7 Backend and target and §8 Cost models.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from .backend.target import Target, create_target_machine, host
from .machine import cache_levels, cache_sizes, facts

CALIBRATION_VERSION = 6  # bump when a kernel or a field changes: older cache files are redone
LEVELS = ("L1d", "L2", "L3", "DRAM")
CORE_LEVELS = ("L1d", "L2")  # read by the port passes: a core's own, shared only with its sibling
PORTS = ("compute", "loads", "stores")
# Used only where sysfs says nothing: the smallest caches of a current x86 core.
FALLBACK_CACHES = {"L1d": 32 << 10, "L1i": 32 << 10, "L2": 512 << 10, "L3": 8 << 20}
FALLBACK_LINE_BYTES, FALLBACK_L1_WAYS = 64, 8
STRIDE_BYTES = 4096  # the strided walk's step: a page, past what any prefetcher follows
# Sane bounds of each measured figure (reference cycles): outside them a kernel or the clock is off.
BOUNDS = {"hz": (2e8, 1e10), "issue_width": (1.0, 16.0), "fma_per_cycle": (0.1, 8.0),
          "fma_latency": (1.0, 24.0), "loads_per_cycle": (0.1, 8.0),
          "stores_per_cycle": (0.05, 8.0), "bandwidth": (0.05, 2048.0),
          "strided_fill": (0.5, 200.0)}
# The port kernels' passes: at least PASSES, spaced PASS_SPACING_S apart, and more (up to
# MAX_PASSES) until a second pass comes within AGREEMENT of every figure's best.
PASSES, MAX_PASSES, PASS_SPACING_S, AGREEMENT = 4, 10, 0.05, 0.05
# A pass whose clock reads more than this fraction below the median clock is left out.
CLOCK_AGREEMENT = 0.1


class CalibrationError(RuntimeError):
    """A calibration kernel failed or measured something impossible."""


class CalibrationWarning(UserWarning):
    """A calibration whose best port figures no second pass reproduced: used, not cached."""


@dataclass(frozen=True)
class MachineModel:
    """One core of this machine running one target's code, as the analytic model sees it.

    Throughputs are per cycle of the reference clock `hz`; `*_half` at half the vector width
    (on a core whose units are half as wide as its registers a full vector takes two, so half
    vectors issue twice as fast). `bandwidth` is read bytes per cycle of one core streaming
    from each level; `bandwidth_all_cores` what `cores` cores streaming at once get together.
    """

    target: str
    cpu_model: str
    vector_lanes: int
    vector_registers: int
    line_bytes: int
    l1_sets: int
    l1_ways: int
    caches: dict[str, int]  # bytes: L1d, L1i, L2, L3
    hz: float
    issue_width: float
    fma_per_cycle: float
    fma_per_cycle_half: float
    fma_latency: float
    loads_per_cycle: float
    loads_per_cycle_half: float
    stores_per_cycle: float
    stores_per_cycle_half: float
    split_loads_per_cycle: float  # full-width loads that each cross a cache line
    bandwidth: dict[str, float]
    bandwidth_all_cores: dict[str, float]
    cores: int
    strided_fill: float
    calibration_seconds: float = 0.0
    l2_sets: int = 0  # 0: unknown (no set conflicts are modelled in the L2)
    l2_ways: int = 0
    calibrated_at: str = ""  # UTC, ISO 8601
    load_average: float = -1.0  # the machine's 1-minute load average as calibration began
    passes: int = 0  # passes of the port kernels
    reproduced: int = 0  # the fewest passes within AGREEMENT of a port figure's best

    @property
    def steady(self) -> bool:
        """Whether every port figure's best was reproduced by a second pass."""
        return self.reproduced >= 2

    @property
    def peak_gflops(self) -> float:
        """One core's float32 FMA peak."""
        return self.fma_per_cycle * self.vector_lanes * 2 * self.hz / 1e9

    def op_cycles(self, port: str, lanes: int) -> float:
        """Cycles of one operation on `lanes` float32 lanes at `port` (compute, loads, stores):
        up to half a vector issues at the half-width rate, more takes whole vectors."""
        full, half = {"compute": (self.fma_per_cycle, self.fma_per_cycle_half),
                      "loads": (self.loads_per_cycle, self.loads_per_cycle_half),
                      "stores": (self.stores_per_cycle, self.stores_per_cycle_half)}[port]
        if 2 * lanes <= self.vector_lanes:
            return 1 / half
        return math.ceil(lanes / self.vector_lanes) / full

    def unaligned_load_cycles(self, lanes: int) -> float:
        """Cycles of a contiguous load of `lanes` float32 whose address has no known alignment:
        at a uniformly random 4-byte offset, a register of w lanes crosses a cache line with
        probability (w - 1) / (floats per line), and those loads run at the split rate."""
        width = min(lanes, self.vector_lanes)
        crossing = (width - 1) / (self.line_bytes // 4)
        split = self.instructions(lanes) / self.split_loads_per_cycle
        return (1 - crossing) * self.op_cycles("loads", lanes) + crossing * split

    def instructions(self, lanes: int) -> int:
        """Instructions of one operation on `lanes` lanes: one per vector register."""
        return math.ceil(lanes / self.vector_lanes)

    def fill_cycles(self, level: str, threads: int = 1) -> float:
        """Cycles per line one core reads from `level` while `threads` cores stream at once. At
        most the calibrated cores share the aggregate bandwidth; past them each core is
        assumed to get the share it got at that count."""
        alone = self.bandwidth[level]
        if threads <= 1:
            return self.line_bytes / alone
        shared = self.bandwidth_all_cores[level] / min(threads, self.cores)
        return self.line_bytes / min(alone, shared)

    def to_json(self) -> dict[str, object]:
        return {"version": CALIBRATION_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> MachineModel:
        if data.get("version") != CALIBRATION_VERSION:
            raise ValueError(f"calibration version {data.get('version')}, "
                             f"expected {CALIBRATION_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def describe(self) -> list[str]:
        """Human-readable lines of the model."""
        ghz = self.hz / 1e9
        out = [f"target: {self.target} ({self.cpu_model})",
               f"vectors: {self.vector_lanes} float32 lanes, {self.vector_registers} registers; "
               f"line {self.line_bytes} B, L1d {self.l1_sets} sets x {self.l1_ways} ways, "
               f"L2 {self.l2_sets} sets x {self.l2_ways} ways",
               f"reference clock: {ghz:.2f} GHz; issue width {self.issue_width:.2f} per cycle",
               f"FMA: {self.fma_per_cycle:.2f} per cycle ({self.fma_per_cycle_half:.2f} at half "
               f"width), latency {self.fma_latency:.2f} cycles; peak {self.peak_gflops:.1f} "
               "GFLOPS per core",
               f"loads: {self.loads_per_cycle:.2f} per cycle ({self.loads_per_cycle_half:.2f} "
               f"at half width, {self.split_loads_per_cycle:.2f} across a line); stores: "
               f"{self.stores_per_cycle:.2f} ({self.stores_per_cycle_half:.2f})"]
        for level in LEVELS:
            size = f"{self.caches[level] >> 10} KiB" if level in self.caches else "memory"
            one, every = self.bandwidth[level], self.bandwidth_all_cores[level]
            out.append(f"{level:>4} ({size}): {one:6.1f} B/cycle = {one * ghz:6.1f} GB/s on one "
                       f"core, {every * ghz:6.1f} GB/s on {self.cores} "
                       f"({every / one:.2f}x)")
        out.append(f"a line fetched 4 KiB apart from the L3 costs {self.strided_fill:.2f}x a "
                   f"streamed one")
        out.append(f"calibrated {self.calibrated_at or 'at an unknown time'} in "
                   f"{self.calibration_seconds:.1f} s, load average {self.load_average:.2f}; "
                   f"port figures: the best of {self.passes} passes, each reproduced by "
                   f"{self.reproduced}" + ("" if self.steady else
                                          " (unsteady: not cached, measured again next time)"))
        return out


# ---- the on-disk cache --------------------------------------------------------------------


def cache_dir() -> Path:
    """Where calibrations are kept: $EQSCHED_CACHE_DIR, else $XDG_CACHE_HOME/eqsched, else
    ~/.cache/eqsched."""
    if os.environ.get("EQSCHED_CACHE_DIR"):
        return Path(os.environ["EQSCHED_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "eqsched"


def cache_path(target: Target) -> Path:
    """The calibration file of `target` on this machine: the target's spec for the reader, a
    digest of the machine's facts and the target's LLVM identity for uniqueness."""
    machine = facts()
    identity = json.dumps([CALIBRATION_VERSION, target.key, machine["cpu_model"],
                           machine["llvm_cpu_name"], machine["llvm_cpu_features"],
                           machine["usable_cores"], machine["caches"]])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9+-]+", "_", target.spec)
    return cache_dir() / f"machine-{readable}-{digest}.json"


def machine_model(target: Target | None = None) -> MachineModel:
    """The model of `target` (default: the host) on this machine: read from the cache, else
    calibrated and cached. Kept for the rest of the process."""
    return _machine_model(target or Target.host(), cache_dir())


@functools.cache
def _machine_model(target: Target, directory: Path) -> MachineModel:
    path = cache_path(target)
    try:
        return MachineModel.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):  # absent, unreadable or older: measure it again
        pass
    return _cached_if_steady(calibrate(target), path)


def _cached_if_steady(model: MachineModel, path: Path) -> MachineModel:
    """Save a steady model at `path`; warn of an unsteady one and leave the cache alone."""
    if model.steady:
        save(model, path)
    else:
        warnings.warn(f"the calibration of {model.target} is unsteady (no two of {model.passes} "
                      "passes of its port kernels agreed: a busy neighbour core?); it is used "
                      "now but not cached", CalibrationWarning, stacklevel=4)
    return model


def save(model: MachineModel, path: Path) -> None:
    """Write atomically: a reader (another process calibrating too) sees all of it or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(model.to_json(), indent=1))
    os.replace(temporary, path)


def recalibrate(target: Target | None = None) -> MachineModel:
    """Measure `target` again and return it; a steady model replaces the cached one (an
    unsteady one warns and leaves the cache alone)."""
    target = target or Target.host()
    model = _cached_if_steady(calibrate(target), cache_path(target))
    _machine_model.cache_clear()
    return model


def describe(target: Target | None = None) -> dict[str, object]:
    """This machine's facts with `target`'s calibrated FMA peak of one core, as recorded with
    every run."""
    return {**facts(), "peak_gflops_per_core": round(machine_model(target).peak_gflops, 1)}


# ---- static facts -------------------------------------------------------------------------


def shared_levels() -> set[str]:
    """Data cache levels core 0 shares with another CPU (sysfs shared_cpu_list): L2, L3."""
    return {level.name for level in cache_levels() if level.shared and level.name != "L1i"}


def l2_geometry() -> tuple[int, int]:
    """Sets and ways of core 0's L2, from sysfs; (0, 0) where sysfs omits them (no set
    conflicts are modelled there then)."""
    for level in cache_levels():
        if level.name == "L2" and None not in (level.sets, level.ways):
            return level.sets, level.ways
    return 0, 0


def l1_geometry() -> tuple[int, int, int]:
    """Line bytes, sets and ways of core 0's L1 data cache, from sysfs."""
    for level in cache_levels():
        if level.name == "L1d" and None not in (level.line_bytes, level.sets, level.ways):
            return level.line_bytes, level.sets, level.ways
    size = cache_sizes().get("L1d", FALLBACK_CACHES["L1d"])
    return FALLBACK_LINE_BYTES, size // (FALLBACK_LINE_BYTES * FALLBACK_L1_WAYS), \
        FALLBACK_L1_WAYS


# ---- the kernels --------------------------------------------------------------------------

_CHAIN = 32  # dependent adds per iteration of the clock kernel
_LANES_OF_ISSUE = 8  # independent chains of the issue kernel, each 8 adds deep per iteration
_VECTOR_OPS = 16  # loads or stores per iteration; dependent FMAs per iteration: 8
_STREAM_UNROLL = 8


def _kernels_ir(lanes: int, accumulators: int, line: int) -> str:
    """The calibration kernels for vectors of `lanes` float32 (and half that) on a machine of
    `line`-byte cache lines."""
    bits = lanes * 32
    parts = [_clock_ir(), _issue_ir(), _fma_chain_ir(lanes), _stream_ir("stream", lanes, 4 * lanes),
             _stream_ir("walk", lanes, STRIDE_BYTES), _split_loads_ir(lanes, line)]
    for width in (lanes, lanes // 2):
        parts += [_fma_ir(width, accumulators), _moves_ir(width)]
    parts.append(f'attributes #0 = {{ "min-legal-vector-width"="{bits}" '
                 f'"prefer-vector-width"="{bits}" }}')
    return "\n\n".join(parts)


# The step of every add is a register the compiler cannot see is 1: cores since Golden Cove fold
# an add of a small immediate into the renamer, so a chain of those runs several adds a cycle.
_ONE = '  %one = call i64 asm "movq $$1, $0", "=r"()'


def _asm_add(name: str, source: str) -> str:
    return f'  {name} = call i64 asm "addq $1, $0", "=r,r,0"(i64 %one, i64 {source})'


def _loop(head: list[str], phis: list[str], body: list[str], tail: list[str]) -> list[str]:
    return [*head, "  br label %loop", "loop:", "  %i = phi i64 [0, %entry], [%i.next, %loop]",
            *phis, *body, "  %i.next = add i64 %i, 1", "  %done = icmp uge i64 %i.next, %steps",
            "  br i1 %done, label %exit, label %loop", "exit:", *tail, "}"]


def _clock_ir() -> str:
    # Inline assembly: LLVM would fold a chain of adds it could see into one.
    body = [_asm_add(f"%x{n + 1}", f"%x{n}") for n in range(_CHAIN)]
    return "\n".join(_loop(["define i64 @clock(i64 %steps) #0 {", "entry:", _ONE],
                           [f"  %x0 = phi i64 [0, %entry], [%x{_CHAIN}, %loop]"], body,
                           [f"  ret i64 %x{_CHAIN}"]))


def _issue_ir() -> str:
    chains = range(_LANES_OF_ISSUE)
    phis = [f"  %c{c}.0 = phi i64 [{c}, %entry], [%c{c}.8, %loop]" for c in chains]
    body = [_asm_add(f"%c{c}.{d + 1}", f"%c{c}.{d}") for d in range(8) for c in chains]
    total = ["  %t0 = add i64 0, %c0.8"]
    total += [f"  %t{c} = add i64 %t{c - 1}, %c{c}.8" for c in chains[1:]]
    return "\n".join(_loop(["define i64 @issue(i64 %steps) #0 {", "entry:", _ONE], phis, body,
                           [*total, f"  ret i64 %t{_LANES_OF_ISSUE - 1}"]))


def _splats(vec: str, lanes: int) -> list[str]:
    """%mv and %av: io[0] and io[1] in every lane. From memory, so LLVM cannot fold the FMAs;
    acc * 0.999999 + 1e-3 stays bounded (no overflow, no denormals)."""
    return ["  %m = load float, ptr %io", "  %ap = getelementptr float, ptr %io, i64 1",
            "  %a = load float, ptr %ap",
            f"  %mv0 = insertelement {vec} poison, float %m, i64 0",
            f"  %mv = shufflevector {vec} %mv0, {vec} poison, <{lanes} x i32> zeroinitializer",
            f"  %av0 = insertelement {vec} poison, float %a, i64 0",
            f"  %av = shufflevector {vec} %av0, {vec} poison, <{lanes} x i32> zeroinitializer"]


def _fma_ir(lanes: int, accumulators: int) -> str:
    vec, fma = f"<{lanes} x float>", f"@llvm.fma.v{lanes}f32"
    names = range(accumulators)
    phis = [f"  %acc{n} = phi {vec} [%av, %entry], [%acc{n}.next, %loop]" for n in names]
    body = [f"  %acc{n}.next = call {vec} {fma}({vec} %acc{n}, {vec} %mv, {vec} %av)"
            for n in names]
    total = [f"  %sum0 = fadd {vec} %acc0.next, %av"]
    total += [f"  %sum{n} = fadd {vec} %sum{n - 1}, %acc{n}.next" for n in names[1:]]
    tail = [*total, f"  %first = extractelement {vec} %sum{accumulators - 1}, i64 0",
            "  store float %first, ptr %io", "  ret void"]
    return "\n".join([f"declare {vec} {fma}({vec}, {vec}, {vec})", *_loop(
        [f"define void @fma{lanes}(i64 %steps, ptr noalias %io) #0 {{", "entry:",
         *_splats(vec, lanes)], phis, body, tail)])


def _fma_chain_ir(lanes: int) -> str:
    vec, fma = f"<{lanes} x float>", f"@llvm.fma.v{lanes}f32"
    body = [f"  %acc{n + 1} = call {vec} {fma}({vec} %acc{n}, {vec} %mv, {vec} %av)"
            for n in range(8)]
    tail = [f"  %first = extractelement {vec} %acc8, i64 0", "  store float %first, ptr %io",
            "  ret void"]
    return "\n".join(_loop(
        ["define void @fma_chain(i64 %steps, ptr noalias %io) #0 {", "entry:",
         *_splats(vec, lanes)], [f"  %acc0 = phi {vec} [%av, %entry], [%acc8, %loop]"], body,
        tail))


def _moves_ir(lanes: int) -> str:
    """load{lanes} and store{lanes}: volatile vector moves between registers and 16 vectors of
    an L1-resident buffer (volatile: kept although nothing uses what is loaded)."""
    vec = f"<{lanes} x float>"
    loads = [f"  %p{n} = getelementptr {vec}, ptr %buf, i64 {n}" for n in range(_VECTOR_OPS)]
    read = [f"  %v{n} = load volatile {vec}, ptr %p{n}" for n in range(_VECTOR_OPS)]
    write = [f"  store volatile {vec} zeroinitializer, ptr %p{n}" for n in range(_VECTOR_OPS)]
    return "\n\n".join(
        "\n".join(_loop([f"define void @{kind}{lanes}(i64 %steps, ptr noalias %buf) #0 {{",
                         "entry:", *loads], [], body, ["  ret void"]))
        for kind, body in (("load", read), ("store", write)))


def _split_loads_ir(lanes: int, line: int) -> str:
    """split_load(steps, buf): volatile vector loads, one per line of an L1-resident buffer,
    each starting 4 bytes before the line's end, so every one crosses into the next line (a
    row of conv2d's padded input read at q + 1 does, 15 times in 16 for a zmm)."""
    vec = f"<{lanes} x float>"
    loads = [f"  %p{n} = getelementptr i8, ptr %buf, i64 {n * line + line - 4}"
             for n in range(_VECTOR_OPS)]
    read = [f"  %v{n} = load volatile {vec}, ptr %p{n}, align 4" for n in range(_VECTOR_OPS)]
    return "\n".join(_loop(["define void @split_load(i64 %steps, ptr noalias %buf) #0 {",
                            "entry:", *loads], [], read, ["  ret void"]))


def _stream_ir(name: str, lanes: int, stride: int) -> str:
    """name(base, groups, passes, pass_step, out): `passes` times, from base + pass * pass_step,
    read `groups` x 8 vectors `stride` bytes apart, summed as integers (one cycle of latency:
    the adds never limit the loads). The stride is a constant: addresses are then immediate
    offsets, not a chain of adds that would limit the loads instead."""
    vec = f"<{lanes} x i32>"
    unroll = range(_STREAM_UNROLL)
    lines = [f"define void @{name}(ptr %base, i64 %groups, i64 %passes, i64 %pass_step, "
             "ptr noalias %out) #0 {", "entry:", "  br label %pass",
             "pass:", "  %p = phi i64 [0, %entry], [%p.next, %pass.end]"]
    lines += [f"  %a{u} = phi {vec} [zeroinitializer, %entry], [%g{u}.next, %pass.end]"
              for u in unroll]
    lines += ["  %start = mul i64 %p, %pass_step",
              "  %row = getelementptr i8, ptr %base, i64 %start",
              "  br label %group", "group:",
              "  %g = phi i64 [0, %pass], [%g.next, %group]",
              "  %at = phi ptr [%row, %pass], [%at.next, %group]"]
    lines += [f"  %g{u} = phi {vec} [%a{u}, %pass], [%g{u}.next, %group]" for u in unroll]
    for u in unroll:
        lines += [f"  %q{u} = getelementptr i8, ptr %at, i64 {stride * u}",
                  f"  %v{u} = load {vec}, ptr %q{u}, align 4",
                  f"  %g{u}.next = add {vec} %g{u}, %v{u}"]
    lines += [f"  %at.next = getelementptr i8, ptr %at, i64 {stride * _STREAM_UNROLL}",
              "  %g.next = add i64 %g, 1",
              "  %g.done = icmp uge i64 %g.next, %groups",
              "  br i1 %g.done, label %pass.end, label %group", "pass.end:",
              "  %p.next = add i64 %p, 1", "  %p.done = icmp uge i64 %p.next, %passes",
              "  br i1 %p.done, label %exit, label %pass", "exit:"]
    total = "%g0.next"
    for u in unroll[1:]:
        lines.append(f"  %s{u} = add {vec} {total}, %g{u}.next")
        total = f"%s{u}"
    lines += [f"  store {vec} {total}, ptr %out, align 4", "  ret void", "}"]
    return "\n".join(lines)


class _Kernels:
    """The compiled kernels of one target (the engine must outlive the function pointers)."""

    def __init__(self, target: Target, line: int):
        llvm.initialize_native_asmparser()  # the clock kernels are inline assembly
        self.lanes = target.vector_lanes
        # Enough independent accumulators for latency x pipes (4-5 x 2), leaving registers for
        # the two operands; 16 registers allow 12.
        self.accumulators = min(16, target.vector_registers - 4)
        module = llvm.parse_assembly(_kernels_ir(self.lanes, self.accumulators, line))
        module.triple = host()["triple"]
        module.verify()
        self.engine = llvm.create_mcjit_compiler(module, create_target_machine(3, target))
        self.engine.finalize_object()
        steps = ctypes.c_int64
        pointer = ctypes.c_void_p
        self.clock = self._get("clock", ctypes.c_int64, steps)
        self.issue = self._get("issue", ctypes.c_int64, steps)
        self.fma_chain = self._get("fma_chain", None, steps, pointer)
        self.stream = self._get("stream", None, pointer, steps, steps, steps, pointer)
        self.walk = self._get("walk", None, pointer, steps, steps, steps, pointer)
        self.fma = {w: self._get(f"fma{w}", None, steps, pointer)
                    for w in (self.lanes, self.lanes // 2)}
        self.load = {w: self._get(f"load{w}", None, steps, pointer)
                     for w in (self.lanes, self.lanes // 2)}
        self.store = {w: self._get(f"store{w}", None, steps, pointer)
                      for w in (self.lanes, self.lanes // 2)}
        self.split_load = self._get("split_load", None, steps, pointer)

    def _get(self, name: str, result: object, *args: object) -> Callable:
        return ctypes.CFUNCTYPE(result, *args)(self.engine.get_function_address(name))


# ---- timing -------------------------------------------------------------------------------


def _cpu_seconds(call: Callable[[], object]) -> float:
    """This thread's CPU time of one call: time the OS gave another process is not counted."""
    start = time.thread_time_ns()
    call()
    return (time.thread_time_ns() - start) / 1e9


def _rate(call: Callable[[int], object], seconds: float, repeats: int, *,
          fastest: bool = False) -> float:
    """Units per second of `call(n)` (n units of work): n grows until a call takes about
    `seconds`, then the median of `repeats` calls, or the fastest."""
    n = 1
    while True:
        spent = _cpu_seconds(lambda: call(n))
        if spent >= seconds / 2:
            # An interrupt is charged to the thread: one stretched call must not stop the
            # growth at an n whose call is mostly the call's own overhead.
            spent = min(spent, _cpu_seconds(lambda: call(n)))
        if spent >= seconds / 2 or n >= 1 << 40:
            break
        n *= min(1024, max(2, math.ceil(seconds / max(spent, 1e-6))))
    times = [_cpu_seconds(lambda: call(n)) for _ in range(repeats)]
    return n / max(min(times) if fastest else statistics.median(times), 1e-9)


class _Buffer:
    """A 64-byte-aligned float32 buffer, written once so its pages exist."""

    def __init__(self, nbytes: int):
        self.array = np.ones(nbytes // 4 + 16, dtype=np.float32)
        skip = (-self.array.ctypes.data) % 64
        self.address = self.array.ctypes.data + skip
        self.nbytes = nbytes


# ---- calibration --------------------------------------------------------------------------


def calibrate(target: Target | None = None, *, seconds: float = 0.002,
              repeats: int = 9) -> MachineModel:
    """Measure `target`'s model on this machine from calls of about `seconds` each: a port
    figure is the fastest of `repeats` calls in the best of its passes, any other the median of
    `repeats` calls (the defaults take one to two seconds, with the DRAM buffer's setup).
    Raises CalibrationError, in one line, if a kernel fails or a figure is impossible."""
    target = target or Target.host()
    began = time.perf_counter()
    calibrated_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_average = os.getloadavg()[0]
    target.check_runs_here()
    line, sets, ways = l1_geometry()
    try:
        kernels = _Kernels(target, line)
    except RuntimeError as err:
        first = (str(err).strip().splitlines() or ["no message"])[0]
        raise CalibrationError(f"calibration of {target}: a kernel did not compile: {first}") \
            from None
    caches = {**FALLBACK_CACHES, **cache_sizes()}
    l2_sets, l2_ways = l2_geometry()
    io = (ctypes.c_float * 2)(0.999999, 1e-3)
    scratch = _Buffer(_VECTOR_OPS * 64)
    lines = _Buffer(_VECTOR_OPS * line + line)  # split loads read past each of 16 lines

    def measured(name: str, value: float) -> float:
        low, high = BOUNDS[name]
        if not low <= value <= high or not math.isfinite(value):
            raise CalibrationError(f"calibration of {target}: {name} measured {value:.4g}, "
                                   f"outside {low:g}..{high:g}: a kernel or the clock is off")
        return value

    def port_pass() -> tuple[float, dict[str, float]]:
        """One pass: the clock and each port figure from its fastest call (so a boost shows in
        both alike), in cycles of this pass's clock. The FMA latency is cycles per FMA."""
        hz = _rate(kernels.clock, seconds, repeats, fastest=True) * _CHAIN

        def per_cycle(call: Callable[[int], object], per_step: float) -> float:
            return _rate(call, seconds, repeats, fastest=True) * per_step / hz

        full, half = kernels.lanes, kernels.lanes // 2
        figures = {
            "issue_width": per_cycle(kernels.issue, _LANES_OF_ISSUE * 8 + 2),  # + increment, branch
            "fma_per_cycle": per_cycle(lambda n: kernels.fma[full](n, io), kernels.accumulators),
            "fma_per_cycle_half": per_cycle(lambda n: kernels.fma[half](n, io),
                                            kernels.accumulators),
            "fma_latency": 1 / per_cycle(lambda n: kernels.fma_chain(n, io), 8),
            "split_loads_per_cycle": per_cycle(lambda n: kernels.split_load(n, lines.address),
                                               _VECTOR_OPS),
        }
        for kind in ("load", "store"):
            for suffix, width in (("", full), ("_half", half)):
                call = getattr(kernels, kind)[width]
                figures[f"{kind}s_per_cycle{suffix}"] = per_cycle(
                    lambda n, call=call: call(n, scratch.address), _VECTOR_OPS)
        for level in CORE_LEVELS:  # the sibling shares these too
            figures[f"bandwidth_{level}"] = streams.fastest(level) / hz
        return hz, figures

    streams = _Streams(kernels, caches, line, seconds, repeats)

    clocks, readings = [], []
    while len(readings) < MAX_PASSES and (len(readings) < PASSES or
                                          _reproduced(_usable(clocks, readings)) < 2):
        if readings:
            time.sleep(PASS_SPACING_S)
        clock, figures = port_pass()
        clocks.append(clock)
        readings.append(figures)
    hz = measured("hz", statistics.median(clocks))
    usable = _usable(clocks, readings)
    for name in readings[0]:
        if all(p[name] is None for p in usable):  # no pass read a possible figure
            measured(_BOUND_OF.get(name, name), statistics.median(p[name] for p in readings))
    figures = _best(usable)
    bandwidth, all_cores = streams.bandwidths(
        {level: figures.pop(f"bandwidth_{level}") * hz for level in CORE_LEVELS})
    bandwidth = {level: measured("bandwidth", b / hz) for level, b in bandwidth.items()}
    all_cores = {level: measured("bandwidth", b / hz) for level, b in all_cores.items()}
    strided = measured("strided_fill", streams.strided_fill())
    return MachineModel(
        target=target.spec, cpu_model=str(facts()["cpu_model"]),
        vector_lanes=target.vector_lanes, vector_registers=target.vector_registers,
        line_bytes=line, l1_sets=sets, l1_ways=ways, caches=caches, hz=hz, **figures,
        bandwidth=bandwidth, bandwidth_all_cores=all_cores, cores=streams.cores,
        strided_fill=strided, calibration_seconds=round(time.perf_counter() - began, 2),
        l2_sets=l2_sets, l2_ways=l2_ways, calibrated_at=calibrated_at,
        load_average=round(load_average, 2), passes=len(readings),
        reproduced=_reproduced(readings))


# Port figures checked against another figure's bounds.
_BOUND_OF = {"fma_per_cycle_half": "fma_per_cycle", "loads_per_cycle_half": "loads_per_cycle",
             "stores_per_cycle_half": "stores_per_cycle",
             "split_loads_per_cycle": "loads_per_cycle",
             **{f"bandwidth_{level}": "bandwidth" for level in CORE_LEVELS}}
_LOWER_IS_BETTER = {"fma_latency"}


def _usable(clocks: list[float], passes: list[dict[str, float]]) -> list[dict[str, float | None]]:
    """The passes whose figures are in cycles, each impossible figure None: a pass whose clock
    read more than CLOCK_AGREEMENT below the median was slowed while it timed the clock (each
    of its figures then reads too high), and a figure outside its bounds is a misread timer."""
    if not passes:
        return []
    floor = (1 - CLOCK_AGREEMENT) * statistics.median(clocks)

    def possible(name: str, value: float) -> bool:
        low, high = BOUNDS[_BOUND_OF.get(name, name)]
        return math.isfinite(value) and low <= value <= high

    return [{name: value if possible(name, value) else None for name, value in p.items()}
            for clock, p in zip(clocks, passes, strict=True) if clock >= floor]


def _best(passes: list[dict[str, float | None]]) -> dict[str, float]:
    """Each figure's best over the passes: contention only lowers a rate, raises a latency.
    A figure no pass read (None in each) is left out."""
    best = {}
    for name in passes[0]:
        values = [p[name] for p in passes if p[name] is not None]
        if values:
            best[name] = min(values) if name in _LOWER_IS_BETTER else max(values)
    return best


def _reproduced(passes: list[dict[str, float | None]]) -> int:
    """The fewest passes that came within AGREEMENT of a figure's best, over the figures."""
    if not passes:
        return 0
    best = _best(passes)

    def close(name: str, value: float | None) -> bool:
        if value is None:
            return False
        ratio = best[name] / value if name in _LOWER_IS_BETTER else value / best[name]
        return ratio >= 1 - AGREEMENT

    return min(sum(close(name, p[name]) for p in passes) if name in best else 0
               for name in passes[0])


class _Streams:
    """Streaming reads of buffers sized to each level, on one core and on all usable cores."""

    def __init__(self, kernels: _Kernels, caches: dict[str, int], line: int, seconds: float,
                 repeats: int):
        self.kernels, self.line, self.seconds, self.repeats = kernels, line, seconds, repeats
        self.cores = len(os.sched_getaffinity(0))
        self.shared = shared_levels() | {"DRAM"}
        self.vector_bytes = kernels.lanes * 4
        self.group_bytes = self.vector_bytes * _STREAM_UNROLL
        # Inside each level and well past the one above; DRAM: four L3s, so nothing is cached.
        self.sizes = {"L1d": caches["L1d"] // 2, "L2": caches["L2"] // 2,
                      "L3": min(4 * caches["L2"], caches["L3"] // (2 * self.cores)),
                      "DRAM": min(max(4 * caches["L3"], 64 << 20), 512 << 20)}
        self.out = np.zeros(64, dtype=np.int32)

    def fastest(self, level: str) -> float:
        """Bytes per second of one core's fastest read of a cache level."""
        return self._one(level, _Buffer(self.sizes[level]), fastest=True)

    def bandwidths(self, measured: dict[str, float]) -> tuple[dict[str, float],
                                                              dict[str, float]]:
        """Bytes per second per level: one core (as `measured` where it has the level, else
        the median of one pass), and all cores together."""
        one, every = {}, {}
        for level, size in self.sizes.items():
            buffers = [_Buffer(size) for _ in range(self.cores)] if level != "DRAM" else \
                [_Buffer(size)]
            one[level] = measured[level] if level in measured else self._one(level, buffers[0])
            if level in self.shared and self.cores > 1:
                # Together the cores get at least what one gets and at most each one's own.
                every[level] = min(max(one[level], self._all(level, buffers)),
                                   one[level] * self.cores)
            else:
                every[level] = one[level] * self.cores
            del buffers
        for upper, lower in zip(LEVELS, LEVELS[1:], strict=False):
            # A level is never faster than the one above it: a noisy figure cannot say so.
            one[lower], every[lower] = min(one[lower], one[upper]), min(every[lower],
                                                                         every[upper])
        return one, every

    def _chunks(self, level: str, buffer: _Buffer, share: int = 1) -> list[tuple[int, int]]:
        """(address, groups) of the calls that read `buffer`: the whole of it for a cache
        level; for DRAM consecutive chunks, each read long after it was last (not cached)."""
        if level != "DRAM":
            return [(buffer.address, buffer.nbytes // self.group_bytes)]
        chunk = max(self.group_bytes, buffer.nbytes // 32 // share * share)
        return [(buffer.address + k * chunk, chunk // self.group_bytes)
                for k in range(buffer.nbytes // chunk)]

    def _read(self, address: int, groups: int, passes: int) -> None:
        self.kernels.stream(address, groups, passes, 0, self.out.ctypes.data)

    def _one(self, level: str, buffer: _Buffer, fastest: bool = False) -> float:
        chunks = self._chunks(level, buffer)
        for address, groups in chunks:  # warm: cached levels load, DRAM pages are touched
            self._read(address, groups, 1)
        if level != "DRAM":
            address, groups = chunks[0]
            return _rate(lambda n: self._read(address, groups, n), self.seconds, self.repeats,
                         fastest=fastest) * groups * self.group_bytes
        turn = iter(range(1 << 62))
        times = []
        for _ in range(self.repeats):
            address, groups = chunks[next(turn) % len(chunks)]
            times.append(_cpu_seconds(lambda: self._read(address, groups, 1)))
        return chunks[0][1] * self.group_bytes / statistics.median(times)

    def _all(self, level: str, buffers: list[_Buffer]) -> float:
        """All cores at once, each on its own buffer (DRAM: its own chunks of one buffer, new
        ones each round): the sum of each core's rate in its own CPU time (wall time would
        count a neighbour's turn on a core as a slow memory)."""
        if level == "DRAM":
            chunks = self._chunks(level, buffers[0], self.cores)
            per_core = [chunks[c::self.cores] for c in range(self.cores)]
            passes, calls = 1, 4
        else:
            per_core = [self._chunks(level, b) for b in buffers]
            address, groups = per_core[0][0]
            first = _cpu_seconds(lambda: self._read(address, groups, 1))
            passes, calls = max(1, int(self.seconds / max(first, 1e-7))), 1
        rounds = []
        for round_index in range(self.repeats):
            barrier = threading.Barrier(self.cores)
            rates: list[float] = []

            def work(chunks: list[tuple[int, int]], round_index: int = round_index) -> None:
                barrier.wait()
                done, spent = 0, 0.0
                for call in range(calls):
                    address, groups = chunks[(round_index * calls + call) % len(chunks)]
                    spent += _cpu_seconds(lambda: self._read(address, groups, passes))
                    done += groups * passes * self.group_bytes
                rates.append(done / max(spent, 1e-9))

            threads = [threading.Thread(target=work, args=(c,)) for c in per_core]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rounds.append(sum(rates))
        return statistics.median(rounds)

    def strided_fill(self) -> float:
        """Cycles per line of a walk down 4 KiB columns of an L3-sized buffer (each line read a
        vector at a time, columns one line apart) over a streaming read's of the same buffer."""
        buffer = _Buffer(self.sizes["L3"])
        rows = buffer.nbytes // STRIDE_BYTES
        groups = rows // _STREAM_UNROLL
        columns = STRIDE_BYTES // self.line
        address = buffer.address

        def walk() -> None:
            self.kernels.walk(address, groups, columns, self.line, self.out.ctypes.data)

        stream_groups = buffer.nbytes // self.group_bytes
        walk()
        self._read(address, stream_groups, 1)
        streamed = statistics.median(
            _cpu_seconds(lambda: self._read(address, stream_groups, 1))
            for _ in range(self.repeats)) / (buffer.nbytes / self.line)
        strided = statistics.median(_cpu_seconds(walk) for _ in range(self.repeats)) / (
            groups * _STREAM_UNROLL * columns)
        return strided / streamed
