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

import numpy as np

from ..ops import Dense, nbytes_of
from .base import (AUTO_ALLREDUCE_RD_MAX_B, Algorithm, dense_sum, rabenseifner_messages, rd_messages, register,
                   ring_allreduce_messages)
from .collectives import Fold, recursive_doubling


def _bounds(n: int, parts: int) -> list[int]:
    """Balanced block boundaries: block i is [b[i], b[i+1])."""
    return [(i * n) // parts for i in range(parts + 1)]


def _add_into(ctx):
    def add(buf, got):
        return (yield ctx.compute("add_into", buf, got.values))
    return add


def _copy_into(ctx):
    def copy(buf, got):
        return (yield ctx.compute("copy_into", buf, got.values))
    return copy


def _ring_step(P, r, s):
    """Step ``s`` (0 .. 2P-3) of the ring for rank ``r`` (an int, or an array
    of ranks): (block sent to r+1, block received from r-1, kernel applied to
    the received block). Steps 0 .. P-2 reduce-scatter, the rest allgather;
    block i is ``buf[i n // P:(i + 1) n // P]``."""
    if s < P - 1:
        return (r - s) % P, (r - s - 1) % P, "add_into"
    s -= P - 1
    return (r + 1 - s) % P, (r - s) % P, "copy_into"


def ring_allreduce(ctx, buf, tag=0):
    """In-place ring allreduce of ``buf`` (any P): reduce-scatter then allgather
    over P blocks, each step sending to r+1 and receiving from r-1.
    Cost: 2(P-1) alpha + 2 (P-1)/P n w beta."""
    P, r = ctx.size, ctx.rank
    if P == 1:
        return buf
    n = len(buf)   # block bounds computed inline: no list of P + 1 per rank
    right, left = (r + 1) % P, (r - 1) % P
    for name, steps in (("reduce_scatter", range(P - 1)), ("allgather", range(P - 1, 2 * (P - 1)))):
        with ctx.phase(name):
            for s in steps:
                i, j, kernel = _ring_step(P, r, s)
                # sendrecv, inlined (no generator per step)
                got, _ = yield ctx.waitall([ctx.irecv(left, tag),
                                            ctx.isend(right, Dense(buf[i * n // P:(i + 1) * n // P]), tag)])
                yield ctx.compute(kernel, buf[j * n // P:(j + 1) * n // P], got.values)
    return buf


def ring_rounds(P, n):
    """:func:`ring_allreduce` as lockstep rounds (:mod:`simsparse.backends.fast.rounds`):
    for each step, every rank's destination and the elements it sends."""
    ranks = np.arange(P)
    dst = (ranks + 1) % P
    for s in range(2 * (P - 1)):
        i, _, kernel = _ring_step(P, ranks, s)
        yield dst, (i + 1) * n // P - i * n // P, kernel


def recursive_doubling_allreduce(ctx, buf, tag=0):
    """Recursive-doubling allreduce of a dense vector: log2(pof2) pairwise
    exchanges of the whole vector with the partner at distance 2^j; returns
    the sum (``buf`` is reduced in place on all but folded-away ranks).
    Cost: log2(P)(alpha + n w beta)."""

    def add(mine, theirs):
        return (yield ctx.compute("add_into", mine, theirs))

    return (yield from recursive_doubling(ctx, buf, Dense, _values, add, tag))


def _values(p):
    return p.values


def _rabenseifner_steps(pof2, nr):
    """Participant ``nr``'s steps of recursive halving, then doubling, with
    MPICH's index bookkeeping (``MPIR_Allreduce_intra_reduce_scatter_allgather``):
    (phase, partner's new rank, blocks sent [s_lo, s_hi), blocks received
    [r_lo, r_hi), kernel applied to them), blocks of ``pof2``."""
    send_idx = recv_idx = 0
    last_idx = pof2
    mask = 1
    while mask < pof2:
        newdst = nr ^ mask
        if nr < newdst:
            send_idx = recv_idx + pof2 // (mask * 2)
            yield "reduce_scatter", newdst, send_idx, last_idx, recv_idx, send_idx, "add_into"
        else:
            recv_idx = send_idx + pof2 // (mask * 2)
            yield "reduce_scatter", newdst, send_idx, recv_idx, recv_idx, last_idx, "add_into"
        send_idx = recv_idx
        mask <<= 1
        if mask < pof2:
            last_idx = recv_idx + pof2 // mask
    mask >>= 1
    while mask > 0:
        newdst = nr ^ mask
        if nr < newdst:
            if mask != pof2 // 2:
                last_idx = last_idx + pof2 // (mask * 2)
            recv_idx = send_idx + pof2 // (mask * 2)
            yield "allgather", newdst, send_idx, recv_idx, recv_idx, last_idx, "copy_into"
        else:
            recv_idx = send_idx - pof2 // (mask * 2)
            yield "allgather", newdst, send_idx, last_idx, recv_idx, send_idx, "copy_into"
        if nr > newdst:
            send_idx = recv_idx
        mask >>= 1


def rabenseifner_allreduce(ctx, buf, tag=0):
    """In-place Rabenseifner allreduce: reduce-scatter by recursive halving
    (first partner at distance 1 exchanging n/2) then allgather by recursive
    doubling, index bookkeeping as in MPICH's reduce_scatter_allgather.
    Cost: 2 log2(P) alpha + 2 (P-1)/P n w beta."""
    f = Fold(ctx.size)
    with ctx.phase("fold"):
        yield from f.fold_in(ctx, buf, Dense, _add_into(ctx), tag)
    nr = f.newrank(ctx.rank)
    if nr >= 0 and f.pof2 > 1:
        b = _bounds(len(buf), f.pof2)
        for phase, newdst, s_lo, s_hi, r_lo, r_hi, kernel in _rabenseifner_steps(f.pof2, nr):
            with ctx.phase(phase):
                dst = f.real(newdst)
                # Sendrecv, inlined as in the ring (no generator per step)
                got, _ = yield ctx.waitall([ctx.irecv(dst, tag), ctx.isend(dst, Dense(buf[b[s_lo]:b[s_hi]]), tag)])
                yield ctx.compute(kernel, buf[b[r_lo]:b[r_hi]], got.values)
    with ctx.phase("unfold"):
        yield from f.fold_out(ctx, buf, Dense, _copy_into(ctx), tag)
    return buf


# -- the same schedules as lockstep rounds (simsparse.backends.fast.rounds) ------------------------

def _folded(P, n, masks, pair_steps, unfold_kernel):
    """Rounds of a folded schedule (:meth:`Fold.waves` over ``masks(fold)``):
    the fold (even ranks below 2 rem send all n to r + 1, which adds), one
    round per mask with ``pair_steps(fold)``'s (elements per participant,
    kernel), the unfold (odd ranks return the result, which their partner
    takes with ``unfold_kernel``, None: as it is)."""
    f = Fold(P)
    pairs = pair_steps(f)
    for step, src, dst in f.waves(masks(f)):
        to = np.full(P, -1)
        to[src] = dst
        count = np.zeros(P, dtype=np.int64)
        if step == "fold" or step == "unfold":
            count[src] = n
            kernel = "add_into" if step == "fold" else unfold_kernel
        else:
            count[src], kernel = next(pairs)
        yield to, count, kernel


def recursive_doubling_rounds(P, n):
    """:func:`recursive_doubling_allreduce` as lockstep rounds."""
    def steps(f):
        for _ in f.masks:
            yield n, "add_into"
    return _folded(P, n, lambda f: f.masks, steps, None)   # the unfolded value is used as it arrives (no kernel)


def rabenseifner_rounds(P, n):
    """:func:`rabenseifner_allreduce` as lockstep rounds, from the same
    :func:`_rabenseifner_steps` (P log P steps of plain Python, once)."""
    def masks(f):   # participant 0's partners: the masks, halving then doubling
        return [st[1] for st in _rabenseifner_steps(f.pof2, 0)]

    def steps(f):
        b = np.array(_bounds(n, f.pof2))
        per = np.array([[st[2:4] for st in _rabenseifner_steps(f.pof2, nr)] for nr in range(f.pof2)])
        for k, st in enumerate(_rabenseifner_steps(f.pof2, 0)):
            s_lo, s_hi = per[:, k].T
            yield b[s_hi] - b[s_lo], st[-1]   # (the kernel: the same on every participant)
    return _folded(P, n, masks, steps, "copy_into")   # Fold.fold_out


@dataclass(frozen=True)
class DenseCollective:
    """One dense allreduce schedule: its generator (one rank's messages and
    kernels), the same schedule as lockstep rounds, and its message count
    over all ranks (exact: the schedule is fixed)."""

    run: Callable
    rounds: Callable
    messages: Callable[[int], int]


#: by name: the ring (2(P-1) steps, each rank sending once a step: 2P(P-1) messages), recursive
#: doubling (log2(pof2) exchanges among pof2 ranks, plus the fold in and out: pof2 log2(pof2) +
#: 2 (P - pof2)) and Rabenseifner (halving, then doubling: 2 pof2 log2(pof2) + 2 (P - pof2))
DENSE = {"ring": DenseCollective(ring_allreduce, ring_rounds, ring_allreduce_messages),
         "recursive_doubling": DenseCollective(recursive_doubling_allreduce, recursive_doubling_rounds, rd_messages),
         "rabenseifner": DenseCollective(rabenseifner_allreduce, rabenseifner_rounds, rabenseifner_messages)}


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
        yield from cls.collective.rounds(P, n)

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
