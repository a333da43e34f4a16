"""Compilation settings: they change the generated code, so they key the compile cache.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import BackendError
from .lower import MAX_COPIES
from .target import Target


@dataclass(frozen=True)
class CompileOptions:
    """The target, LLVM pipeline settings and the thread count for parallel loops.

    LLVM's own loop/SLP vectorizers and unroller are off by default: the schedule states which
    loops are vectorized and unrolled, and a timing should show what the schedule did, not what
    LLVM added on top of it.
    """

    opt_level: int = 3
    loop_vectorize: bool = False
    slp_vectorize: bool = False
    loop_unroll: bool = False
    body_copies: int = MAX_COPIES  # of a small innermost loop body per step (1: none; §7)
    threads: int | None = None  # None: os.cpu_count()
    target: Target = field(default_factory=Target.host)

    def __post_init__(self) -> None:
        if self.opt_level not in (0, 1, 2, 3):
            raise BackendError(f"opt_level must be 0..3, got {self.opt_level}")
        if self.body_copies < 1:
            raise BackendError(f"body_copies must be at least 1, got {self.body_copies}")
        if self.threads is not None and self.threads < 1:
            raise BackendError(f"threads must be a positive count, got {self.threads}")

    @property
    def thread_count(self) -> int:
        return self.threads or os.cpu_count() or 1
