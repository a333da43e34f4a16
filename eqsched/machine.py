"""Facts about this machine, recorded with every measurement so timings can be compared honestly:
the CPU and LLVM's view of it, usable cores, cache geometry from sysfs, versions. Measured figures
(the FMA peak among them) belong to a target and live in `machine_model`.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm

from .backend.target import host

_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")



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
