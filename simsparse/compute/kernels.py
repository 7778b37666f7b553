"""Compute kernels: every operation an algorithm performs on gradient data.

A kernel has a numpy implementation (run by the simulator), a torch
implementation (run and timed by the real backend; CPU or CUDA) and a *work*
function giving the elements processed and the bytes of memory it touches.
Device models (``devices.py``) turn work into seconds. Algorithms call kernels
only through ``yield ctx.compute(name, ...)``, so every data operation is both
executed and accounted in both backends.

Conventions: sparse vectors are :class:`~simsparse.ops.COO` payloads with
int32 indices sorted ascending; "like" arguments give dtype and device of a
created array, so kernels never need to know the backend.

Other modules register more kernels with the same :func:`kernel` decorator.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..ops import COO
from ..registry import Registry, instance_of


@dataclass(frozen=True)
class Work:
    """What a kernel call did: elements processed, bytes of memory moved;
    ``parts``: the inputs it loops over one at a time, each paying the ops'
    launches again (FFT's unpack-and-sum of P payloads; 1 for a kernel that
    handles its inputs in one pass); ``path``: which of its code paths ran,
    where one kernel has several whose costs differ (SparCML's stream sum
    adds two dense ranges, scatters a sparse one into a dense one, merges,
    concatenates or densifies two sparse ones). A profile may cost each path
    on its own (``"name/path"``, :meth:`~.devices.ParametricDevice.cost`);
    ``select``: the sparse entries a kernel selects (top-k's k, a
    threshold's survivors), scatters (a scatter-add's nnz) or gathers; 0 for a dense
    kernel. At one size, such a kernel's time moves with them
    (``select_scale``)."""

    elems: float
    bytes: float
    parts: float = 1.0
    path: str = ""
    select: float = 0.0

    @property
    def nlogn(self) -> float:
        n = max(self.elems, 1.0)
        return n * math.log2(max(n, 2.0))


class Kernel:
    __slots__ = ("name", "numpy", "torch_fn", "work", "memo", "by_type")

    def __init__(self, name: str, numpy_fn: Callable, work: Callable, memo: bool = False):
        self.name = name
        self.numpy = numpy_fn
        self.torch_fn = numpy_fn  # overridden by @k.torch where the code differs
        self.work = work
        #: a pure function of its inputs whose result the simulator may share
        #: between ranks that call it on the very same (read-only) arrays
        self.memo = memo
        #: numpy implementations for vectors of other types (:meth:`on`), by type
        self.by_type: dict[type, Callable] = {}

    def torch(self, fn: Callable) -> Callable:
        """Decorator: register the torch implementation."""
        self.torch_fn = fn
        return fn

    def on(self, *types: type) -> Callable[[Callable], Callable]:
        """Decorator: register the numpy implementation for vectors of
        ``types`` (a sampled gradient: :mod:`.sampled`), called with the
        kernel's own arguments. ``numpy`` then dispatches on the type of its
        first positional argument (of a list's first element: ``concat``),
        else of its second (the other operand of ``add``); a kernel without
        any stays its plain function, at no cost per call."""

        def deco(fn: Callable) -> Callable:
            if not self.by_type:
                self.numpy = _dispatching(self.numpy, self.by_type)
            self.by_type.update(dict.fromkeys(types, fn))
            return fn

        return deco


def _dispatching(plain: Callable, by_type: dict) -> Callable:
    """``plain``, or what ``by_type`` holds for the type of the first
    positional argument (a list's: its first element's), else of the second."""
    get = by_type.get

    @functools.wraps(plain)   # (its signature: the memo binds arguments by it)
    def numpy(*args, **kwargs):
        if args:
            first = args[0]
            t = type(first)
            fn = get(type(first[0]) if (t is list or t is tuple) and first else t)
            if fn is None and len(args) > 1:
                fn = get(type(args[1]))
            if fn is not None:
                return fn(*args, **kwargs)
        return plain(*args, **kwargs)

    return numpy


#: the kernels by name: the package's, a dotted path, or entry points of group ``simsparse.kernels``
KERNELS = Registry("kernel", "simsparse.kernels", instance_of(Kernel),
                   "a simsparse.compute.kernels.Kernel (made by the @kernel decorator)")


def kernel(name: str, work: Callable, memo: bool = False) -> Callable[[Callable], Kernel]:
    """Register ``fn`` (numpy implementation, also used for torch when the
    same code works on tensors) as kernel ``name`` with ``work(out, *args, **kw)``.
    ``memo=True`` marks an expensive pure kernel that every rank calls on the
    same received data (decompress-and-sum after an allgather): the simulator
    computes it once per iteration and charges every rank its cost."""

    def deco(fn: Callable) -> Kernel:
        return KERNELS.add(name, Kernel(name, fn, work, memo))

    return deco


def get_kernel(name: str) -> Kernel:
    """The kernel ``name`` resolves to (:class:`~simsparse.registry.Registry`)."""
    return KERNELS[name]


# -- size-only vectors -------------------------------------------------------------

class Phantom(np.ndarray):
    """A vector whose values are not carried, only its length and dtype (like
    SMPI's shared-malloc trick): zero-strided and read-only, so it costs no
    memory; ``len``, ``dtype``, ``nbytes`` (the logical size) and slicing work
    as on a real vector. The dense kernels keep phantoms phantom; the
    simulator uses them for collectives whose time and bytes provably do not
    depend on values (``Algorithm.value_free``)."""


def phantom(n: int, dtype) -> Phantom:
    return np.broadcast_to(np.zeros((), dtype=dtype), (int(n),)).view(Phantom)


def _any_phantom(*arrays) -> bool:
    return any(type(a) is Phantom for a in arrays)


# -- helpers for work functions ------------------------------------------------

def _isz(a) -> int:
    return a.itemsize if hasattr(a, "itemsize") else a.element_size()


def streaming(reads: int, writes: int) -> Callable:
    """Work of an elementwise kernel over its first argument: reads+writes
    arrays of that length touched once."""

    def work(out, a, *args, **kw):
        m = len(a)
        return Work(m, (reads + writes) * m * _isz(a))

    return work


def _coo_nbytes(parts) -> int:
    return sum(int(p.nbytes) for p in parts)


# -- core kernels ---------------------------------------------------------------

@kernel("add", work=streaming(2, 1))
def add(a, b, inplace: bool = False):
    """Elementwise a + b (dense reduction of two blocks); ``inplace``: into
    a's buffer, which the caller owns and lets go of (the same sums: an
    error-feedback residual plus its gradient, without a fresh vector whose
    first touch costs more than the add on this host)."""
    if _any_phantom(a, b):
        return phantom(len(a), a.dtype)
    if inplace and isinstance(a, np.ndarray) and a.flags.writeable and a.dtype == np.result_type(a, b):
        a += b
        return a
    return a + b


@kernel("copy", work=streaming(1, 1))
def copy(a):
    """A fresh copy of a dense block."""
    if type(a) is Phantom:
        return a
    return a.copy()


@copy.torch
def _copy_torch(a):
    return a.clone()


def _concat_work(out, parts):
    m = sum(len(p) for p in parts)
    isz = _isz(parts[0]) if parts else 4
    return Work(m, 2 * m * isz)


@kernel("concat", work=_concat_work)
def concat(parts):
    """Concatenate dense blocks into one vector. Blocks that already lie
    side by side in one read-only buffer, in order (a bucket of a flat
    gradient's tensors, as the simulator hands them out) come back as the
    read-only view they make: the same values, charged the same work,
    without a second copy of every rank's bucket."""
    if _any_phantom(*parts):
        return phantom(sum(len(p) for p in parts), parts[0].dtype)
    view = _adjacent(parts)
    return np.concatenate(parts) if view is None else view


def _adjacent(parts):
    """The read-only 1-D view that ``parts`` tile in order, or None."""
    if len(parts) < 2 or not all(isinstance(p, np.ndarray) for p in parts):
        return None
    base, dt = parts[0].base, parts[0].dtype
    if not isinstance(base, np.ndarray) or base.ndim != 1 or not base.flags.c_contiguous:
        return None
    at = parts[0].__array_interface__["data"][0]
    first = at
    for p in parts:
        if (p.base is not base or p.dtype != dt or p.ndim != 1 or p.flags.writeable or not p.flags.c_contiguous
                or p.__array_interface__["data"][0] != at):
            return None
        at += p.nbytes
    off = (first - base.__array_interface__["data"][0]) // dt.itemsize
    if base.dtype != dt or off < 0:
        return None
    view = base[off:off + (at - first) // dt.itemsize]
    view.flags.writeable = False
    return view


@concat.torch
def _concat_torch(parts):
    import torch

    return torch.cat(list(parts))


@kernel("zeros", work=lambda out, n, like: Work(n, n * _isz(like)))
def zeros(n, like):
    """A zero vector of length n with the dtype (and device) of ``like``."""
    if type(like) is Phantom:
        return phantom(n, like.dtype)
    return np.zeros(n, dtype=like.dtype)


@zeros.torch
def _zeros_torch(n, like):
    import torch

    return torch.zeros(n, dtype=like.dtype, device=like.device)


def _index_dtype_np(n: int):
    return np.int32 if n < 2**31 else np.int64


def _topk_work(out, x, k):
    # one pass reading |x|, plus writing k (index, value) pairs
    m = len(x)
    return Work(m, m * _isz(x) + 2 * k * 4, select=min(k, m))


@kernel("topk", work=_topk_work)
def topk(x, k):
    """Exact top-k by magnitude: COO of the k entries of largest |x|, indices
    ascending. (Ties are broken arbitrarily, as torch.topk does.)"""
    n = len(x)
    k = min(int(k), n)
    if k == n:
        idx = np.arange(n)
    else:
        idx = np.argpartition(np.abs(x), n - k)[n - k:]
        idx.sort()
    idx = idx.astype(_index_dtype_np(n))
    return COO(idx, x[idx], n)


@topk.torch
def _topk_torch(x, k):
    import torch

    n = len(x)
    k = min(int(k), n)
    idx = torch.topk(x.abs(), k, sorted=False).indices
    idx, _ = torch.sort(idx)
    return COO(idx.to(torch.int32 if n < 2**31 else torch.int64), x[idx], n)


def _scatter_add_work(out, parts, n, like):
    nnz = sum(p.nnz for p in parts)
    return Work(n + nnz, n * _isz(like) + 2 * _coo_nbytes(parts), select=nnz)


@kernel("scatter_add", work=_scatter_add_work, memo=True)
def scatter_add(parts, n, like):
    """Dense sum of sparse vectors: zeros(n) then out[idx] += val per part."""
    out = np.zeros(n, dtype=like.dtype)
    for p in parts:
        out[p.indices] += p.values  # indices are unique within one COO
    return out


@scatter_add.torch
def _scatter_add_torch(parts, n, like):
    import torch

    out = torch.zeros(n, dtype=like.dtype, device=like.device)
    for p in parts:
        out.index_add_(0, p.indices.long(), p.values)
    return out


@kernel("add_into", work=streaming(2, 1))
def add_into(dst, src):
    """In place: dst += src (dst is a view into a working buffer); returns dst."""
    if type(dst) is Phantom or type(src) is Phantom:   # (the hot path of dense collectives)
        return dst
    dst += src
    return dst


@kernel("copy_into", work=streaming(1, 1))
def copy_into(dst, src):
    """In place: dst[:] = src; returns dst."""
    if type(dst) is Phantom or type(src) is Phantom:   # (the hot path of dense collectives)
        return dst
    dst[:] = src
    return dst
