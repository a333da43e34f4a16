"""Round-robin: every task in turn, the yardstick the gradient rule is compared with.

See docs/ARCHITECTURE.md §21 Task scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import TaskScheduler, TaskState, register


@register
class RoundRobin(TaskScheduler):
    """Tasks in id order, cycling; a task that is done is passed over."""

    name = "round-robin"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.last: int | None = None  # the id chosen last

    def next_task(self, tasks: Sequence[TaskState]) -> int:
        alive = sorted(t.id for t in tasks if not t.done)
        after = [i for i in alive if self.last is None or i > self.last]
        self.last = (after or alive)[0]
        return self.last
