"""Ansor's gradient rule (Zheng et al., OSDI 2020, §6): spend the next slice where the objective,
the sum over tasks of weight × best latency, is expected to fall the most.

After one warm-up round of every task (in id order), each task's expected change of the
objective per round is its weight times a blend of two estimates of how its latency moves:

- backward: what its last `window` rounds gained, per round (0 until it has that many);
- forward, optimistic: min(g - g / n, beta · FLOPs / V) - g, where g is its best latency after
  n rounds (one more round gains g / n: the less a task was tuned, the more it may gain) and V
  the best FLOP rate of any task of its signature (the same computation at another shape): a
  task far slower than a similar one is expected to catch up to 1/beta of that rate.

gradient = weight · (alpha · backward + (1 - alpha) · forward); the most negative wins, ties go
to a seeded random pick. Right after warm-up the forward term is -g for every task, so the first
choice is the task of the largest weighted latency.

See docs/ARCHITECTURE.md §21 Task scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import SchedulerError, TaskScheduler, TaskState, register


@register
class GradientScheduler(TaskScheduler):
    """The task whose next round is expected to cut the weighted latency the most."""

    name = "gradient"

    def __init__(self, seed: int = 0, *, alpha: float = 0.2, beta: float = 2.0, window: int = 3):
        super().__init__(seed)
        if not 0 <= alpha <= 1 or not beta > 0 or window < 1:
            raise SchedulerError(f"the gradient rule needs 0 <= alpha <= 1, beta > 0 and "
                                 f"window >= 1, got {alpha}, {beta}, {window}")
        self.alpha, self.beta, self.window = alpha, beta, window

    def next_task(self, tasks: Sequence[TaskState]) -> int:
        alive = [t for t in tasks if not t.done]
        unvisited = [t for t in alive if t.rounds == 0]
        if unvisited:  # the warm-up: every task once, in order
            return unvisited[0].id
        gradients = {t.id: self.gradient(t, tasks) for t in alive}
        steepest = min(gradients.values())
        ties = [i for i, g in gradients.items() if g == steepest]
        return ties[0] if len(ties) == 1 else self.random.choice(ties)

    def gradient(self, task: TaskState, tasks: Sequence[TaskState]) -> float:
        """The expected change of the objective (seconds) if `task` gets the next round."""
        g = task.best_s
        if g is None:  # no valid program yet: nothing to extrapolate from
            return 0.0
        return task.weight * (self.alpha * self.backward(task)
                              + (1 - self.alpha) * (self.forward_latency(task, tasks) - g))

    def backward(self, task: TaskState) -> float:
        """The latency change per round over its last `window` rounds (0 without them)."""
        if task.rounds <= self.window:
            return 0.0
        before = task.history[-1 - self.window]
        if before is None:
            return 0.0
        return (task.history[-1] - before) / self.window

    def forward_latency(self, task: TaskState, tasks: Sequence[TaskState]) -> float:
        """An optimistic guess at its best latency after one more round."""
        g = task.best_s
        assert g is not None
        guess = g - g / task.rounds
        rates = [t.flops / t.best_s for t in tasks
                 if t.signature == task.signature and t.best_s and t.flops > 0]
        if rates and task.flops > 0:
            guess = min(guess, self.beta * task.flops / max(rates))
        return guess
