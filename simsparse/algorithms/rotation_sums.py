"""Sums in rotation order for Ok-Topk's split and reduce in bulk, compiled.

Ok-Topk's split and reduce (Li and Hoefler, PPoPP'22, Sec. 3.2) is an
alltoall with destination rotation: at step i rank s sends its block for
region (s + i) mod P, so region r receives from sources r, r - 1, ...,
r - P + 1 (mod P), in that order, and adds each block into its region.
``Alltoall.bulk`` (:mod:`.collectives`) needs two things over all P^2
blocks, and records the split and reduce itself (:func:`alltoall_scatter`):

* :func:`step_sums`: per receiver and per bucket of steps, the entries and
  bytes it receives (the size of its reduction kernels);
* :func:`reduce_in_rotation`: every region's values, summed in the order
  its owner receives them, so every float is the event path's to the last
  bit.

Each has a numpy path (the reference, inside ``jit.python``) and a
compiled loop that gives the same integers and the same floats (the same
additions in the same order): at P = 4096 the numpy paths took about 4 s a
split and reduce, rolling P columns and scattering 42 M entries into place
before one ``np.add.at``; the loops read each block where it lies, region
by region (both read C transposed: :func:`transposed`).
"""
from __future__ import annotations

import numpy as np

from .. import jit
from ..compute.kernels import Work
from ..compute.sparse_kernels import COOParts
from .streams import DenseRange


def transposed(C: np.ndarray) -> np.ndarray:
    """C.T as a new C-ordered array: row r holds what each source sends r
    (:func:`step_sums` and :func:`reduce_in_rotation` read a receiver's
    column as a row), tile by tile where compiled."""
    if not (jit.enabled() and _TRANSPOSED is not None):
        return np.ascontiguousarray(C.T)
    return _TRANSPOSED(C, np.empty((C.shape[1], C.shape[0]), dtype=C.dtype))


def step_sums(C: np.ndarray, unit: np.ndarray, starts) -> tuple[np.ndarray, np.ndarray]:
    """(entries, bytes), each [receiver, bucket] int64: what receiver r gets
    at the steps of bucket j (steps starts[j] .. starts[j + 1] - 1; source
    (r - i) mod P at step i), from ``C[s, d]`` (entries s sends d) and
    ``unit[s]`` (bytes per entry of source s)."""
    starts = np.asarray(starts, dtype=np.int64)
    if jit.enabled() and _STEP_SUMS is not None:
        bucket = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(C))))
        return _STEP_SUMS(transposed(C), unit.astype(np.int64), bucket, len(starts))
    nbytes = C.astype(np.int64) * unit[:, None]
    return (np.add.reduceat(_by_step(C.astype(np.int64)), starts, axis=1),
            np.add.reduceat(_by_step(nbytes), starts, axis=1))


def _by_step(M: np.ndarray) -> np.ndarray:
    """B[r, i] = M[(r - i) mod P, r]: what rank r gets at rotation step i."""
    out = np.empty_like(M)
    for r, col in enumerate(M.T):
        out[r] = np.roll(col[::-1], r + 1)
    return out


def _transposed(C, out):
    """C.T into ``out``, tile by tile (numpy's copy of a P x P transpose took 0.35 s at P = 4096)."""
    n, m = C.shape
    for a in range(0, n, 64):
        for b in range(0, m, 64):
            for i in range(a, min(a + 64, n)):
                for j in range(b, min(b + 64, m)):
                    out[j, i] = C[i, j]
    return out


def _step_sums(CT, unit, bucket, J):
    """:func:`step_sums` as one loop: CT = C transposed (row r: what each source sends r)."""
    P = CT.shape[0]
    nnz = np.zeros((P, J), dtype=np.int64)
    nb = np.zeros((P, J), dtype=np.int64)
    for r in range(P):
        for i in range(P):
            s = r - i
            if s < 0:
                s += P
            c = np.int64(CT[r, s])
            j = bucket[i]
            nnz[r, j] += c
            nb[r, j] += c * unit[s]
    return nnz, nb


def reduce_in_rotation(reqs, CT: np.ndarray, accs: list | None = None) -> list:
    """Every rank's region (``accs[r]``, default its request's ``reduce.acc``,
    updated in place) plus the blocks the sources cut for it (``reqs[s].blocks``, a
    :class:`~simsparse.compute.sparse_kernels.COOParts`; ``CT[d, s]``
    entries for region d, the counts :func:`transposed`), added in receiving
    order: step, then source, then index (region by region:
    :func:`_reduce_flat`)."""
    bounds = np.asarray(reqs[0].blocks.bounds, dtype=np.int64)
    accs = [q.reduce.acc for q in reqs] if accs is None else accs
    coos = [q.blocks.coo for q in reqs]
    first = np.array([int(q.blocks.cuts[0]) for q in reqs], dtype=np.int64)
    if jit.enabled() and _REDUCE_FLAT is not None:
        total = int(CT.sum())
        if total >= LIST_FROM * len(reqs) ** 2 and total >= LIST_MIN_TOTAL and _same_types(accs) \
                and _same_types([c.indices for c in coos]) and _same_types([c.values for c in coos]):
            _REDUCE_LISTS(_typed(accs), _typed([c.indices for c in coos]), _typed([c.values for c in coos]),
                          CT, first, bounds)
            return accs
        out = np.concatenate(accs)   # the regions side by side, from bounds[0]
        base = np.zeros(len(reqs), dtype=np.int64)
        base[1:] = np.cumsum([len(c.indices) for c in coos])[:-1]
        _REDUCE_FLAT(out, np.concatenate([c.indices for c in coos]), np.concatenate([c.values for c in coos]),
                     CT, base + first, bounds[0])
    else:
        out = np.concatenate(accs)
        _reduce_numpy(reqs, CT.T, out, bounds[0])
    for r, acc in enumerate(accs):
        acc[:] = out[bounds[r] - bounds[0]:bounds[r + 1] - bounds[0]]
    return accs


#: blocks of at least this many entries on average are read where they lie (:func:`_reduce_lists`),
#: smaller ones copied side by side first (:func:`_reduce_flat`): a typed list's item costs more
#: than copying a few entries (Ok-Topk 1M at P = 4096, 2.5 entries a block: 47 to 54 s a run with
#: the copy, 64 to 70 s without), and copying 137 M entries (BERT at P = 1024, 130 a block) cost
#: 3 s a call, mostly in the new memory's first touch
LIST_FROM = 32
#: ... and only where the blocks hold this many entries in all: numba compiles a typed list's methods
#: in every process (not cached on disk; 0.8 s here), the time a copy of some 36 M entries takes
LIST_MIN_TOTAL = 32_000_000


def _same_types(arrays) -> bool:
    return len({(a.dtype.str, a.ndim, a.flags.c_contiguous) for a in arrays}) == 1


def _typed(arrays):
    """The arrays as a numba typed list (read in place, not copied)."""
    out = jit.numba().typed.List()
    for a in arrays:
        out.append(a)
    return out


@jit.jitable
def _next_block(CT, cur, r, i):
    """Region r's block at step i: its source s = (r - i) mod P and the
    entries [start, end) of s's blocks it spans; s's cursor moves past them."""
    s = r - i
    if s < 0:
        s += CT.shape[0]
    start = cur[s]
    cur[s] = start + CT[r, s]
    return s, start, cur[s]


def _reduce_flat(out, idx, val, CT, first, offset):
    """out[i - offset] += v for every entry (i, v), region by region: region r
    gets the blocks of sources r, r - 1, ..., r - P + 1 (mod P) in that
    order, the order its owner receives them (at step i source s adds its
    block for region (s + i) mod P), so each index gets its additions in
    receiving order. Source s's blocks lie one after another from first[s]
    in ``idx`` and ``val``, ``CT[d, s]`` entries for region d; a cursor per
    source walks them (:func:`_next_block`). A region stays in cache while
    its P blocks are added (step by step, a step wrote into P regions spread
    over the whole vector: 2.4x slower at P = 4096 and 2.6x at BERT's P = 1024)."""
    P = CT.shape[0]
    cur = first.copy()
    for r in range(P):
        for i in range(P):
            _, start, end = _next_block(CT, cur, r, i)
            for e in range(start, end):
                out[idx[e] - offset] += val[e]


def _reduce_lists(accs, idxs, vals, CT, first, bounds):
    """:func:`_reduce_flat` reading source s's entries in ``idxs[s]`` and
    ``vals[s]`` (from first[s]) and adding into ``accs[r]`` (region r, from
    bounds[r]) where they lie: no copy."""
    cur = first.copy()
    for r in range(CT.shape[0]):
        acc, lo = accs[r], bounds[r]
        for i in range(CT.shape[0]):
            s, start, end = _next_block(CT, cur, r, i)
            ix, vs = idxs[s], vals[s]
            for e in range(start, end):
                acc[ix[e] - lo] += vs[e]


def _reduce_numpy(reqs, C, out, offset) -> None:
    """The same sums by one ``np.add.at`` over all entries in receiving order
    (within a step no two sources reach one index, so only the order across
    steps decides the sums). The entries are placed by a counting sort,
    source by source: no sort keys or permutation over all P k entries."""
    P = len(reqs)
    total = int(C.sum())
    ix = np.int32 if total < 2**31 else np.int64   # (two P x P arrays: 134 MB less at P = 4096)
    D = np.empty(C.shape, dtype=ix)   # D[s, i] = C[s, (s + i) mod P]: what source s sends at step i
    for s in range(P):
        D[s] = np.roll(C[s], -s)
    # where the block of source s at step i starts: after every earlier step, then the sources before s
    per_step = D.sum(axis=0, dtype=np.int64)
    start = np.cumsum(D, axis=0, dtype=ix)
    start -= D
    start += (np.cumsum(per_step) - per_step).astype(ix)[None, :]
    del D
    p0 = reqs[0].blocks.coo
    idx = np.empty(total, dtype=p0.indices.dtype)
    val = np.empty(total, dtype=p0.values.dtype)
    steps = np.arange(P)
    for s, q in enumerate(reqs):
        p = q.blocks
        cuts = np.asarray(p.cuts, dtype=np.int64)
        a, b = int(cuts[0]), int(cuts[-1])
        if a == b:
            continue
        # the block for owner d goes to start[s, (d - s) mod P], its entries in order
        shift = start[s, (steps - s) % P] - cuts[:-1]
        dest = np.repeat(shift, C[s]) + np.arange(a, b)
        idx[dest] = p.coo.indices[a:b]
        val[dest] = p.coo.values[a:b]
    del start
    np.add.at(out, idx - offset if offset else idx, val)


_STEP_SUMS = jit.njit(_step_sums)
_TRANSPOSED = jit.njit(_transposed)
_REDUCE_FLAT = jit.njit(_reduce_flat)
_REDUCE_LISTS = jit.njit(_reduce_lists)


# -- the split and reduce recorded on arrays (Alltoall.bulk) ---------------------------------------------

#: (P, steps) -> the read-only src and pos of a rotation wave of that many steps
_ROTATION: dict = {}


def rotated(P: int, r, i):
    """Where rank(s) ``r`` send in rotation step ``i`` (Ok-Topk Fig. 2b): (r + i) mod P.
    ``r`` and ``i`` are ints or numpy arrays that broadcast."""
    return (r + i) % P


def rotation(P: int, bucket: range):
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
    dst = rotated(P, np.arange(P)[None, :], np.asarray(steps, dtype=np.int64)[:, None]).astype(np.int32).ravel()
    return src, dst, pos


#: the reductions :func:`alltoall_scatter` evaluates on arrays, both ``acc[idx - offset] += values``
#: part by part: Ok-Topk's once per bucket (:func:`simsparse.algorithms.oktopk.scatter_add_region`),
#: TopkDSA's once per part into a dense range in place (:func:`simsparse.algorithms.streams.stream_add`)
SCATTER = "scatter_add_region"
STREAM = "stream_add"


def scatter_split(reqs) -> str | None:
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


def alltoall_scatter(reqs, run, kind: str = SCATTER):
    """``Alltoall.bulk`` of split selections, on arrays: the sizes from
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
        src, dst, pos = rotation(P, bucket)
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


