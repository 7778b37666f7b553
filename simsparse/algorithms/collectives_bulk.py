"""The helper collectives' bulk schedules: the same messages as their
``expand`` (:mod:`.collectives`), for all P ranks at once.

Each takes every rank's request and a ``run`` (the simulator's
:class:`~simsparse.backends.bulk.BulkRun`: ``wave``, ``kernel``, ``size``,
``freeze``), records the schedule and returns every rank's result. A wave is
the messages the ranks post at once, each rank after its previous wave and
kernels; each then waits for its messages of the wave, as the ``waitall``
of the point-to-point schedule does. Payloads are frozen once and shared by
every receiver, as the event path shares them.
"""
from __future__ import annotations

import numpy as np

from ..ops import Scalars
from .base import pof2_floor

HOST_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _folded(P: int):
    """MPICH's fold (:class:`.collectives.Fold`) for all ranks: the even and
    odd ranks below 2 rem, and every participant's real rank."""
    pof2 = pof2_floor(P)
    rem = P - pof2
    ev = np.arange(0, 2 * rem, 2)
    nr = np.arange(pof2)
    return pof2, rem, ev, ev + 1, nr, np.where(nr < rem, 2 * nr + 1, nr + rem)


def allgather_bulk(reqs, run):
    """:class:`.collectives.Allgather`: every rank gets the P blocks in rank
    order (one tuple, shared by all ranks, as read-only as received payloads)."""
    P = run.P
    blocks = tuple(run.freeze(q.block) for q in reqs)
    sizes = np.array([run.size(b) for b in blocks], dtype=np.int64)
    r = np.arange(P)
    if reqs[0].algorithm == "ring":
        right = (r + 1) % P
        for s in range(P - 1):   # step s forwards block (r - s) mod P
            run.wave(r, right, sizes[(r - s) % P])
    elif P > 1:
        pof2, rem, ev, od, nr, real = _folded(P)
        if rem:   # the even ranks hand their block over
            run.wave(ev, od, sizes[ev])
        held = sizes[real] + np.where(nr < rem, sizes[np.minimum(2 * nr, P - 1)], 0)   # a participant's blocks
        mask = 1
        while mask < pof2:   # step j: everything of the aligned group of 2^j, to the partner at distance 2^j
            run.wave(real, real[nr ^ mask], np.repeat(held.reshape(-1, mask).sum(axis=1), mask))
            mask <<= 1
        if rem:   # the odd ranks hand back every block but their partner's
            run.wave(od, ev, sizes.sum() - sizes[ev])
    return [blocks] * P


def alltoall_bulk(reqs, run):
    """:class:`.collectives.Alltoall`: bucket by bucket, every rank posts its
    receives and sends, reduces the previous bucket (``overlap``), waits.
    The reduction kernels run per rank, as ``compute`` would run them."""
    P, q0 = run.P, reqs[0]
    blocks = [[run.freeze(b) for b in q.blocks] for q in reqs]
    size = np.array([[run.size(b) for b in row] for row in blocks], dtype=np.int64)
    ranks = np.arange(P)
    red = q0.reduce
    acc = [q.reduce.acc for q in reqs] if red else None
    got = [[None] * P for _ in range(P)]
    pending = [[] for _ in range(P)]
    for bucket in q0.buckets(P):
        src, dst, pos, srcs_of = [], [], [], [[] for _ in range(P)]
        if q0.rotation:
            for k, i in enumerate(i for i in bucket if i):
                src.append(ranks)
                dst.append((ranks + i) % P)
                pos.append(np.full(P, k))
            for r in range(P):
                srcs_of[r] = [(r - i) % P for i in bucket if i]
            local = 0 in bucket
        else:
            for k, i in enumerate(bucket):
                s = ranks[ranks != i]
                src.append(s)
                dst.append(np.full(len(s), i))
                pos.append(k - ((s >= bucket.start) & (s < i)))   # its earlier steps in the bucket, skipping itself
                srcs_of[i] = [j for j in range(P) if j != i]
        if src:
            src, dst = np.concatenate(src), np.concatenate(dst)
            run.wave(src, dst, size[src, dst], np.concatenate(pos))
        if red and red.overlap:   # the previous bucket, while this one is in flight
            for r in range(P):
                if pending[r]:
                    acc[r] = _reduce(run, r, reqs[r].reduce, acc[r], pending[r], during=True)
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
                acc[r] = _reduce(run, r, reqs[r].reduce, acc[r], pending[r])
                pending[r] = []
    if red is None:
        for r in range(P):
            got[r][r] = reqs[r].blocks[r]
        return got
    for r in range(P):
        if pending[r]:
            acc[r] = _reduce(run, r, reqs[r].reduce, acc[r], pending[r])
    return acc


def _reduce(run, r, red, acc, blocks, during=False):
    if red.each:
        for b in blocks:
            acc = run.kernel(r, red.kernel, (acc, b, *red.args), red.kwargs, during)
        return acc
    return run.kernel(r, red.kernel, (acc, blocks, *red.args), red.kwargs, during)


def allreduce_host_bulk(reqs, run):
    """:class:`.collectives.AllreduceHost`: the same fold, pairwise steps and
    unfold, reducing every rank's array in the same order (bit-identical)."""
    P = run.P
    fn = HOST_OPS[reqs[0].op]
    M = np.stack([np.asarray(q.values) for q in reqs])
    sizes = np.array([run.size(Scalars(v)) for v in M], dtype=np.int64)
    if P > 1:
        pof2, rem, ev, od, nr, real = _folded(P)
        if rem:
            run.wave(ev, od, sizes[ev])
            M[od] = fn(M[od], M[ev])
        mask = 1
        while mask < pof2:
            peer = real[nr ^ mask]
            run.wave(real, peer, sizes[real])
            M[real] = fn(M[real], M[peer])
            mask <<= 1
        if rem:
            run.wave(od, ev, sizes[od])
            M[ev] = M[od]
    return [row.copy() for row in M]
