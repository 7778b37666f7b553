"""What a row's ``time_s`` is: the mean cost of an iteration over whole periods
of the algorithm's periodic work, measured without running every iteration.

An algorithm declares ``periodic_work(params) = {task: period}``
(:class:`~simsparse.algorithms.base.Algorithm`; a schedule inherits its
bucket algorithm's): the task runs in iteration t when ``t % period == 0``,
t being the instance's own counter (``iteration_no``, from 0). The *kind* of
iteration t is the set of tasks due in it. The *cycle* is L = lcm(periods)
iterations (1 without periodic work), in which kind K occurs c_K times; for
Ok-Topk with tau = 32 and tau' = 64: {thresholds, boundaries} once,
{thresholds} once, {} 62 times.

Which iterations run (:meth:`Cycle.counters`): counters 0 .. warmup +
iterations - 1 in order, the warm-up ones unmeasured (they hold one-time
set-up work: the first exact thresholds, DEFT's partition); then, for each
kind of the cycle that no measured iteration had, one more iteration at the
kind's next counter. To get there every instance skips ahead
(:meth:`~simsparse.algorithms.base.Algorithm.skip_to`) and keeps the state
of the last iteration run (thresholds, boundaries, residuals), so an
iteration that reuses state finds it computed, as in training. Gradients
follow the loop's position, not the counter (``workload.grads(P, position)``).

What is reported (:meth:`Cycle.mean`): ``sum_K (c_K / L) * m_K``, with m_K the
mean of the measured iterations of kind K, in exact rational arithmetic,
rounded once. It is the mean over a whole cycle when iterations of one kind
cost the same; it is the plain mean of the measured iterations when they
are whole cycles or when there is no periodic work (so identical iterations
give exactly their time).
"""
from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction


class Cycle:
    """The kinds of iteration in one period of ``work`` ({task: period}) and their counts."""

    def __init__(self, work: dict[str, int]):
        self.work = dict(sorted(work.items()))
        #: iterations in one period of all the tasks together (1: no periodic work)
        self.length = math.lcm(*self.work.values())
        #: kind -> how many of the cycle's iterations are of that kind
        self.count = Counter(self.kind(t) for t in range(self.length))

    @classmethod
    def of(cls, point) -> "Cycle":
        """The cycle of a point's algorithm (a schedule's bucket algorithm)."""
        return cls(point.algorithm_cls.periodic_work(point.params_model()))

    def kind(self, t: int) -> frozenset:
        """The tasks due in iteration t."""
        return frozenset(task for task, p in self.work.items() if t % p == 0)

    def counters(self, warmup: int, iterations: int) -> list[int]:
        """The iteration counters to run, in order (module docstring): the
        first ``warmup`` unmeasured, every kind of the cycle measured at least once."""
        run = list(range(warmup + iterations))
        seen = {self.kind(t) for t in run[warmup:]}
        for t in range(len(run), len(run) + self.length):
            if self.kind(t) not in seen:
                seen.add(self.kind(t))
                run.append(t)
        return run

    def mean(self, counters: list[int], values: list) -> Fraction:
        """sum_K (c_K / L) * (mean of the values of kind K), exactly; ``counters``
        are the measured iterations' and must cover every kind of the cycle."""
        by_kind: dict[frozenset, list[Fraction]] = {}
        for t, v in zip(counters, values, strict=True):
            by_kind.setdefault(self.kind(t), []).append(Fraction(v.item() if hasattr(v, "item") else v))
        if set(by_kind) != set(self.count):
            raise ValueError(f"the measured iterations {counters} miss kinds of the cycle of {self.work}")
        return sum((Fraction(self.count[k], self.length) * sum(vs) / len(vs) for k, vs in by_kind.items()),
                   Fraction(0))

    def weights(self, counters: list[int]) -> list[float]:
        """Each measured iteration's weight in :meth:`mean` (they sum to 1)."""
        n = Counter(self.kind(t) for t in counters)
        return [self.count[self.kind(t)] / (self.length * n[self.kind(t)]) for t in counters]


def kinds_run(point) -> int:
    """How many kinds of iteration (:meth:`Cycle.kind`) the iterations of :func:`iterations_run` are."""
    cycle = Cycle.of(point)
    return len({cycle.kind(t) for t in cycle.counters(point.warmup, point.iterations)})


def iterations_run(point) -> int:
    """How many iterations a point simulates: warm-up and measured ones, with
    those the loop adds for the kinds of the algorithm's periodic work
    (:meth:`Cycle.counters`); its gradients are drawn at positions 0 .. this - 1."""
    return len(Cycle.of(point).counters(point.warmup, point.iterations))
