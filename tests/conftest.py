"""Shared test helpers: `within`, which fails a test that would otherwise hang,
`synthetic_machine`, a machine model of no particular CPU, `small_search`, which makes
explore's search cheap for tests about what surrounds it, and `LatencyCurve`, a synthetic task
for the task-tuning loop and its schedulers; `SMALL_MODELS`, the built-in models at small
sizes; `scaled_relu_matmul`, a reduction with a convolution's kind of epilogue."""

import signal
from contextlib import contextmanager

import pytest

import eqsched.explore as explore_module
from eqsched.expr import relu
from eqsched.extract.search import EvolutionarySearch
from eqsched.ir import Program, naive_program
from eqsched.machine_model import MachineModel
from eqsched.te import Computation, compute, placeholder, reduce_axis, sum_

# Each built-in model at sizes whose tasks compile and run in seconds: (name, get_model params).
SMALL_MODELS = [("mlp", {"inputs": 12, "hidden": 8, "outputs": 5}),
                ("bert_layer", {"seq": 8, "hidden": 16, "heads": 2, "ffn": 32}),
                ("resnet_block", {"channels": 4, "size": 6})]


def scaled_relu_matmul(m: int, n: int, k: int) -> Program:
    """relu(A @ B * s + b), naive: a reduction C, a scale-shift D to inline and the ReLU E that
    reads it (a convolution's batch norm and ReLU)."""
    A, B = placeholder((m, k), "A"), placeholder((k, n), "B")
    s, b = placeholder((n,), "s"), placeholder((n,), "b")
    r = reduce_axis(k, "k")
    C = compute((m, n), lambda i, j: sum_(A[i, r] * B[r, j], axis=r), "C")
    D = compute((m, n), lambda i, j: C[i, j] * s[j] + b[j], "D")
    E = compute((m, n), lambda i, j: relu(D[i, j]), "E")
    return naive_program(Computation("scaled_relu", [E]))


def small_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes `explore` search an eighth of the default population on one island: a round of
    the default search (192 candidates, three first-round islands of 384) took 10-20 s of a 2-trial
    run of matmul 16x32x8, for tests about the loop, the database or the report around it
    (tests/test_search.py tests the search). 24 candidates still fill every batch these tests
    measure (at most 8) from one round, as 48 did in half the time. Spaces no larger than the
    default search would rank whole are still ranked whole."""
    default = EvolutionarySearch.__init__.__kwdefaults__
    small = {"population": 24, "first_population": 24, "survivors": 6, "first_islands": 1,
             "whole_space": default["population"] * (1 + default["max_generations"])}

    def small_evolutionary_search(*args, **kwargs) -> EvolutionarySearch:
        return EvolutionarySearch(*args, **{**kwargs, **small})  # over the run's population

    monkeypatch.setattr(explore_module, "EvolutionarySearch", small_evolutionary_search)


@pytest.fixture
def within():
    """`with within(seconds):` raises TimeoutError in the block once `seconds` have passed, so
    a loop that never ends fails its test instead of stalling the suite."""

    @contextmanager
    def limit(seconds: float):
        def expire(signum, frame):
            raise TimeoutError(f"still running after {seconds} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return limit


def synthetic_machine_model() -> MachineModel:
    """Plausible figures of no particular CPU, so a test's expectations do not follow the machine
    it runs on: an AVX-512 core (16 lanes, 32 registers) at 3 GHz issuing 2 FMAs and 2 loads a
    cycle and 1 store, at full and half width; caches of 48 KiB, 1 MiB and 32 MiB; read
    bandwidths (bytes per cycle) of one core and of its 2 cores together, where L1 and L2 scale
    with cores and DRAM barely does."""
    return MachineModel(
        target="synthetic-avx512", cpu_model="synthetic", vector_lanes=16, vector_registers=32,
        line_bytes=64, l1_sets=64, l1_ways=12,
        caches={"L1d": 48 << 10, "L1i": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}, hz=3e9,
        issue_width=4.0, fma_per_cycle=2.0, fma_per_cycle_half=2.0, fma_latency=4.0,
        loads_per_cycle=2.0, loads_per_cycle_half=2.0, stores_per_cycle=1.0,
        stores_per_cycle_half=1.0, split_loads_per_cycle=1.0,
        bandwidth={"L1d": 128.0, "L2": 48.0, "L3": 16.0, "DRAM": 5.0},
        bandwidth_all_cores={"L1d": 256.0, "L2": 96.0, "L3": 28.0, "DRAM": 6.0}, cores=2,
        strided_fill=4.0, passes=4, reproduced=4)


@pytest.fixture(scope="session")
def synthetic_machine() -> MachineModel:
    """`synthetic_machine_model()`: a test changes what it needs with dataclasses.replace."""
    return synthetic_machine_model()


class LatencyCurve:
    """A synthetic task for `task_tuning.run_rounds` (a `Tunable`): its best latency after n
    trials is `latency(n)` seconds (None: no valid program yet), and its space holds `programs`
    candidates, after which a slice ends short; `failure` says why it has no valid program."""

    def __init__(self, latency, programs: int = 10**9, failure: str = ""):
        self.latency, self.programs, self.failure = latency, programs, failure
        self.trials_taken, self.exhausted, self.interrupted, self.stop_reason = 0, False, False, ""

    def tune(self, trials: int):
        got = min(trials, self.programs - self.trials_taken)
        self.trials_taken += got
        self.exhausted = got < trials
        self.stop_reason = (f"the space has {self.programs} programs; all measured"
                            if self.exhausted else "the trial budget is spent")
        return self.latency(self.trials_taken)
