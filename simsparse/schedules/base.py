"""A schedule: one rank's training iteration as a rank program.

The main program runs the forward pass, takes the gradient tensors as the
backward pass produces them (backward order: last registered tensor first),
and groups them into *buckets* by a *merge plan*: a tuple of group lengths in
backward order, e.g. ``(3, 1, 2)`` communicates the last three tensors
together, then the next one, then the first two. When a bucket's last
gradient is ready its tensors are packed into one buffer (the ``concat``
kernel, on the device) and the bucket's collective -- any registered
algorithm -- is spawned on the ``comm`` stream: buckets communicate one
after another (OMGS-SGD Eq. 8) while the backward pass and the next buckets'
compression go on. The iteration ends when every bucket's collective has
returned.

Every bucket keeps its own algorithm instance, so per-bucket state
(thresholds, boundaries, residuals under error feedback) survives across
iterations as it does in the papers' implementations. A schedule differs
from another only in which algorithms it accepts (exact dense allreduce or a
compressing one) and in its plan (:meth:`Schedule.plan`), a function of the
model profile and cost models (:class:`PlanCosts`; planners in
:mod:`.planner`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..algorithms import Setup
from ..registry import Registry, subclass_of


class NoScheduleParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class PlanCosts:
    """What a planner knows, in backward order (index 0: the tensor whose
    gradient is ready first): per-tensor backward time ``tb`` and size in
    elements, the sparsification time ``ts(d)`` of a buffer of d elements (0
    for dense), the communication time ``tc(d)`` of the bucket's collective,
    its startup term ``alpha``, and the forward time ``tf``."""

    tb: tuple
    sizes: tuple
    ts: Callable[[float], float]
    tc: Callable[[float], float]
    alpha: float
    tf: float = 0.0


class Schedule:
    """Base class: subclasses set ``accepts`` and implement :meth:`plan`."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = NoScheduleParams
    #: "dense" (exact dense allreduce) or "compressed" (sparse or quantized)
    accepts: ClassVar[str] = "dense"
    #: the collective of the schedule's paper: what a training config that
    #: lists no ``algorithms`` runs it with ("" for none)
    default_algorithm: ClassVar[str] = ""

    @classmethod
    def plan(cls, params: BaseModel, costs: PlanCosts) -> tuple[int, ...]:  # pragma: no cover - interface
        """Group lengths in backward order, summing to the number of tensors."""
        raise NotImplementedError

    @classmethod
    def buckets(cls, params: BaseModel, sizes: tuple) -> int:
        """How many buckets (collective calls) an iteration has, before the
        plan is resolved: exact where the plan needs no cost model, else its
        most (one a tensor). The budget's estimate reads it."""
        return len(sizes)

    @classmethod
    def needs_costs(cls) -> bool:
        """Whether :meth:`plan` reads the cost models (else they need not be built)."""
        return False

    @classmethod
    def check_algorithm(cls, algorithm_cls) -> str | None:
        """Why this schedule cannot use ``algorithm_cls``, or None."""
        if (cls.accepts == "dense") != algorithm_cls.dense:
            want = "an exact dense allreduce (ring, recursive_doubling, rabenseifner)" if cls.accepts == "dense" \
                else "a compressing (sparse or quantized) allreduce"
            return f"{cls.name} communicates with {want}, not {algorithm_cls.name}"
        return None

    def __init__(self, rank: int, P: int, sizes: tuple, density: float, dtype: str, plan: tuple,
                 algorithm_cls, algorithm_params, stack=None):
        """``sizes``: the tensors' elements in registration order (as carried:
        reduced by data_scale in the simulator); ``plan``: group lengths in
        backward order; ``stack``: the software stack's mechanisms
        (:class:`~.stack.Stack`; None: none)."""
        L = len(sizes)
        if sum(plan) != L or any(g <= 0 for g in plan):
            raise ValueError(f"merge plan {plan} does not cover the model's {L} tensors")
        offs = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.sizes, self.plan, self.n = tuple(sizes), tuple(plan), offs[-1]
        self.buckets = []  # (first tensor, end tensor) in registration order, buckets in backward order
        hi = L
        for g in plan:
            self.buckets.append((hi - g, hi))
            hi -= g
        self.spans = [(offs[lo], offs[hi]) for lo, hi in self.buckets]
        self.algorithm_cls, self.algorithm_params = algorithm_cls, algorithm_params
        self.setups = [Setup(rank=rank, P=P, n=b - a, density=density, dtype=dtype, layers=tuple(sizes[lo:hi]))
                       for (lo, hi), (a, b) in zip(self.buckets, self.spans)]
        self.algs = [algorithm_cls(s, algorithm_params) for s in self.setups]
        self.stack = stack if stack is not None and stack.active else None

    # -- the main program ------------------------------------------------------
    def run(self, ctx):
        yield ctx.forward()
        tasks = []
        for g, ((lo, hi), a) in enumerate(zip(self.buckets, self.algs)):
            parts = yield from ctx.grads_ready(lo, hi)
            if len(parts) == 1:
                buf = parts[0]
            else:
                with ctx.phase("pack"):
                    buf = yield ctx.compute("concat", parts[::-1])
            run = a.iteration if self.stack is None else partial(self.stack.collective, alg=a)
            tasks.append(ctx.spawn(lambda c, run=run, b=buf: run(c, b), stream="comm", lane=f"comm/b{g}"))
        results = yield ctx.waitall(tasks)
        if self.stack is not None:
            yield from self.stack.step(ctx, self.n)
        return results

    # -- periodic work -------------------------------------------------------------
    def periodic_work(self) -> dict[str, int]:
        """The bucket algorithm's (:meth:`~simsparse.algorithms.base.Algorithm.periodic_work`):
        every bucket's instance runs one iteration per training iteration, so
        their counters and periods are the training iteration's."""
        return self.algorithm_cls.periodic_work(self.algorithm_params)

    def skip_to(self, t: int) -> None:
        """Every bucket's instance goes on as iteration ``t``."""
        for a in self.algs:
            a.skip_to(t)

    # -- checking ----------------------------------------------------------------
    def last_inputs(self) -> list:
        """Each bucket's input to its collective in the last iteration (the
        gradient plus residual under error feedback)."""
        return [a.last_input for a in self.algs]

    def check_state(self) -> list:
        return [a.check_state() for a in self.algs]

    def assemble(self, parts: list, to_dense) -> np.ndarray:
        """One dense vector in registration order from per-bucket values."""
        out = np.zeros(self.n)
        for (a, b), part in zip(self.spans, parts):
            out[a:b] = to_dense(part, b - a)
        return out


#: the schedules by name: the package's, a dotted path, or entry points of group ``simsparse.schedules``
SCHEDULES = Registry("schedule", "simsparse.schedules", subclass_of(Schedule),
                     "a subclass of simsparse.schedules.Schedule")


#: class decorator: ``@register_schedule("name")`` registers the class under that name
register_schedule = SCHEDULES.named
#: the schedule class a name resolves to (:class:`~simsparse.registry.Registry`)
get_schedule = SCHEDULES.__getitem__
