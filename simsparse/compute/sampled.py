"""A sampled gradient: the entries above a floor of a length-n vector.

With ``values: sampled`` the simulator does not draw a rank's n gradient
values. It draws only the entries whose magnitude reaches a *floor*, about
``margin x k`` of them (:mod:`simsparse.sampling`): their number, positions
and values exactly as the full draw would give the entries above that
floor. Every selection a sparse algorithm makes at or above the floor (its
top-k, a threshold that selects about k) is then the full draw's, in
distribution, at O(k) memory and time per rank.

A :class:`Sampled` vector answers the kernels that sparse algorithms apply
to their input: top-k, threshold selection and counting (exact while the
threshold is at or above the floor; below it, a clear error), the mean and
standard deviation (the distribution's, analytically), values at given
indices (the carried ones, and for the others a draw from the distribution
below the floor, the same for the same index), and zeroing entries.
Kernels are charged for n elements, as for the full vector; their
implementations for sampled vectors are registered here (``Kernel.on``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..jit import njit
from ..ops import COO
from .kernels import add, concat, topk
from .sparse_kernels import _LOCATE, count_above, count_at_least, gather_at, threshold_select, zero_at


class BelowFloor(ValueError):
    """A threshold under the sampled floor: the selection needs entries that
    were not drawn. ``needed``: how many entries it would take (None where
    unknown), ``have``: how many the vector carries at or above its floor,
    ``iteration``: where it happened (set by the simulator, which widens that
    iteration's floor and runs the point again)."""

    def __init__(self, message: str, needed: int | None = None, have: int | None = None):
        super().__init__(message)
        self.needed, self.have, self.iteration = needed, have, None


class Sampled:
    """Length ``n``; carries the entries with |value| >= ``floor`` (``indices``
    ascending, ``values``); ``rest(idx)`` draws the values of other indices
    from the distribution below the floor; ``moments`` = (mean, std) of the
    whole vector's distribution, or None: then computed from the carried
    values and ``undrawn`` (the sum and sum of squares of the entries not
    carried). Over several iterations (:mod:`simsparse.sampling.paths`) a
    vector may carry entries below its floor too, ``below`` counts the
    entries not carried above a threshold under the floor, and a gradient
    that ``accumulates`` (error feedback) is added to the last residual by
    :meth:`plus`."""

    __slots__ = ("n", "indices", "values", "floor", "rest", "_moments", "undrawn", "below", "accumulates",
                 "dtype", "itemsize")

    def __init__(self, n: int, indices: np.ndarray, values: np.ndarray, floor: float,
                 rest: Callable[[np.ndarray], np.ndarray], moments: tuple[float, float] | None,
                 undrawn: tuple[float, float] | None = None, below=None, accumulates: bool = False):
        self.n, self.indices, self.values, self.floor = n, indices, values, float(floor)
        self.rest, self._moments, self.undrawn, self.below, self.accumulates = rest, moments, undrawn, below, accumulates
        self.dtype, self.itemsize = values.dtype, values.dtype.itemsize

    def __len__(self) -> int:
        return self.n

    @property
    def moments(self) -> tuple[float, float]:
        if self._moments is None:
            total, squares = self.undrawn
            v = self.values.astype(np.float64)
            total, squares, n = float(v.sum()) + total, sum_of_squares(v) + squares, self.n
            mean = total / n
            self._moments = (mean, float(np.sqrt(max(squares - n * mean * mean, 0.0) / max(n - 1, 1))))
        return self._moments

    def _whole(self) -> bool:
        return len(self.values) >= self.n

    def _carried_above(self, thr: float) -> int:
        return count_at_least(self.values, thr)

    def _above(self, thr: float, what: str, needed: int | None = None) -> np.ndarray:
        if thr < self.floor and not self._whole():   # (a vector drawn whole answers any threshold)
            if needed is None and self.below is not None:
                needed = self._carried_above(thr) + self.below.count(thr)
            raise BelowFloor(f"{what} at {thr:.6g} reaches below the sampled floor {self.floor:.6g} (a sampled "
                             f"gradient carries only the entries above it); use evaluation: exact (full values) "
                             f"for this point",
                             needed, self._carried_above(self.floor))
        return np.abs(self.values) >= thr

    def topk(self, k: int) -> COO:
        """The k entries of largest magnitude, indices ascending."""
        k = min(int(k), self.n)
        if k > len(self.values):
            raise BelowFloor(f"top-{k} of a sampled vector that carries {len(self.values)} entries; use evaluation: "
                             f"exact (full values) for this point", k, self._carried_above(self.floor))
        a = np.abs(self.values)
        if k == len(self.values) or k <= 0:
            if k > 0:   # (carried entries below the floor: drawn for another iteration)
                self._above(float(a.min()), f"the top-{k}'s smallest magnitude", k)
            sel = slice(0, max(k, 0))
            return COO(self.indices[sel].copy(), self.values[sel].copy(), self.n)
        # the k-th magnitude, then a mask (indices come out ascending): half the time of an
        # argpartition and a sort; among entries tied at the k-th magnitude the first ones
        kth = np.partition(a, len(a) - k)[len(a) - k]
        self._above(float(kth), f"the top-{k}'s smallest magnitude", k)
        keep = a > kth
        need = k - int(np.count_nonzero(keep))
        if need:
            keep[np.flatnonzero(a == kth)[:need]] = True
        sel = np.flatnonzero(keep)
        return COO(self.indices[sel], self.values[sel], self.n)

    def count_above(self, thr: float) -> int:
        if thr < self.floor and self.below is not None and not self._whole():
            return self._carried_above(thr) + self.below.count(thr)
        if thr < self.floor:
            self._above(thr, "a threshold count")   # (raises: below the floor, nothing to count it with)
        return count_at_least(self.values, thr)

    def threshold_select(self, thr: float) -> COO:
        # (positions, then two takes: a sixth of the time of two boolean masks on a random mask)
        keep = np.flatnonzero(self._above(thr, "a threshold selection"))
        return COO(self.indices[keep], self.values[keep], self.n)

    def _find(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``idx`` lies among the carried indices (which
        ascend: a binary search), and whether it is carried."""
        if _LOCATE is not None and _ascends(idx):
            pos, found = np.empty(len(idx), dtype=np.int64), np.empty(len(idx), dtype=np.bool_)
            _LOCATE(self.indices, idx, pos, found)   # (ascending: one merge pass, 3 to 10x the search)
            return pos, found
        pos = np.searchsorted(self.indices, idx)
        found = (pos < len(self.indices)) & (self.indices[np.minimum(pos, len(self.indices) - 1)] == idx) \
            if len(self.indices) else np.zeros(len(idx), dtype=bool)
        return pos, found

    def gather_at(self, idx) -> np.ndarray:
        """Values at ``idx``: carried ones as they are, the others drawn below the floor."""
        idx = np.asarray(idx)
        pos, found = self._find(idx)
        out = np.empty(len(idx), dtype=self.dtype)
        out[found] = self.values[pos[found]]
        if not found.all():
            out[~found] = self.rest(idx[~found])
        return out

    def zero_at(self, idx) -> "Sampled":
        """The vector with ``idx`` zeroed (an error-feedback residual)."""
        idx = np.asarray(idx)
        if _DROP is not None and _ascends(idx):
            ind, val = np.empty_like(self.indices), np.empty_like(self.values)
            m = _DROP(self.indices, self.values, idx, ind, val)   # (one merge pass, no mask: 4x)
            ind, val = ind[:m], val[:m]
        else:
            pos, found = self._find(idx)
            keep = np.ones(len(self.indices), dtype=bool)
            keep[pos[found]] = False
            ind, val = self.indices[keep], self.values[keep]
        return Sampled(self.n, ind, val, self.floor, self.rest, self._moments, self.undrawn)

    def plus(self, residual: "Sampled") -> "Sampled":
        """This iteration's gradient plus the last residual: the vector error
        feedback selects from. The residual's entries are some of the
        coordinates this gradient carries (the same paths); the others, never
        selected, are this vector's ``rest`` already."""
        if not self.accumulates or residual.n != self.n:
            raise ValueError("error feedback on sampled gradients adds a residual to the next iteration's gradient "
                             "of the same paths (simsparse.sampling.paths)")
        pos, found = self._find(residual.indices)
        if not found.all():
            raise ValueError("a sampled residual holds coordinates its next gradient does not carry")
        values = self.values.copy()
        values[pos] += residual.values
        values.setflags(write=False)
        return Sampled(self.n, self.indices, values, self.floor, self.rest, None, self.undrawn, self.below)


def _ascends(idx: np.ndarray) -> bool:
    """Whether ``idx`` (more than one) never descends: the merge passes below apply."""
    return len(idx) > 1 and bool((idx[1:] >= idx[:-1]).all())


def sum_of_squares(v: np.ndarray) -> float:
    """sum(v^2) by numpy's pairwise summation, not BLAS's dot, whose sum is
    split among its threads (the last bits would depend on the machine's
    cores) and whose idle threads then spin on a second core (a third of a
    sampled Ok-Topk run's CPU time)."""
    return float(np.square(v).sum())


def _drop(a, v, q, out_a, out_v):
    """The entries of ascending ``a`` (values ``v``) that ascending ``q``
    does not hold, in order, into ``out_a`` and ``out_v``; returns how many."""
    j, nq, m = 0, q.shape[0], 0
    for i in range(a.shape[0]):
        x = a[i]
        while j < nq and q[j] < x:
            j += 1
        if j < nq and q[j] == x:
            continue
        out_a[m] = x
        out_v[m] = v[i]
        m += 1
    return m


_DROP = njit(_drop)


class SampledPart:
    """One tensor's place in a rank's sampled gradient for a training
    schedule (``owner``: :class:`~simsparse.sampling.SampledModel`): what
    ``grad_ready`` hands out for a tensor of a bucket of several. The
    ``concat`` kernel packs a bucket's parts into the bucket's own sampled
    vector (``owner.join``); nothing else reads a part."""

    __slots__ = ("owner", "start", "end", "dtype", "itemsize")

    def __init__(self, owner, start: int, end: int, dtype: np.dtype):
        self.owner, self.start, self.end, self.dtype, self.itemsize = owner, start, end, dtype, dtype.itemsize

    def __len__(self) -> int:
        return self.end - self.start


# -- the kernels on sampled vectors ------------------------------------------------

@add.on(Sampled)
def _add_sampled(a, b, inplace: bool = False):
    """A sampled gradient and its residual (error feedback): added to the one that accumulates."""
    return a.plus(b) if getattr(a, "accumulates", False) else b.plus(a)


@concat.on(SampledPart)
def _concat_sampled(parts):
    """A bucket of a sampled gradient's tensors: drawn as one vector."""
    return parts[0].owner.join(parts)


def _method(name: str) -> Callable:
    """The kernel as the sampled vector's own method of that name (its arguments but ``inplace``:
    a sampled vector is never written in place)."""
    def kernel(x, *args, inplace: bool = False):
        return getattr(x, name)(*args)
    kernel.__name__ = f"_{name}_sampled"
    return kernel


for _kernel in (topk, count_above, threshold_select, gather_at, zero_at):
    _kernel.on(Sampled)(_method(_kernel.name))
