"""Sparse streams with the dynamic switch to dense (SparCML, Renggli et al.,
SC'19, section 5.1), and the kernels that split, sum and re-sparsify them.

A *stream* holds the values of one index range ``[lo, hi)`` of a vector of
length ``n``, in one of two representations:

* sparse: a :class:`~simsparse.ops.COO` with *global* indices inside the range;
* dense: a :class:`DenseRange`, the range's ``hi - lo`` values.

The sparse form costs ``nnz (c + isize)`` bytes and the dense one
``(hi - lo) isize``, so a stream is kept sparse only while
``nnz (c + isize) < (hi - lo) isize`` (the paper's ``nnz <= delta``; the
SparCML code switches at ``>=``, as here). The sum of two sparse streams
bounds the union of their indices by ``nnz1 + nnz2`` (section 5.1, "this is
costly, and thus we only upper bound this result") and goes dense when that
bound reaches the threshold; a split part goes dense by the same rule
(``cnt * 8 >= size * 4`` for int32/float32 in ``c_common.h``).

Departures from the SparCML code: the code sends region-local indices
after a split; these streams keep global indices (the same bytes); its
4-byte ``nofitems`` header is framing, not counted (as for every payload).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compute.kernels import Work, _isz, kernel
from ..compute.sparse_kernels import coo_add, coo_split
from ..ops import COO, OneArray, Payload


@dataclass(frozen=True, slots=True)
class DenseRange(OneArray, Payload):
    """A dense stream: ``values`` of the index range ``[offset, offset +
    len(values))`` of a vector of length ``n``. Size = the values' bytes."""

    values: Any
    offset: int
    n: int
    ARRAYS = ("values",)

    def map(self, fn) -> "DenseRange":
        return DenseRange(fn(self.values), self.offset, self.n)


def goes_dense(nnz: int, size: int, idx_isz: int = 4, val_isz: int = 4) -> bool:
    """SparCML's switch: a stream of ``nnz`` entries over ``size`` indices is
    dense when ``nnz (idx + val bytes) >= size * val bytes``."""
    return nnz * (idx_isz + val_isz) >= size * val_isz


def stream_result(s):
    """What a rank program returns for a stream: COO stays COO, a dense
    stream over the whole vector is its values."""
    return s.values if isinstance(s, DenseRange) else s


def _sbytes(s) -> int:
    return int(s.nbytes)


# -- split --------------------------------------------------------------------------

def _split_work(out, s, bounds):
    dense_out = sum(len(p) for p in out if isinstance(p, DenseRange) and not isinstance(s, DenseRange))
    return Work(s.nnz if isinstance(s, COO) else 0, _sbytes(s) + dense_out * _isz(s.values))


def _np_dense(coo: COO, lo: int, hi: int) -> DenseRange:
    out = np.zeros(hi - lo, dtype=coo.values.dtype)
    out[coo.indices - lo] = coo.values
    return DenseRange(out, lo, coo.n)


def _torch_dense(coo: COO, lo: int, hi: int) -> DenseRange:
    import torch

    out = torch.zeros(hi - lo, dtype=coo.values.dtype, device=coo.values.device)
    out[(coo.indices - lo).long()] = coo.values
    return DenseRange(out, lo, coo.n)


def _split(s, bounds, coo_split_fn, dense_fn):
    bounds = [int(b) for b in bounds]
    ranges = list(zip(bounds[:-1], bounds[1:]))
    if isinstance(s, DenseRange):
        return [DenseRange(s.values[a - s.offset:b - s.offset], a, s.n) for a, b in ranges]
    parts = coo_split_fn(s, bounds)
    isz_i, isz_v = _isz(s.indices), _isz(s.values)
    return [dense_fn(p, a, b) if goes_dense(p.nnz, b - a, isz_i, isz_v) else p for p, (a, b) in zip(parts, ranges)]


@kernel("stream_split", work=_split_work)
def stream_split(s, bounds):
    """Split a stream by index ranges ``[bounds[i], bounds[i+1])``: one stream
    per range, each dense when its count reaches the switch (SparCML
    ``split_stream``). Dense inputs give views; sparse parts are views."""
    return _split(s, bounds, coo_split.numpy, _np_dense)


@stream_split.torch
def _stream_split_torch(s, bounds):
    return _split(s, bounds, coo_split.torch_fn, _torch_dense)


# -- densify / re-sparsify ----------------------------------------------------------

def _dense_work(out, s, lo, hi):
    return Work(hi - lo, 2 * (hi - lo) * _isz(s.values) + (_sbytes(s) if isinstance(s, COO) else 0))


@kernel("stream_dense", work=_dense_work)
def stream_dense(s, lo, hi):
    """A fresh dense working copy of a stream over ``[lo, hi)`` (SparCML
    DSAR: the owner's own split becomes its dense accumulation buffer)."""
    if isinstance(s, DenseRange):
        return DenseRange(s.values.copy(), lo, s.n)
    return _np_dense(s, lo, hi)


@stream_dense.torch
def _stream_dense_torch(s, lo, hi):
    if isinstance(s, DenseRange):
        return DenseRange(s.values.clone(), lo, s.n)
    return _torch_dense(s, lo, hi)


def _resparsify_work(out, s, eps):
    if isinstance(s, COO):
        return Work(0, 0)
    return Work(len(s.values), _sbytes(s) + out.nbytes)


def _idx_dtype(n):
    return np.int32 if n < 2**31 else np.int64


@kernel("stream_resparsify", work=_resparsify_work)
def stream_resparsify(s, eps):
    """A sparse stream with global indices: a dense stream keeps the entries
    with ``|v| > eps`` (SSAR_Split_allgather's reduced range; the code uses
    1e-8); a sparse one is returned as it is."""
    if isinstance(s, COO):
        return s
    nz = np.flatnonzero(np.abs(s.values) > eps)
    return COO((nz + s.offset).astype(_idx_dtype(s.n)), s.values[nz], s.n)


@stream_resparsify.torch
def _stream_resparsify_torch(s, eps):
    import torch

    if isinstance(s, COO):
        return s
    nz = (s.values.abs() > eps).nonzero().flatten()
    return COO((nz + s.offset).to(torch.int32 if s.n < 2**31 else torch.int64), s.values[nz], s.n)


# -- sum ----------------------------------------------------------------------------

def _add_work(out, a, b, lo, hi, disjoint=False, inplace=False):
    """The work of :func:`stream_add`, and which of its paths ran (each costs
    differently per element: a dense add against a sorted merge)."""
    size = hi - lo
    da, db = isinstance(a, DenseRange), isinstance(b, DenseRange)
    if not da and not db:
        if isinstance(out, DenseRange):   # switched to dense: zero the range, scatter both
            return Work(size + a.nnz + b.nnz, out.nbytes + _sbytes(a) + _sbytes(b), path="densify")
        return Work(a.nnz + b.nnz, _sbytes(a) + _sbytes(b) + out.nbytes, path="concat" if disjoint else "merge")
    if da and db:
        return Work(size, 3 * out.nbytes, path="dense")
    sparse = b if da else a
    if inplace:                           # scatter the sparse one into the dense buffer
        return Work(sparse.nnz, _sbytes(sparse) + 2 * sparse.nnz * _isz(out.values), path="scatter")
    return Work(size + sparse.nnz, 2 * out.nbytes + _sbytes(sparse), path="copy_scatter")


def _first_is_lower(a: COO, b: COO) -> bool:
    return a.nnz > 0 and (b.nnz == 0 or int(a.indices[0]) < int(b.indices[0]))


@kernel("stream_add", work=_add_work)
def stream_add(a, b, lo, hi, disjoint=False, inplace=False):
    """Sum of two streams over ``[lo, hi)`` (SparCML ``sum_streams`` /
    ``sum_into_stream``). Two sparse streams give a sparse union unless
    ``nnz_a + nnz_b`` reaches the dense switch; ``disjoint`` (index sets known
    not to overlap, e.g. ranges of an allgather) concatenates instead of
    merging. With ``inplace`` a dense operand's buffer may be reused (the
    caller owns both); otherwise the result is a fresh stream."""
    da, db = isinstance(a, DenseRange), isinstance(b, DenseRange)
    if not da and not db:
        if goes_dense(a.nnz + b.nnz, hi - lo, _isz(a.indices), _isz(a.values)):
            out = np.zeros(hi - lo, dtype=a.values.dtype)
            out[a.indices - lo] += a.values
            out[b.indices - lo] += b.values
            return DenseRange(out, lo, a.n)
        if disjoint:
            first, second = (a, b) if _first_is_lower(a, b) else (b, a)
            return COO(np.concatenate([first.indices, second.indices]),
                       np.concatenate([first.values, second.values]), a.n)
        return coo_add.numpy([a, b])
    # the simulator shares received arrays read-only: reuse only writable buffers
    if da and db:
        if inplace and a.values.flags.writeable:
            a.values[...] += b.values
            return a
        return DenseRange(a.values + b.values, lo, a.n)
    dense, sparse = (a, b) if da else (b, a)
    reuse = inplace and dense.values.flags.writeable
    out = dense.values if reuse else dense.values.copy()
    out[sparse.indices - lo] += sparse.values
    return dense if reuse else DenseRange(out, lo, dense.n)


@stream_add.torch
def _stream_add_torch(a, b, lo, hi, disjoint=False, inplace=False):
    import torch

    da, db = isinstance(a, DenseRange), isinstance(b, DenseRange)
    if not da and not db:
        if goes_dense(a.nnz + b.nnz, hi - lo, _isz(a.indices), _isz(a.values)):
            out = torch.zeros(hi - lo, dtype=a.values.dtype, device=a.values.device)
            out.index_add_(0, (a.indices - lo).long(), a.values)
            out.index_add_(0, (b.indices - lo).long(), b.values)
            return DenseRange(out, lo, a.n)
        if disjoint:
            first, second = (a, b) if _first_is_lower(a, b) else (b, a)
            return COO(torch.cat([first.indices, second.indices]), torch.cat([first.values, second.values]), a.n)
        return coo_add.torch_fn([a, b])
    if da and db:
        if inplace:
            a.values.add_(b.values)
            return a
        return DenseRange(a.values + b.values, lo, a.n)
    dense, sparse = (a, b) if da else (b, a)
    out = dense.values if inplace else dense.values.clone()
    out.index_add_(0, (sparse.indices - lo).long(), sparse.values)
    return dense if inplace else DenseRange(out, lo, dense.n)
