"""Kernels on sparse (COO) vectors and thresholds, shared by the sparse
allreduce family. Conventions as in :mod:`.kernels`: COO indices are int32
(int64 beyond 2^31), unique and ascending; selection is by magnitude with
``|x| >= threshold`` (so the exact k-th largest magnitude selects k values);
scalar results (thresholds, counts) are Python numbers.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..jit import njit
from ..ops import COO
from .kernels import Work, _isz, kernel


def _idx_dtype(n):
    return np.int32 if n < 2**31 else np.int64


def _tidx(n):
    import torch

    return torch.int32 if n < 2**31 else torch.int64


def _nnz_bytes(parts) -> int:
    return sum(int(p.nbytes) for p in parts)


# -- compiled passes (sampled vectors use them too: :mod:`.sampled`) ---------

def count_at_least(x, thr) -> int:
    """How many |x| >= thr, compared in the type numpy compares them in (a
    Python float: x's dtype); one compiled pass without the |x| and mask
    temporaries where x is a long float vector."""
    if _COUNT is not None and type(x) is np.ndarray and x.ndim == 1 and x.dtype.kind == "f" and len(x) >= 4096:
        return int(_COUNT(x, np.result_type(x, thr).type(thr)))
    return int(np.count_nonzero(np.abs(x) >= thr))


def _count_at_least(x, t):
    """How many |x[i]| >= t."""
    c = 0
    for i in range(x.shape[0]):
        if abs(x[i]) >= t:
            c += 1
    return c


_COUNT = njit(_count_at_least)


def _locate(a, q, pos, found):
    """For ascending ``q`` in ascending ``a``: ``np.searchsorted(a, q)`` into
    ``pos`` and whether ``a`` holds each into ``found``, in one merge pass."""
    j, n = 0, a.shape[0]
    for i in range(q.shape[0]):
        x = q[i]
        while j < n and a[j] < x:
            j += 1
        pos[i] = j
        found[i] = j < n and a[j] == x


_LOCATE = njit(_locate)


# -- thresholds ---------------------------------------------------------------

@kernel("kth_abs", work=lambda out, x, k: Work(len(x), len(x) * _isz(x), select=min(max(int(k), 1), len(x))),
        memo=True)
def kth_abs(x, k):
    """The exact k-th largest |x| (the threshold that selects the top k)."""
    n = len(x)
    k = min(max(int(k), 1), n)
    return float(np.partition(np.abs(x), n - k)[n - k])


@kth_abs.torch
def _kth_abs_torch(x, k):
    import torch

    k = min(max(int(k), 1), len(x))
    return float(torch.topk(x.abs(), k, sorted=False).values.min().item())


@kernel("count_above", work=lambda out, x, thr: Work(len(x), len(x) * _isz(x)))
def count_above(x, thr):
    """How many |x| >= thr."""
    return count_at_least(x, thr)   # (no |x| and mask temporaries: 5.3 MB each for BERT at data_scale 0.01)


@count_above.torch
def _count_above_torch(x, thr):
    return int((x.abs() >= thr).sum().item())


def _select_work(out, x, thr):
    return Work(len(x), len(x) * _isz(x) + out.nbytes, select=out.nnz)


@kernel("threshold_select", work=_select_work)
def threshold_select(x, thr):
    """COO of the entries of dense x with |x| >= thr."""
    idx = np.flatnonzero(np.abs(x) >= thr).astype(_idx_dtype(len(x)))
    return COO(idx, x[idx], len(x))


@threshold_select.torch
def _threshold_select_torch(x, thr):
    idx = (x.abs() >= thr).nonzero().flatten()
    return COO(idx.to(_tidx(len(x))), x[idx], len(x))


# -- operations on COO vectors -------------------------------------------------------

def _coo_add_work(out, parts):
    nnz = sum(p.nnz for p in parts)
    return Work(nnz, _nnz_bytes(parts) + out.nbytes)


@kernel("coo_add", work=_coo_add_work)
def coo_add(parts):
    """Sum of sparse vectors: the union of their indices (SparCML's sum of streams)."""
    parts = list(parts)
    n = parts[0].n
    if _merge_add is not None and len(parts) == 2 and all(_ascending(p.indices) for p in parts) \
            and parts[0].values.dtype == parts[1].values.dtype:
        a, b = parts
        ia, ib = a.indices.astype(np.int64, copy=False), b.indices.astype(np.int64, copy=False)
        idx, val = np.empty(len(ia) + len(ib), dtype=np.int64), np.empty(len(ia) + len(ib), dtype=a.values.dtype)
        m = _merge_add(ia, a.values, ib, b.values, idx, val)
        return COO(idx[:m].astype(_idx_dtype(n)), val[:m].copy(), n)
    idx = np.concatenate([p.indices for p in parts])
    val = np.concatenate([p.values for p in parts])
    uniq, inv = np.unique(idx, return_inverse=True)
    out = np.bincount(inv, weights=val, minlength=len(uniq)).astype(val.dtype)
    return COO(uniq.astype(_idx_dtype(n)), out, n)


def _ascending(idx) -> bool:
    return len(idx) < 2 or bool((idx[1:] > idx[:-1]).all())


def _merged_sum(ia, va, ib, vb, idx, val):
    """Two vectors of strictly ascending indices merged into ``idx``/``val``,
    a shared index's values added in float64 and stored in ``val``'s dtype
    (as ``np.bincount`` of the concatenation sums them: the same values, in
    one pass instead of a sort); returns how many entries."""
    i = j = m = 0
    while i < ia.shape[0] or j < ib.shape[0]:
        if j >= ib.shape[0] or (i < ia.shape[0] and ia[i] < ib[j]):
            idx[m], val[m] = ia[i], 0.0 + np.float64(va[i])   # (bincount's 0 + v: -0 becomes 0)
            i += 1
        elif i >= ia.shape[0] or ib[j] < ia[i]:
            idx[m], val[m] = ib[j], 0.0 + np.float64(vb[j])
            j += 1
        else:
            idx[m] = ia[i]
            val[m] = 0.0 + np.float64(va[i]) + np.float64(vb[j])
            i += 1
            j += 1
        m += 1
    return m


_merge_add = njit(_merged_sum)


@coo_add.torch
def _coo_add_torch(parts):
    import torch

    parts = list(parts)
    n = parts[0].n
    idx = torch.cat([p.indices for p in parts])
    val = torch.cat([p.values for p in parts])
    uniq, inv = torch.unique(idx, sorted=True, return_inverse=True)
    out = torch.zeros(len(uniq), dtype=val.dtype, device=val.device).index_add_(0, inv, val)
    return COO(uniq.to(_tidx(n)), out, n)


class COOParts(Sequence):
    """One COO vector cut at index ``bounds``: part i (a view, made when
    asked for) holds the entries with bounds[i] <= index < bounds[i+1].
    What ``coo_split`` returns: the selection and P + 1 positions
    (``cuts``), not P objects -- Ok-Topk's split at P = 4096 would make
    16.8 M of them. The bulk alltoall reads the counts and the entries as
    arrays (``Alltoall.bulk``, :mod:`simsparse.algorithms.collectives`)."""

    __slots__ = ("coo", "bounds", "cuts")

    def __init__(self, coo: COO, bounds, cuts):
        self.coo, self.bounds, self.cuts = coo, bounds, cuts

    def __len__(self) -> int:
        return len(self.cuts) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"part {i} of {len(self)}")
        a, b, c = int(self.cuts[i]), int(self.cuts[i + 1]), self.coo
        return COO(c.indices[a:b], c.values[a:b], c.n)

    def counts(self) -> np.ndarray:
        """Entries per part."""
        return np.diff(np.asarray(self.cuts, dtype=np.int64))


@kernel("coo_split", work=lambda out, coo, bounds: Work(coo.nnz, coo.nbytes))
def coo_split(coo, bounds):
    """Split by index ranges: part i holds the entries with
    bounds[i] <= index < bounds[i+1] (global indices kept; views, no copy)."""
    b = np.asarray(bounds)
    if _cuts_compiled is not None and len(b) > 64 and (b[1:] >= b[:-1]).all():
        # one merge pass of the two sorted arrays (at P = 4096, 4097 binary searches took 0.2 ms a rank)
        return COOParts(coo, bounds, _cuts_compiled(np.asarray(coo.indices), b, np.empty(len(b), dtype=np.int64)))
    return COOParts(coo, bounds, np.searchsorted(coo.indices, b))


def _cuts(a, b, out):
    """``np.searchsorted(a, b)`` for ascending a and b, by one merge pass."""
    i = 0
    for j in range(b.shape[0]):
        while i < a.shape[0] and a[i] < b[j]:
            i += 1
        out[j] = i
    return out


_cuts_compiled = njit(_cuts)


@coo_split.torch
def _coo_split_torch(coo, bounds):
    import torch

    b = torch.as_tensor(list(bounds), dtype=coo.indices.dtype, device=coo.indices.device)
    return COOParts(coo, bounds, torch.searchsorted(coo.indices, b).tolist())


def _concat_work(out, parts, n=None):
    return Work(out.nnz, 2 * out.nbytes)


@kernel("coo_concat", work=_concat_work, memo=True)
def coo_concat(parts, n=None):
    """Concatenate sparse vectors with disjoint, ordered index ranges."""
    parts = list(parts)
    n = parts[0].n if n is None else n
    return COO(np.concatenate([p.indices for p in parts]).astype(_idx_dtype(n)),
               np.concatenate([p.values for p in parts]), n)


@coo_concat.torch
def _coo_concat_torch(parts, n=None):
    import torch

    parts = list(parts)
    n = parts[0].n if n is None else n
    return COO(torch.cat([p.indices for p in parts]).to(_tidx(n)), torch.cat([p.values for p in parts]), n)


@kernel("coo_topk", work=lambda out, coo, k: Work(coo.nnz, coo.nbytes + out.nbytes))
def coo_topk(coo, k):
    """The k entries of a sparse vector with the largest |value| (indices ascending)."""
    m = coo.nnz
    if k >= m:
        return coo
    keep = np.zeros(m, dtype=bool)   # (the chosen positions ascending: a mask, not a sort of k of them)
    keep[np.argpartition(np.abs(coo.values), m - k)[m - k:]] = True
    sel = np.flatnonzero(keep)
    return COO(coo.indices[sel], coo.values[sel], coo.n)


@coo_topk.torch
def _coo_topk_torch(coo, k):
    import torch

    if k >= coo.nnz:
        return coo
    sel, _ = torch.sort(torch.topk(coo.values.abs(), int(k), sorted=False).indices)
    return COO(coo.indices[sel], coo.values[sel], coo.n)


@kernel("coo_threshold", work=lambda out, coo, thr: Work(coo.nnz, coo.nbytes + out.nbytes), memo=True)
def coo_threshold(coo, thr):
    """The entries of a sparse vector with |value| >= thr."""
    keep = np.abs(coo.values) >= thr
    return COO(coo.indices[keep], coo.values[keep], coo.n)


@coo_threshold.torch
def _coo_threshold_torch(coo, thr):
    keep = coo.values.abs() >= thr
    return COO(coo.indices[keep], coo.values[keep], coo.n)


# -- dense <-> sparse -------------------------------------------------------------------

@kernel("sparsify", work=lambda out, x, offset=0, n=None: Work(len(x), len(x) * _isz(x) + out.nbytes, select=out.nnz))
def sparsify(x, offset=0, n=None):
    """COO of the nonzeros of a dense block that starts at global index
    ``offset`` of a vector of length ``n`` (SparCML's re-sparsification)."""
    n = len(x) + offset if n is None else n
    nz = np.flatnonzero(x)
    return COO((nz + offset).astype(_idx_dtype(n)), x[nz], n)


@sparsify.torch
def _sparsify_torch(x, offset=0, n=None):
    n = len(x) + offset if n is None else n
    nz = x.nonzero().flatten()
    return COO((nz + offset).to(_tidx(n)), x[nz], n)


@kernel("gather_at", work=lambda out, x, idx: Work(len(x), 2 * len(idx) * _isz(x) + len(idx) * 4, select=len(idx)))
def gather_at(x, idx):
    """x[idx]: the values of a dense vector at given indices. Its work is the
    vector's length and the entries gathered (``Work.select``), as top-k's:
    at one length the time moves with their spacing (sorted indices a few
    entries apart stream through the cache lines; thousands apart, each one
    misses)."""
    return x[idx]


@gather_at.torch
def _gather_at_torch(x, idx):
    return x[idx.long()]


@kernel("zero_at", work=lambda out, x, idx, inplace=False: Work(len(x), 2 * len(x) * _isz(x) + len(idx) * 4))
def zero_at(x, idx, inplace: bool = False):
    """A copy of x with x[idx] = 0 (the error-feedback residual update);
    ``inplace``: x's own buffer, which the caller owns and lets go of (the
    simulator's host saves the copy; the device is charged the copy as
    before, and the real backend makes it)."""
    out = x if inplace and x.flags.writeable else x.copy()
    out[idx] = 0
    return out


@zero_at.torch
def _zero_at_torch(x, idx, inplace=False):
    out = x.clone()
    out[idx.long()] = 0
    return out


@kernel("intersect", work=lambda out, a, b: Work(len(a) + len(b), 4 * (len(a) + len(b))))
def intersect(a, b):
    """Sorted intersection of two sorted unique index arrays: one compiled
    merge pass (:func:`_locate` of a's entries in b), or a binary
    search of a's entries in b (no sort of both, as ``np.intersect1d`` does)
    without numba."""
    a, b = np.asarray(a), np.asarray(b)
    if not len(a) or not len(b):
        return a[:0].copy()
    if not ((a[1:] > a[:-1]).all() and (b[1:] > b[:-1]).all()):
        return np.intersect1d(a, b, assume_unique=True).astype(a.dtype)
    if _LOCATE is not None:   # (at P = 4096 the searches took 5.8 s of Ok-Topk's iterations)
        pos, found = np.empty(len(a), dtype=np.int64), np.empty(len(a), dtype=np.bool_)
        _LOCATE(b.astype(a.dtype, copy=False), a, pos, found)
        return a[found]
    i = np.searchsorted(b, a)
    return a[b[np.minimum(i, len(b) - 1)] == a]



@intersect.torch
def _intersect_torch(a, b):
    import torch

    return a[torch.isin(a, b)]
