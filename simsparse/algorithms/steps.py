"""A collective written once: a schedule of send-receive steps, and its readers.

In a *step* every rank sends at most one message and receives at most one,
waits for both, then folds what it received into its buffer with the step's
kernel. A schedule (:class:`Schedule`) gives its steps for one rank or for
all at once from the same function of ``(P, r)``, where ``r`` is an int or
an array of ranks (:func:`where` picks per rank): one description, read

* by :func:`expand`, one rank's ``irecv``, ``isend``, ``waitall`` and
  ``compute`` requests (the event engine and the real backend run them);
* as arrays over all ranks (:meth:`Schedule.all`): the helper collectives'
  bulk waves (:mod:`.collectives`) and the dense allreduces' lockstep rounds
  (:func:`rounds`, :mod:`simsparse.backends.fast.rounds`).

A step sends blocks ``[lo, hi)`` of the sender's buffer, less block ``skip``
(-1: none), and the receiver takes the same blocks. The buffer says what a
block is (:class:`Vector`: a slice of a dense vector; :class:`Blocks`: one
rank's payload of an allgather; :class:`Whole`: one value sent whole).

Schedules here (costs for P a power of two, n elements of w bytes, message
cost alpha + m beta; non-powers of two fold as MPICH does, :class:`Fold`):

* :data:`RING` (reduce-scatter then allgather over P blocks):
  2(P-1) alpha + 2 (P-1)/P n w beta; :data:`RING_ALLGATHER`: (P-1)(alpha + m beta);
* :data:`RECURSIVE_DOUBLING` (whole vector, partner at distance 2^j): log2(P)(alpha + n w beta);
* :data:`RABENSEIFNER` (recursive halving, then doubling; MPICH's
  ``MPIR_Allreduce_intra_reduce_scatter_allgather``): 2 log2(P) alpha + 2 (P-1)/P n w beta;
* :data:`RD_ALLGATHER` (recursive doubling, Thakur et al. 2005): log2(P) alpha + (P-1) m beta.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Any, Callable, NamedTuple

import numpy as np

from ..ops import Bundle, Dense
from .base import pof2_floor


def _same(x):
    return x


def where(cond, a, b):
    """``a`` where ``cond`` else ``b``: Python scalars for one rank, arrays for all."""
    if isinstance(cond, np.ndarray):
        return np.where(cond, a, b)
    return a if cond else b


class Step(NamedTuple):
    """One step of a rank (ints) or of every rank (arrays over ranks)."""

    phase: str | None   # the label of what it posts (None: the caller's)
    kernel: str | None  # what the receiver runs on the blocks it got (None: it takes them as they are)
    to: Any             # the destination (-1: sends nothing)
    lo: Any             # blocks sent and received: [lo, hi) less skip (-1: none), the sender's
    hi: Any
    skip: Any
    frm: Any            # the source (-1: receives nothing)
    rlo: Any            # the blocks received (the sender's lo, hi and skip)
    rhi: Any
    rskip: Any
    bundle: bool = False   # the blocks travel as one Bundle (else the single block itself)


@dataclass(frozen=True)
class Fold:
    """MPICH's reduction of P ranks to the largest power of two ``pof2``:
    the first ``2 rem`` ranks (``rem = P - pof2``) pair up, the even one
    hands its data to the odd one (:meth:`fold_in`), ``pof2`` participants
    run the power-of-two algorithm, and the odd ones hand the result back
    (:meth:`fold_out`). :meth:`newrank` and :meth:`real` map between ranks
    and participants, for one rank or for all (arrays)."""

    P: int
    pof2: int = field(init=False)
    rem: int = field(init=False)

    def __post_init__(self):   # computed once: folding steps ask for them per message
        object.__setattr__(self, "pof2", pof2_floor(self.P))
        object.__setattr__(self, "rem", self.P - self.pof2)

    def newrank(self, rank):
        """Rank among the pof2 participants, or -1 for a folded-away even rank."""
        return where(rank < 2 * self.rem, where(rank % 2 == 0, -1, rank // 2), rank - self.rem)

    def real(self, newrank):
        return where(newrank < self.rem, 2 * newrank + 1, newrank + self.rem)

    def first(self, newrank):
        """The lowest rank a participant stands for after folding (:meth:`real` is the highest)."""
        return where(newrank < self.rem, 2 * newrank, newrank + self.rem)

    def ranks_of(self, newrank: int) -> list[int]:
        """The original ranks a participant stands for after folding."""
        return list(range(self.first(newrank), self.real(newrank) + 1))

    @property
    def masks(self) -> list[int]:
        """The recursive-doubling steps: participant nr exchanges with nr ^ mask."""
        return [1 << j for j in range(self.pof2.bit_length() - 1)]

    def in_step(self, r, kernel, blocks, own=False, phase="fold") -> Step:
        """The fold in: the even ranks below ``2 rem`` send to r + 1 all
        ``blocks``, or (``own``) their own block r."""
        return self._fold(phase, r, 0, kernel, blocks, own)

    def out_step(self, r, kernel, blocks, own=False, phase="unfold") -> Step:
        """The fold out: the odd ranks below ``2 rem`` send back to r - 1 all
        ``blocks``, or (``own``) all but r - 1's own, as a Bundle."""
        return self._fold(phase, r, 1, kernel, blocks, own)

    def fold_in(self, ctx, value, wrap: Callable, combine: Callable, tag: int):
        """Generator, one rank's :meth:`in_step` on a :class:`Whole` value: an
        even rank below ``2 rem`` sends ``wrap(value)`` to r + 1, which
        returns ``yield from combine(value, received)``; any other rank
        returns ``value``."""
        return expand(ctx, [self.in_step(ctx.rank, "combine", 1, phase=None)],
                      Whole(value, wrap, _same, combine), tag)

    def fold_out(self, ctx, value, wrap: Callable, take: Callable, tag: int):
        """Generator, one rank's :meth:`out_step`: an odd rank below ``2 rem``
        sends ``wrap(value)`` back to r - 1, which returns ``yield from
        take(value, received)``."""
        return expand(ctx, [self.out_step(ctx.rank, None, 1, phase=None)], Whole(value, wrap, _same, take=take), tag)

    def _fold(self, phase, r, parity, kernel, blocks, own):
        inside = r < 2 * self.rem
        sends = inside & (r % 2 == parity)
        recvs = inside & (r % 2 != parity)
        peer = r + 1 - 2 * parity
        to, frm = where(sends, peer, -1), where(recvs, r - 1 + 2 * parity, -1)
        if not own:
            return Step(phase, kernel, to, 0, blocks, -1, frm, 0, blocks, -1)
        if parity == 0:   # a block of its own, as itself
            return Step(phase, kernel, to, r, r + 1, -1, frm, r - 1, r, -1)
        return Step(phase, kernel, to, 0, blocks, peer, frm, 0, blocks, r, bundle=True)

    def pairs(self, r, steps: Callable):
        """``steps(nr)``'s participant steps, ``(phase, kernel, partner's new
        rank, lo, hi, rlo, rhi, bundle)``, as steps of ranks ``r``
        (non-participants send and receive nothing)."""
        nr = self.newrank(r)
        inside = nr >= 0
        for phase, kernel, pnr, lo, hi, rlo, rhi, bundle in steps(nr):
            peer = where(inside, self.real(pnr), -1)
            yield Step(phase, kernel, peer, lo, hi, -1, peer, rlo, rhi, -1, bundle)


@dataclass(frozen=True)
class Schedule:
    """A collective as steps: ``steps(P, r)`` yields rank(s) ``r``'s
    :class:`Step` in order; ``blocks(P)`` is how many blocks its buffer has."""

    steps: Callable
    blocks: Callable[[int], int]

    def all(self, P: int):
        """Every rank's steps at once, as ``(step, senders, their destinations)``
        (the ranks with a message, in rank order); steps nobody sends in are left out."""
        r = np.arange(P)
        for st in self.steps(P, r):
            to = np.broadcast_to(st.to, P)
            if to.min() >= 0:   # every rank sends (a ring)
                yield st, r, to
                continue
            src = np.flatnonzero(to >= 0)
            if len(src):
                yield st, src, to[src]


def at(x, idx):
    """``x`` (a scalar or an array over ranks) at ranks ``idx``."""
    if not isinstance(x, np.ndarray):
        return np.full(len(idx), x)
    return x if len(idx) == len(x) else x[idx]   # (every rank: idx is all of them, in order)


# -- the schedules -------------------------------------------------------------------------

def _ring(P, r, offset, kernel, phase):
    """P - 1 steps round the ring: step s sends block (r + offset - s) mod P
    to r + 1 and receives block (r + offset - s - 1) mod P from r - 1."""
    to, frm = (r + 1) % P, (r - 1) % P
    for s in range(P - 1):
        i, j = (r + offset - s) % P, (r + offset - s - 1) % P
        yield Step(phase, kernel, to, i, i + 1, -1, frm, j, j + 1, -1)


def _ring_allreduce(P, r):
    yield from _ring(P, r, 0, "add_into", "reduce_scatter")
    yield from _ring(P, r, 1, "copy_into", "allgather")   # rank r holds block r + 1 reduced


def _rd_pairs(f, bundle_groups=False):
    """The recursive-doubling exchanges: whole vector (1 block), or
    (``bundle_groups``) every block of the aligned group of 2^j participants
    gathered so far, as a Bundle."""
    def steps(nr):
        for mask in f.masks:
            pnr = nr ^ mask
            if not bundle_groups:
                yield "recursive_doubling", "add_into", pnr, 0, 1, 0, 1, False
                continue
            mine, theirs = nr & ~(mask - 1), pnr & ~(mask - 1)
            yield (None, None, pnr, f.first(mine), f.real(mine + mask - 1) + 1,
                   f.first(theirs), f.real(theirs + mask - 1) + 1, True)
    return steps


def _recursive_doubling(P, r):
    f = Fold(P)
    yield f.in_step(r, "add_into", 1)
    yield from f.pairs(r, _rd_pairs(f))
    yield f.out_step(r, None, 1)   # the even rank uses the result as it arrives


def _halving_doubling(pof2):
    """Participant ``nr``'s steps of recursive halving, then doubling, with
    MPICH's index bookkeeping (``MPIR_Allreduce_intra_reduce_scatter_allgather``),
    blocks of ``pof2``; ``nr`` an int or an array."""
    def steps(nr):
        send_idx = recv_idx = nr * 0
        last_idx = pof2
        mask = 1
        while mask < pof2:
            pnr = nr ^ mask
            low, half = nr < pnr, pof2 // (mask * 2)
            send_idx = where(low, recv_idx + half, send_idx)
            recv_idx = where(low, recv_idx, send_idx + half)
            yield ("reduce_scatter", "add_into", pnr, send_idx, where(low, last_idx, recv_idx),
                   recv_idx, where(low, send_idx, last_idx), False)
            send_idx = recv_idx
            mask <<= 1
            if mask < pof2:
                last_idx = recv_idx + pof2 // mask
        mask >>= 1
        while mask > 0:
            pnr = nr ^ mask
            low, half = nr < pnr, pof2 // (mask * 2)
            if mask != pof2 // 2:
                last_idx = where(low, last_idx + half, last_idx)
            recv_idx = where(low, send_idx + half, send_idx - half)
            yield ("allgather", "copy_into", pnr, send_idx, where(low, recv_idx, last_idx),
                   recv_idx, where(low, last_idx, send_idx), False)
            send_idx = where(low, send_idx, recv_idx)
            mask >>= 1
    return steps


def _rabenseifner(P, r):
    f = Fold(P)
    yield f.in_step(r, "add_into", f.pof2)
    yield from f.pairs(r, _halving_doubling(f.pof2))
    yield f.out_step(r, "copy_into", f.pof2)


def _rd_allgather(P, r):
    f = Fold(P)
    yield f.in_step(r, None, P, own=True, phase=None)
    yield from f.pairs(r, _rd_pairs(f, bundle_groups=True))
    yield f.out_step(r, None, P, own=True, phase=None)


RING = Schedule(_ring_allreduce, lambda P: P)
RECURSIVE_DOUBLING = Schedule(_recursive_doubling, lambda P: 1)
RABENSEIFNER = Schedule(_rabenseifner, pof2_floor)
RING_ALLGATHER = Schedule(lambda P, r: _ring(P, r, 0, None, None), lambda P: P)
RD_ALLGATHER = Schedule(_rd_allgather, lambda P: P)


# -- one rank's view: its requests ---------------------------------------------------------

class Vector:
    """A dense vector of ``blocks`` balanced blocks (block i is
    ``buf[i n // blocks:(i + 1) n // blocks]``), reduced in place with the
    steps' device kernels."""

    def __init__(self, buf, blocks: int):
        self.value, self.blocks, self.n = buf, blocks, len(buf)

    def _view(self, lo, hi):
        n, b = self.n, self.blocks
        if lo == 0 and hi == b:   # the vector itself
            return self.value
        return self.value[lo * n // b:hi * n // b]

    def payload(self, st: Step):
        return Dense(self._view(st.lo, st.hi))

    def take(self, ctx, st: Step, got):
        if st.kernel is None:   # the whole vector, used as it arrives
            self.value = got.values
            return
        out = yield ctx.compute(st.kernel, self._view(st.rlo, st.rhi), got.values)
        if st.rhi - st.rlo == self.blocks:   # (in place: the same buffer)
            self.value = out


class Blocks:
    """An allgather's buffer: rank q's payload is block q; ``have`` the ones
    gathered so far."""

    def __init__(self, P: int, r: int, block):
        self.value = [None] * P
        self.value[r] = block

    @staticmethod
    def _idx(lo, hi, skip):
        return [q for q in range(lo, hi) if q != skip]

    def payload(self, st: Step):
        if st.bundle:
            return Bundle(tuple(self.value[q] for q in self._idx(st.lo, st.hi, st.skip)))
        return self.value[st.lo]

    def take(self, ctx, st: Step, got):
        if st.bundle:
            for q, part in zip(self._idx(st.rlo, st.rhi, st.rskip), got.parts):
                self.value[q] = part
        else:
            self.value[st.rlo] = got
        return
        yield  # pragma: no cover - makes this a generator


class Whole:
    """One value sent whole as ``wrap(value)``. A step with a kernel
    combines what arrives, ``value = yield from combine(value,
    unwrap(got))``; one without replaces the value by it (or by ``yield
    from take(value, unwrap(got))``)."""

    def __init__(self, value, wrap: Callable, unwrap: Callable, combine: Callable | None = None,
                 take: Callable | None = None):
        self.value, self.wrap, self.unwrap, self.combine, self._take = value, wrap, unwrap, combine, take

    def payload(self, st: Step):
        return self.wrap(self.value)

    def take(self, ctx, st: Step, got):
        got = self.unwrap(got)
        if st.kernel is not None:
            self.value = yield from self.combine(self.value, got)
        elif self._take is not None:
            self.value = yield from self._take(self.value, got)
        else:
            self.value = got


_phase = attrgetter("phase")


def expand(ctx, steps, buf, tag: int = 0):
    """Generator: rank ``ctx.rank`` runs ``steps`` (its :class:`Step`s) on
    ``buf``: each step posts its receive, then its send, waits for both and
    takes what arrived. Returns ``buf.value``."""
    for phase, run in groupby(steps, _phase):   # (a phase only labels what is posted inside it)
        with ctx.phase(phase) if phase else nullcontext():
            for st in run:
                if st.frm < 0:
                    if st.to >= 0:
                        yield ctx.waitall([ctx.isend(st.to, buf.payload(st), tag)])
                    continue
                r = ctx.irecv(st.frm, tag)
                got = yield ctx.waitall([r, ctx.isend(st.to, buf.payload(st), tag)] if st.to >= 0 else [r])
                yield from buf.take(ctx, st, got[0])
    return buf.value


# -- every rank's view: lockstep rounds ----------------------------------------------------

def rounds(schedule: Schedule, P: int, n: int):
    """A dense schedule over a vector of n elements as lockstep rounds
    (:mod:`simsparse.backends.fast.rounds`): per step, every rank's
    destination (-1: none), the elements it sends, and the receivers' kernel."""
    B = schedule.blocks(P)
    for st, src, dst in schedule.all(P):
        sent = at(st.hi, src) * n // B - at(st.lo, src) * n // B
        if len(src) == P:
            yield dst, sent, st.kernel
            continue
        to = np.full(P, -1)
        to[src] = dst
        count = np.zeros(P, dtype=np.int64)
        count[src] = sent
        yield to, count, st.kernel
