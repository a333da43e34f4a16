"""The task scheduler interface and registry: `TaskState`, what a scheduler reads of a task;
`TaskScheduler`, one method to implement; `register` and `get_scheduler`.

See docs/ARCHITECTURE.md §21 Task scheduling.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar


class SchedulerError(ValueError):
    """An unknown scheduler name, or a scheduler setting it cannot use."""


# Trials without a gain after which the tuning loop calls a task done, unless told otherwise:
# never, as in TVM's task scheduler: a task's best tile can come after a long stale stretch, and
# a budget given is spent (docs/ARCHITECTURE.md §21).
EARLY_STOPPING: int | None = None


@dataclass
class TaskState:
    """What a scheduler knows of one task. `history[r]` is the task's best latency in seconds
    after its round r (None while it has no valid program); `best_s` is the last of them."""

    id: int
    name: str
    weight: float
    flops: int
    signature: str  # tasks of one signature are the same computation at other shapes
    trials: int = 0
    history: list[float | None] = field(default_factory=list)
    done: str = ""  # why the task gets no more trials ("" while it may)

    @property
    def rounds(self) -> int:
        return len(self.history)

    @property
    def best_s(self) -> float | None:
        return self.history[-1] if self.history else None

    @property
    def weighted_s(self) -> float | None:
        """Its share of the objective: weight times best latency."""
        return None if self.best_s is None else self.weight * self.best_s


class TaskScheduler:
    """Chooses the task that gets the next slice of trials."""

    name: ClassVar[str] = ""

    def __init__(self, seed: int = 0):
        self.random = random.Random(seed)  # for ties only: the choices are reproducible

    def next_task(self, tasks: Sequence[TaskState]) -> int:
        """The `id` of a task that is not done (the loop asks only while one is left)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<task scheduler {self.name}>"


SCHEDULERS: dict[str, Callable[..., TaskScheduler]] = {}


def register(cls: type[TaskScheduler]) -> type[TaskScheduler]:
    """Class decorator: file the scheduler under its name; `get_scheduler(name)` makes one."""
    if not cls.name:
        raise SchedulerError(f"task scheduler {cls.__name__} has no name")
    SCHEDULERS[cls.name] = cls
    return cls


def get_scheduler(spec: str | TaskScheduler, seed: int = 0) -> TaskScheduler:
    """A fresh scheduler from a registered name (seeded), or the object itself."""
    if isinstance(spec, TaskScheduler):
        return spec
    if not isinstance(spec, str) or spec not in SCHEDULERS:
        known = ", ".join(sorted(SCHEDULERS))
        raise SchedulerError(f"unknown task scheduler {spec!r}; known: {known}")
    return SCHEDULERS[spec](seed=seed)

