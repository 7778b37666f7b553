"""Dense allreduce: ring, recursive doubling and Rabenseifner.

The schedules follow MPICH (``MPIR_Allreduce_intra_*``; Thakur, Rabenseifner
and Gropp, "Optimization of collective communication operations in MPICH",
IJHPCA 2005) including its handling of any P: with ``pof2`` the largest power
of two <= P and ``rem = P - pof2``, ranks below ``2 rem`` fold pairwise
(even sends its vector to odd, which adds), the ``pof2`` survivors run the
power-of-two algorithm, and the odd ranks send the result back. Costs below
are for P a power of two, n elements of w bytes, message cost alpha + m beta.

The generator functions are reusable inside other algorithms (e.g. Ok-Topk's
boundary allreduce, DEFT's value allreduce).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ops import nbytes_of
from .base import (AUTO_ALLREDUCE_RD_MAX_B, Algorithm, dense_sum, rabenseifner_messages, rd_messages, register,
                   ring_allreduce_messages)
from .steps import RABENSEIFNER, RECURSIVE_DOUBLING, RING, Schedule, Vector, expand, rounds


def ring_allreduce(ctx, buf, tag=0):
    """In-place ring allreduce of ``buf`` (any P): reduce-scatter then allgather
    over P blocks, each step sending to r+1 and receiving from r-1
    (:data:`~.steps.RING`). Cost: 2(P-1) alpha + 2 (P-1)/P n w beta."""
    return expand(ctx, RING.steps(ctx.size, ctx.rank), Vector(buf, ctx.size), tag)


def recursive_doubling_allreduce(ctx, buf, tag=0):
    """Recursive-doubling allreduce of a dense vector: log2(pof2) pairwise
    exchanges of the whole vector with the partner at distance 2^j
    (:data:`~.steps.RECURSIVE_DOUBLING`); returns the sum (``buf`` is
    reduced in place on all but folded-away ranks). Cost: log2(P)(alpha + n w beta)."""
    return expand(ctx, RECURSIVE_DOUBLING.steps(ctx.size, ctx.rank), Vector(buf, 1), tag)


def rabenseifner_allreduce(ctx, buf, tag=0):
    """In-place Rabenseifner allreduce: reduce-scatter by recursive halving
    (first partner at distance 1 exchanging n/2) then allgather by recursive
    doubling, index bookkeeping as in MPICH's reduce_scatter_allgather
    (:data:`~.steps.RABENSEIFNER`). Cost: 2 log2(P) alpha + 2 (P-1)/P n w beta."""
    return expand(ctx, RABENSEIFNER.steps(ctx.size, ctx.rank), Vector(buf, RABENSEIFNER.blocks(ctx.size)), tag)


@dataclass(frozen=True)
class DenseCollective:
    """One dense allreduce: its generator (one rank's view of ``schedule``),
    the schedule (:mod:`.steps`: the lockstep rounds read it too), and its
    message count over all ranks (exact: the schedule is fixed)."""

    run: Callable
    schedule: Schedule
    messages: Callable[[int], int]


#: by name: the ring (2(P-1) steps, each rank sending once a step: 2P(P-1) messages), recursive
#: doubling (log2(pof2) exchanges among pof2 ranks, plus the fold in and out: pof2 log2(pof2) +
#: 2 (P - pof2)) and Rabenseifner (halving, then doubling: 2 pof2 log2(pof2) + 2 (P - pof2))
DENSE = {"ring": DenseCollective(ring_allreduce, RING, ring_allreduce_messages),
         "recursive_doubling": DenseCollective(recursive_doubling_allreduce, RECURSIVE_DOUBLING, rd_messages),
         "rabenseifner": DenseCollective(rabenseifner_allreduce, RABENSEIFNER, rabenseifner_messages)}


def allreduce(ctx, buf, algorithm="auto", tag=0):
    """Dense allreduce inside another algorithm. ``auto`` follows MPICH 3.x:
    recursive doubling up to 2048 bytes, Rabenseifner above."""
    if algorithm == "auto":
        nominal = len(buf) * nbytes_of(buf[:1]) * ctx.byte_scale
        algorithm = "recursive_doubling" if nominal <= AUTO_ALLREDUCE_RD_MAX_B else "rabenseifner"
    return (yield from DENSE[algorithm].run(ctx, buf, tag))


class _DenseAllreduce(Algorithm):
    """Common part: copy the input into a working buffer (as MPI_Allreduce
    copies sendbuf into recvbuf) and reduce it in place with the class's
    :attr:`collective`."""

    dense = True
    value_free = True   # fixed schedules: every message and kernel size follows from n and P
    collective: DenseCollective = DENSE["ring"]

    def run(self, ctx, x):
        buf = yield ctx.compute("copy", x)
        return (yield from self.collective.run(ctx, buf))

    @classmethod
    def rounds(cls, P, n):
        """:meth:`run` as lockstep rounds: the copy, then the collective's rounds."""
        yield None, n, "copy"
        yield from rounds(cls.collective.schedule, P, n)

    reference = staticmethod(dense_sum)

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        return float(cls.collective.messages(P))


_SOURCE = """
    Source: Thakur, Rabenseifner and Gropp, "Optimization of collective
    communication operations in MPICH", IJHPCA 2005; the Ok-Topk paper's
    "Dense" baseline (Table 1). Non-powers of two fold as MPICH does (module
    docstring). The input is copied into a working buffer first, as
    MPI_Allreduce copies sendbuf into recvbuf."""


@register("ring")
class RingAllreduce(_DenseAllreduce):
    __doc__ = "Dense ring allreduce (reduce-scatter + allgather around a ring).\n\n    " + \
        ring_allreduce.__doc__ + _SOURCE


@register("recursive_doubling")
class RecursiveDoublingAllreduce(_DenseAllreduce):
    __doc__ = "Dense recursive-doubling allreduce (whole vector, log2 P steps).\n\n    " + \
        recursive_doubling_allreduce.__doc__ + _SOURCE
    collective = DENSE["recursive_doubling"]


@register("rabenseifner")
class RabenseifnerAllreduce(_DenseAllreduce):
    __doc__ = "Dense Rabenseifner allreduce (recursive halving + doubling), the Dense baseline.\n\n    " + \
        rabenseifner_allreduce.__doc__ + _SOURCE
    collective = DENSE["rabenseifner"]
