"""Task schedulers: which task of a model gets the next slice of the trial budget.

A scheduler is one class with one method, `next_task(tasks)`, which reads each task's state
(`TaskState`: weight, FLOPs, similarity signature, trials and rounds so far, best latency after
each of its rounds, whether it is done) and returns the `id` of a task that is not done. The
tuning loop (`eqsched.task_tuning.tune_tasks`) gives that task a slice of trials, updates its
state and asks again; it drops tasks itself (no valid program, early stopping, nothing untried
left), so every scheduler sees the same rules. Pick one by name or pass an object:

    scheduler = get_scheduler("gradient", seed=0)     # Ansor's rule; "round-robin" to compare
    scheduler.next_task(states)                        # the id of the task to tune next

    @register
    class MostWeighted(TaskScheduler):                 # a user's scheduler: one file, one method
        name = "most-weighted"
        def next_task(self, tasks):
            return max((t for t in tasks if not t.done), key=lambda t: t.weight).id

A scheduler is deterministic given its seed: the same states in the same order give the same
choices. It imports nothing else of eqsched, so it can be tested on synthetic states.

See docs/ARCHITECTURE.md §21 Task scheduling.
"""

from .base import (
    EARLY_STOPPING,
    SCHEDULERS,
    SchedulerError,
    TaskScheduler,
    TaskState,
    get_scheduler,
    register,
)
from .gradient import GradientScheduler
from .round_robin import RoundRobin

__all__ = ["EARLY_STOPPING", "GradientScheduler", "RoundRobin", "SCHEDULERS", "SchedulerError",
           "TaskScheduler", "TaskState", "get_scheduler", "register"]
