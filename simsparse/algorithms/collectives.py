"""Helper collectives, each one request of the contract (like ``waitall``).

A rank yields the request and gets the result, ``blocks = yield
Allgather(block, "rd", tag)``. Each is one class whose schedule is written
once (a :class:`~.steps.Schedule` of send-receive steps; the alltoall's
rotation steps and buckets) and read twice: ``expand(ctx)``, one rank's
point-to-point messages, which the real backend and the simulator's event
engine run; and ``bulk(reqs, run)``, the same messages for all P ranks at
once, as waves, which the simulator's array evaluators time
(:mod:`simsparse.backends.fast.bulk`) where every rank's exit waits for
every rank's entry (allgather, alltoall, host allreduce).
Payloads are any :class:`~simsparse.ops.Payload`, so an allgather of
variable-size sparse blocks is an allgatherv. Costs in the alpha-beta model
(``m`` = bytes of one block, all blocks equal, P a power of two):

* :class:`Allgather` ``rd`` (recursive doubling, Thakur et al. 2005):
  ``log2(P) alpha + (P-1) m beta``; ``ring``: ``(P-1)(alpha + m beta)``;
* :class:`Alltoall` (rotated, bucketed; the Ok-Topk paper's split and
  reduce, section 3.1.1): ``(P-1) alpha + (sum of sent bytes) beta``;
* :class:`Bcast` (MPICH's binomial tree): ``ceil(log2 P)(alpha + m beta)``;
* :class:`AllreduceHost` (recursive doubling): ``log2(P)(alpha + m beta)``.

Non-powers of two are handled as MPICH does for allreduce (:class:`~.steps.Fold`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..compute.sparse_kernels import COOParts
from ..ops import Collective, Payload, Scalars
from .rotation_sums import alltoall_scatter, rotated, rotation, scatter_split
from .steps import RD_ALLGATHER, RECURSIVE_DOUBLING, RING_ALLGATHER, Blocks, Schedule, Whole, at, expand, where

HOST_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def send(ctx, dst, payload, tag=0):
    yield ctx.waitall([ctx.isend(dst, payload, tag)])


def recv(ctx, src, tag=0):
    (got,) = yield ctx.waitall([ctx.irecv(src, tag)])
    return got


def received(value, got):
    """A :meth:`~.steps.Fold.fold_out` ``take`` that keeps what arrived."""
    return got
    yield  # pragma: no cover - makes this a generator


def recursive_doubling(ctx, value, wrap: Callable, unwrap: Callable, combine: Callable, tag: int):
    """The recursive-doubling skeleton with MPICH folding
    (:data:`~.steps.RECURSIVE_DOUBLING`), for any payload: ``wrap(value)``
    makes the message, ``unwrap(payload)`` reads one, and ``combine(mine,
    theirs)`` is a generator returning the reduced value."""
    return expand(ctx, RECURSIVE_DOUBLING.steps(ctx.size, ctx.rank), Whole(value, wrap, unwrap, combine), tag)


# -- the requests ---------------------------------------------------------------------------

@dataclass(slots=True)
class Sendrecv(Collective):
    """Send ``payload`` to ``dst`` and receive from ``src`` concurrently; the
    result is what arrived."""

    dst: int
    payload: Payload
    src: int
    tag: int = 0

    def expand(self, ctx):
        r = ctx.irecv(self.src, self.tag)
        s = ctx.isend(self.dst, self.payload, self.tag)
        got, _ = yield ctx.waitall([r, s])
        return got


@dataclass(slots=True)
class Allgather(Collective):
    """Allgather(v) of one payload per rank by ``algorithm`` (``rd``:
    recursive doubling, every step exchanging everything gathered so far
    with the partner at distance 2^j as a :class:`~simsparse.ops.Bundle`;
    ``ring``: P - 1 steps forwarding the block received last). The result
    is the P blocks in rank order, a tuple."""

    block: Payload
    algorithm: str = "rd"
    tag: int = 0

    def __post_init__(self):
        if self.algorithm not in ("rd", "ring"):
            raise ValueError(f"allgather algorithm {self.algorithm!r}; allowed: rd, ring")

    def schedule(self) -> Schedule:
        return RD_ALLGATHER if self.algorithm == "rd" else RING_ALLGATHER

    def expand(self, ctx):
        have = yield from expand(ctx, self.schedule().steps(ctx.size, ctx.rank),
                                 Blocks(ctx.size, ctx.rank, ctx.sent_often(self.block)), self.tag)
        return tuple(have)

    @staticmethod
    def bulk(reqs, run):
        """The same schedule for all ranks at once (a :class:`~simsparse.backends.fast.bulk.BulkRun`):
        every rank gets the P blocks in rank order (one tuple, shared by all
        ranks, as read-only as received payloads)."""
        blocks = run.gathered(run.freeze(q.block) for q in reqs)
        sizes = np.array([run.size(b) for b in blocks], dtype=np.int64)
        below = np.concatenate(([0], np.cumsum(sizes)))   # the bytes of blocks [0, i)
        for st, src, dst in reqs[0].schedule().all(run.P):
            skip = at(st.skip, src)
            run.wave(src, dst, below[at(st.hi, src)] - below[at(st.lo, src)] - np.where(skip >= 0, sizes[skip], 0))
        return [blocks] * run.P


@dataclass(slots=True)
class Bcast(Collective):
    """MPICH's binomial-tree broadcast from ``root``; the other ranks pass
    ``None`` and get the payload."""

    payload: Payload | None
    root: int = 0
    tag: int = 0

    def expand(self, ctx):
        P, r, tag = ctx.size, ctx.rank, self.tag
        payload = self.payload
        rel = (r - self.root) % P
        mask = 1
        while mask < P:
            if rel & mask:
                payload = yield from recv(ctx, (r - mask) % P, tag)
                break
            mask <<= 1
        mask >>= 1
        sends = []
        while mask > 0:
            if rel + mask < P:
                sends.append(ctx.isend((r + mask) % P, payload, tag))
            mask >>= 1
        if sends:
            yield ctx.waitall(sends)
        return payload


@dataclass(frozen=True)
class Reduce:
    """What a receiver of an :class:`Alltoall` runs on the blocks it got:
    ``acc = kernel(acc, blocks, *args, **kwargs)`` once per bucket, or with
    ``each``, ``acc = kernel(acc, block, ...)`` once per block. With
    ``overlap`` the blocks of one bucket are reduced while the next bucket's
    messages are in flight (Ok-Topk section 3.1.1)."""

    kernel: str
    acc: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    each: bool = False
    overlap: bool = True


def count_blocks(parts) -> list:
    """Each destination's entry count as a block of its own (one int32) for
    an :class:`Alltoall` of the counts before a split: rows of one read-only
    array, from the split's counts where it has them (no part object is
    made: P^2 a call)."""
    counts = parts.counts() if isinstance(parts, COOParts) else [q.nnz for q in parts]
    rows = np.asarray(counts, dtype=np.int32).reshape(-1, 1)
    rows.setflags(write=False)
    return [Scalars(row) for row in rows]


@dataclass(slots=True)
class Alltoall(Collective):
    """Personalised all-to-all: ``blocks[j]`` goes to rank j (``blocks[r]``
    stays). Step i = 0 .. P-1 sends to (r+i) mod P and receives from (r-i)
    mod P (*destination rotation*, Ok-Topk Fig. 2b: every step a
    permutation); without ``rotation`` step i sends to rank i, and rank i
    receives from all (Fig. 2a). Steps run in buckets of ``bucket_size``
    (None: all at once), one waitall per bucket, receives posted before
    sends. The result is the P blocks addressed to this rank by source, or
    with ``reduce`` (:class:`Reduce`) their reduction into its ``acc``.
    Cost: (P-1) alpha + (sum of sent bytes) beta per rank."""

    blocks: list
    tag: int = 0
    rotation: bool = True
    bucket_size: int | None = None
    reduce: Reduce | None = None

    def destination(self, P: int, r, i: int):
        """Where rank(s) ``r`` send in step i (an int, or an array over ranks), -1 where a rank's
        block is its own: (r + i) mod P with rotation, else rank i."""
        if self.rotation:
            return -1 + 0 * r if i == 0 else rotated(P, r, i)
        return where(r == i, -1, i)

    def steps(self, P: int, r: int, i: int) -> tuple[list, list]:
        """Step i of rank r: (destinations, sources), self excluded; the sources are
        the ranks whose :meth:`destination` is r."""
        d = self.destination(P, r, i)
        if self.rotation:
            return ([] if d < 0 else [d]), ([] if i == 0 else [(r - i) % P])
        return ([] if d < 0 else [d]), ([j for j in range(P) if j != r] if i == r else [])

    def buckets(self, P: int) -> list[range]:
        t = P if self.bucket_size is None else max(1, int(self.bucket_size))
        return [range(start, min(P, start + t)) for start in range(0, P, t)]

    def expand(self, ctx):
        P, r, tag, red = ctx.size, ctx.rank, self.tag, self.reduce
        blocks = self.blocks
        got = [None] * P
        got[r] = blocks[r]
        acc, pending = (red.acc, []) if red else (None, None)
        for bucket in self.buckets(P):
            dsts, srcs, local = [], [], False
            for i in bucket:
                d, s = self.steps(P, r, i)
                dsts += d
                srcs += s
                local |= not d and i in (0, r)
            recvs = [ctx.irecv(s, tag) for s in srcs]
            sends = [ctx.isend(d, blocks[d], tag) for d in dsts]
            if red and red.overlap and pending:
                acc = yield from _reduce(ctx, red, acc, pending)
                pending = []
            vals = (yield ctx.waitall(recvs + sends))[:len(recvs)]
            if red is None:
                for s, v in zip(srcs, vals):
                    got[s] = v
                continue
            pending = pending + ([blocks[r]] if local else []) + vals
            if not red.overlap and pending:
                acc = yield from _reduce(ctx, red, acc, pending)
                pending = []
        if red is None:
            return got
        if pending:
            acc = yield from _reduce(ctx, red, acc, pending)
        return acc

    @staticmethod
    def bulk(reqs, run):
        """The same messages for all ranks at once: bucket by bucket, every rank
        posts its receives and sends, reduces the previous bucket
        (``overlap``), waits. The reduction kernels run per rank, as
        ``compute`` would run them; a split selection is reduced on arrays
        (:func:`~.rotation_sums.alltoall_scatter`)."""
        P, q0 = run.P, reqs[0]
        kind = scatter_split(reqs)
        if kind:
            return alltoall_scatter(reqs, run, kind)
        blocks = [[run.freeze(b) for b in q.blocks] for q in reqs]
        size = np.array([[run.size(b) for b in row] for row in blocks], dtype=np.int64)
        red = q0.reduce
        acc = [q.reduce.acc for q in reqs] if red else None
        got = [[None] * P for _ in range(P)]
        pending = [[] for _ in range(P)]
        for bucket in q0.buckets(P):
            if q0.rotation:   # (the rotated waves cached: their src and pos shared by buckets of one length)
                src, dst, pos = rotation(P, bucket)
                local = 0 in bucket
            else:
                src, dst, pos = _waves(q0, P, bucket)
            srcs_of = _senders(src, dst, P)
            if len(src):
                run.wave(src, dst, size[src, dst], pos)
            if red and red.overlap:   # the previous bucket, while this one is in flight
                for r in range(P):
                    if pending[r]:
                        acc[r] = _reduce_all(run, r, reqs[r].reduce, acc[r], pending[r], during=True)
                        pending[r] = []
            for r in range(P):
                vals = [blocks[s][r] for s in srcs_of[r]]
                if red is None:
                    for s, v in zip(srcs_of[r], vals):
                        got[r][s] = v
                    continue
                is_local = local if q0.rotation else r in bucket
                pending[r] = pending[r] + ([reqs[r].blocks[r]] if is_local else []) + vals
                if not red.overlap and pending[r]:
                    acc[r] = _reduce_all(run, r, reqs[r].reduce, acc[r], pending[r])
                    pending[r] = []
        if red is None:
            for r in range(P):
                got[r][r] = reqs[r].blocks[r]
            return got
        for r in range(P):
            if pending[r]:
                acc[r] = _reduce_all(run, r, reqs[r].reduce, acc[r], pending[r])
        return acc


def _waves(q: Alltoall, P: int, bucket: range):
    """A bucket's messages for all ranks from :meth:`Alltoall.destination`, in step order:
    (src, dst, pos), ``pos`` each sender's count of its earlier sends in the bucket."""
    ranks = np.arange(P)
    sent = np.zeros(P, dtype=np.int64)
    src, dst, pos = [], [], []
    for i in bucket:
        d = np.broadcast_to(q.destination(P, ranks, i), P)
        s = np.flatnonzero(d >= 0)
        src.append(s)
        dst.append(d[s])
        pos.append(sent[s].copy())
        sent[s] += 1
    if not src:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(src), np.concatenate(dst), np.concatenate(pos)


def _senders(src, dst, P: int) -> list:
    """Per rank: the ranks whose messages of a bucket it receives, in step order."""
    order = np.argsort(dst, kind="stable")
    cuts = np.cumsum(np.bincount(dst, minlength=P))[:-1]
    return [part.tolist() for part in np.split(np.asarray(src)[order], cuts)]


def _reduce(ctx, red: Reduce, acc, blocks):
    if red.each:
        for b in blocks:
            acc = yield ctx.compute(red.kernel, acc, b, *red.args, **red.kwargs)
        return acc
    return (yield ctx.compute(red.kernel, acc, blocks, *red.args, **red.kwargs))


def _reduce_all(run, r, red, acc, blocks, during=False):
    if red.each:
        for b in blocks:
            acc = run.kernel(r, red.kernel, (acc, b, *red.args), red.kwargs, during)
        return acc
    return run.kernel(r, red.kernel, (acc, blocks, *red.args), red.kwargs, during)


def _values(p):
    return p.values


@dataclass(slots=True)
class AllreduceHost(Collective):
    """Recursive-doubling allreduce of small host metadata (a numpy array,
    sent as :class:`~simsparse.ops.Scalars`), e.g. Ok-Topk's region
    boundaries or a histogram. The reduction is host numpy (``op``: sum, max
    or min), not a device kernel. Cost: log2(P)(alpha + m beta)."""

    values: Any
    op: str = "sum"
    tag: int = 0

    def expand(self, ctx):
        fn = HOST_OPS[self.op]

        def combine(mine, theirs):
            return fn(mine, theirs)
            yield  # pragma: no cover - makes this a generator

        return recursive_doubling(ctx, np.asarray(self.values), Scalars, _values, combine, self.tag)

    @staticmethod
    def bulk(reqs, run):
        """The same schedule for all ranks at once, reducing every rank's
        array in the same order (bit-identical). Integer and boolean arrays,
        where the order cannot show (a sum wraps alike in any order; max and
        min never depend on it), end with the one reduction of all rows on
        every rank, computed once: Ok-Topk's 4,095 boundaries at P = 4096
        took 2.9 s as 12 steps of P x P copies."""
        fn = HOST_OPS[reqs[0].op]
        M = np.stack([np.asarray(q.values) for q in reqs])
        sizes = np.full(run.P, run.size(Scalars(M[0])), dtype=np.int64)   # (every row: one shape and dtype)
        whole = M.dtype.kind in "biu"   # (integer sums wrap alike in any order; max and min never depend on it)
        for st, src, dst in RECURSIVE_DOUBLING.all(run.P):
            run.wave(src, dst, sizes[src])
            if not whole:
                M[dst] = M[src] if st.kernel is None else fn(M[dst], M[src])   # (M[src] is a copy)
        if whole:
            M[:] = fn.reduce(M, axis=0, dtype=M.dtype)
        return list(M)   # (each rank's own row: no two share memory)
