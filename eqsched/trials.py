"""How one candidate is measured: the settings of a run's measurements and the key under which a
measurement is stored and looked up in the database."""

from __future__ import annotations

from dataclasses import dataclass

from .backend import CompileOptions
from .ir import LoopKind, Program


@dataclass
class Settings:
    """How candidates are measured."""

    repeats: int = 10
    warmup: int = 1
    time_budget_s: float = 0.3  # per candidate: a slow one gets min_repeats timed runs
    min_repeats: int = 3  # one run on a shared machine can be 30% off (mm_exp_mm: 60-90 GFLOPS)
    timeout_s: float = 120.0  # per candidate: compile, check and timing together
    input_seed: int = 0
    threads: int | None = None  # for parallel loops; None: every core (1: a one-core result)

    def options(self) -> CompileOptions:
        return CompileOptions(threads=self.threads)


def measurement_key(prog: Program, settings: Settings) -> str:
    """The program hash, plus the thread count when the program has parallel loops (its time
    depends on it)."""
    if has_parallel_loops(prog):
        return f"{prog.hash()}/threads={settings.options().thread_count}"
    return prog.hash()


def has_parallel_loops(prog: Program) -> bool:
    return any(lp.kind == LoopKind.PARALLEL for lp in prog.loops())
