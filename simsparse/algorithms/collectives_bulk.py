"""The helper collectives' bulk schedules: the same messages as their
``expand`` (:mod:`.collectives`), for all P ranks at once.

Each takes every rank's request and a ``run`` (the simulator's
:class:`~simsparse.backends.fast.bulk.BulkRun`: ``wave``, ``kernel``, ``size``,
``freeze``), records the schedule and returns every rank's result. A wave is
the messages the ranks post at once, each rank after its previous wave and
kernels; each then waits for its messages of the wave, as the ``waitall``
of the point-to-point schedule does. Payloads are frozen once and shared by
every receiver, as the event path shares them.
"""
from __future__ import annotations

import numpy as np

from ..compute.kernels import Work
from ..compute.sparse_kernels import COOParts
from ..ops import Scalars
from .base import pof2_floor
from .rotation_sums import reduce_in_rotation, step_sums, transposed
from .streams import DenseRange

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
    blocks = run.gathered(run.freeze(q.block) for q in reqs)
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
    kind = _scatter_split(reqs)
    if kind:
        return _alltoall_scatter(reqs, run, kind)
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
            src, dst, pos = _rotation(P, bucket)
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
                src, dst, pos = np.concatenate(src), np.concatenate(dst), np.concatenate(pos)
        if len(src):
            run.wave(src, dst, size[src, dst], pos)
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


#: (P, steps) -> the read-only src and pos of a rotation wave of that many steps
_ROTATION: dict = {}


def _rotation(P: int, bucket: range):
    """A bucket of rotation steps as one wave: step i (not 0, the block that
    stays) sends r -> (r + i) mod P for every rank r, at the place of i among
    the bucket's steps; (src, dst, pos) int32 arrays, empty when the bucket is
    step 0 only. Buckets of one length share one read-only ``src`` and
    ``pos`` (8 bytes a message less: 134 MB at P = 4096)."""
    steps = [i for i in bucket if i]
    key = (P, len(steps))
    if key not in _ROTATION:
        if len(_ROTATION) > 8:
            _ROTATION.clear()
        ranks = np.arange(P, dtype=np.int32)
        src, pos = np.tile(ranks, len(steps)), np.repeat(np.arange(len(steps), dtype=np.int32), P)
        src.setflags(write=False)
        pos.setflags(write=False)
        _ROTATION[key] = (src, pos)
    src, pos = _ROTATION[key]
    dst = (np.add.outer(np.asarray(steps, dtype=np.int64), np.arange(P)) % P).astype(np.int32).ravel()
    return src, dst, pos


#: the reductions :func:`_alltoall_scatter` evaluates on arrays, both ``acc[idx - offset] += values``
#: part by part: Ok-Topk's once per bucket (:func:`simsparse.algorithms.oktopk.scatter_add_region`),
#: TopkDSA's once per part into a dense range in place (:func:`simsparse.algorithms.streams.stream_add`)
SCATTER = "scatter_add_region"
STREAM = "stream_add"


def _scatter_split(reqs) -> str | None:
    """Which of the reductions on arrays applies (:data:`SCATTER`,
    :data:`STREAM`), or None: every rank sends one COO selection cut at the
    regions its receivers scatter-add into
    (:class:`~simsparse.compute.sparse_kernels.COOParts`, numpy, one dtype),
    with destination rotation: Ok-Topk's and TopkDSA's split and reduce."""
    q0 = reqs[0]
    red = q0.reduce
    if red is None or not q0.rotation or not isinstance(q0.blocks, COOParts):
        return None
    if red.kernel == SCATTER and not red.each and not red.kwargs:
        kind = SCATTER
    elif red.kernel == STREAM and red.each and red.kwargs == {"inplace": True}:
        kind = STREAM
    else:
        return None
    shared = q0.blocks.bounds
    bounds = np.asarray(shared, dtype=np.int64)
    for r, q in enumerate(reqs):
        b, acc = q.blocks, q.reduce.acc
        if kind == STREAM:   # a dense range of the region, written in place (stream_add's "scatter" path)
            if not (isinstance(acc, DenseRange) and q.reduce.args == (bounds[r], bounds[r + 1])
                    and acc.offset == bounds[r]):
                return None
            acc = acc.values
            if not (isinstance(acc, np.ndarray) and acc.flags.writeable):
                return None
        elif q.reduce.args != (bounds[r],):
            return None
        if not (isinstance(b, COOParts) and isinstance(b.coo.values, np.ndarray) and isinstance(acc, np.ndarray)
                and acc.dtype == b.coo.values.dtype and len(b) == len(reqs)
                and (b.bounds is shared or np.array_equal(np.asarray(b.bounds, dtype=np.int64), bounds))
                and len(acc) == bounds[r + 1] - bounds[r]):
            return None
    return kind


def _alltoall_scatter(reqs, run, kind: str = SCATTER):
    """:func:`alltoall_bulk` of split selections, on arrays: the sizes from
    the cut positions, the reductions' seconds from their work (one kernel
    per bucket, or with :data:`STREAM` one per part, in step order), and the
    reduced regions summed in the order the receivers add them (source r,
    r-1, ..., r-P+1 for region r; :mod:`.rotation_sums`), so every value is
    the event path's to the last bit. No part object is made."""
    P, q0 = run.P, reqs[0]
    parts = [q.blocks for q in reqs]
    C = np.stack([p.counts() for p in parts])   # C[s, d]: entries s sends to d
    if C.size and C.max() < 2**31:
        C = C.astype(np.int32)   # (P x P: 67 MB less at P = 4096)
    unit = np.array([p.coo.indices.itemsize + p.coo.values.itemsize for p in parts], dtype=np.int64)
    nbytes = C * unit[:, None]
    size = run.sizes(nbytes)
    buckets = q0.buckets(P)
    each = kind == STREAM   # a kernel per part (step), else per bucket
    starts = list(range(P)) if each else [b.start for b in buckets]
    nnz, nb = step_sums(C, unit, starts)   # what each rank adds per bucket (or step)
    accs = [q.reduce.acc.values if each else q.reduce.acc for q in reqs]
    isz = accs[0].itemsize
    # one kernel time per distinct (entries, bytes): unique on one int64 key, not on pairs (axis=1 sorts rows)
    m = int(nb.max()) + 1 if nb.size else 1
    key, inv = np.unique(nnz.ravel() * m + nb.ravel(), return_inverse=True)
    e_of, b_of = np.divmod(key, m)
    dts = [run.work_seconds(kind, Work(e, b + 2 * e * isz, path="scatter" if each else ""))
           for e, b in zip(e_of.tolist(), b_of.tolist())]
    dt = np.asarray(dts)[inv.reshape(-1)].reshape(P, len(starts)).T   # dt[bucket or step, rank]
    del nnz, nb, inv
    runs = [list(b) for b in buckets] if each else [[j] for j in range(len(buckets))]   # dt's rows per bucket
    overlap = q0.reduce.overlap
    for j, bucket in enumerate(buckets):
        src, dst, pos = _rotation(P, bucket)
        if len(src):
            run.wave(src, dst, size[src, dst], pos)
        if overlap and j:   # the previous bucket, while this one is in flight
            for i in runs[j - 1]:
                run.timed_all(dt[i], during=True)
        if not overlap:
            for i in runs[j]:
                run.timed_all(dt[i])
    if overlap and buckets:
        for i in runs[-1]:
            run.timed_all(dt[i])
    del nbytes, size, dt   # (P x P each, while the values are reduced: the peak of the run)
    CT = transposed(C)
    del C   # (the counts once, transposed, at that peak)
    reduce_in_rotation(reqs, CT, accs)
    return [q.reduce.acc for q in reqs]


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
            if rem:
                M[real] = fn(M[real], M[peer])
            else:   # every rank takes part: in place (M[peer] is a copy)
                fn(M, M[peer], out=M)
            mask <<= 1
        if rem:
            run.wave(od, ev, sizes[od])
            M[ev] = M[od]
    return list(M)   # (each rank's own row: no two share memory)
