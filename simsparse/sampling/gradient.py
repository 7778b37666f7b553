"""Sampled gradients (``values: sampled``): each rank draws only the entries
above a floor, exactly in distribution, at O(k) instead of O(n).

A synthetic gradient (:mod:`simsparse.workload`) is ``g_i = s_l(i) sign_i
Q(tau_i)``: a layer scale, a random sign and the upper quantile ``Q`` of
``|X|`` at a tail probability ``tau_i``, i.i.d. uniform on (0, 1), on (0, k/n)
for a planted hot coordinate and on (k/n, 1) for a cold one. Entry i reaches
the floor F iff ``tau_i <= T_i = P(|X| >= F / s_l(i))``, independently of
the others. So the entries above F are, per layer and class (hot, cold): a
binomial number of them, at a uniformly random subset of that class's
coordinates, with ``tau`` i.i.d. uniform on the class's range below ``T``
and random signs: drawing exactly that gives the entries above F with the
full draw's joint distribution. F is set once per workload so that about
``margin x k`` entries reach it (the selections of sparse algorithms stay
above it: :class:`~simsparse.compute.sampled.Sampled` refuses any that
would not). Values at other indices, when an algorithm asks (CLT-k's
leader indices), come from the distribution below the floor, hashed from
(seed, iteration, rank, index).

In a training iteration (a schedule) each bucket of the merge plan is a
vector of its own: its layers are drawn with a floor set for the bucket's
own k (:class:`SampledModel`), since a floor set for the whole model would
leave a bucket of small-scale layers fewer entries than it selects.

Gradients that drift over iterations (``0 < drift < 1``) and error
feedback over several iterations draw each coordinate's path over the
iterations a point simulates (:mod:`.paths`). What cannot be sampled:
gradients replayed from files, and what that module refuses.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..compression.rng import _M32, _fmix, seed_of
from ..compute.sampled import Sampled, sum_of_squares
from .. import quantile
from ..jit import njit
from ..quantile import COEFFICIENTS, ndtri, special, tail_values
from . import draws
from .draws import _bernoulli, span_layers

#: entropy tag of the sampled draws (never an iteration number)
_TAG_SAMPLED = 2**40 + 3


def _log_tail(distribution: str, df: float, x: np.ndarray) -> np.ndarray:
    """log P(|X| >= x) of the unit-variance marginal."""
    x = np.asarray(x, dtype=np.float64)
    if distribution == "normal":
        return math.log(2.0) + special.log_ndtr(-x)
    if distribution == "laplace":
        return -math.sqrt(2.0) * x
    unit = math.sqrt((df - 2.0) / df)
    return np.log(2.0 * special.stdtr(df, -x / unit))


@lru_cache(maxsize=256)
def _plan(workload, margin: float, layers: tuple | None = None):
    """The floor F; per layer its start, size, scale and tail probability T
    of reaching F; the standard deviation of the whole vector. F is solved
    once per workload, by bisection on log F. ``layers``: (first, end) of a
    span of whole layers (a training schedule's bucket), drawn as a vector of
    its own: F is set for the span's own k, starts are counted from its
    first element."""
    sizes, starts, scales, n, k = span_layers(workload, layers)
    want = min(float(n), margin * k + 10.0)
    dist, df = workload.distribution, workload.df
    d = workload.k / workload.n   # (a planted hot coordinate's class is the whole vector's)
    hot = workload.planted

    def expected(F):   # entries at or above F
        T = np.exp(_log_tail(dist, df, F / scales))
        if not hot:
            return float(np.dot(sizes, T))
        # hot coordinates: tau uniform on (0, d); cold: on (d, 1); their share per layer is d
        return float(np.dot(sizes, d * np.minimum(1.0, T / d) + (1 - d) * np.clip((T - d) / (1 - d), 0, 1)))

    lo, hi = -30.0, 30.0   # log F
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expected(math.exp(mid)) > want else (lo, mid)
    F = math.exp(hi)
    T = np.exp(_log_tail(dist, df, F / scales))
    return F, starts, np.asarray(sizes, dtype=np.int64), scales, T, _below(dist, df, T, d if hot else None)


def _below(dist: str, df: float, T: np.ndarray, d: float | None):
    """Per layer and class (cold, hot), the mean and variance of X^2 for a
    value below the floor (tail probability uniform on (T, 1), or the
    class's part of it), by quadrature over the tail probability."""
    from ..workload import _abs_quantile

    q = _abs_quantile(dist, df)
    grid = (np.arange(4000) + 0.5) / 4000

    def stats(a, b):
        if b <= a:
            return 0.0, 0.0
        x2 = q(np.log(a + (b - a) * grid)) ** 2
        return float(x2.mean()), float(x2.var())

    out = []
    for t in T.tolist():
        t = min(t, 1.0)
        out.append([stats(t, 1.0)] if d is None else [stats(max(t, d), 1.0), stats(min(t, d), d)])
    return out


def sampled_gradient(workload, rank: int, iteration: int, margin: float = 4.0,
                     layers: tuple | None = None, salt: tuple = ()) -> Sampled:
    """Rank's gradient at ``iteration`` as the entries reaching the floor
    (module docstring); ``layers``: only the span (first, end) of whole
    layers, as a vector of its own (its own floor and draws); ``salt``:
    more entropy for the draws (a widened run's)."""
    from ..workload import _abs_quantile

    if workload.drift == 0:
        iteration = 0   # the same gradient every iteration
    F, starts, sizes, scales, T, below = _plan(workload, margin, layers)
    n = int(np.sum(sizes))
    span = (() if layers is None else (layers[0] + 1,)) + salt   # (the whole vector keeps its draws)
    rng = np.random.default_rng([workload.seed, _TAG_SAMPLED, iteration, rank, *span])
    q = _abs_quantile(workload.distribution, workload.df)
    hot = workload.hot_set(rank) if workload.planted else None
    if hot is not None and layers is not None:   # the span's hot coordinates, counted from its start
        first = 0 if layers[0] == 0 else int(np.sum(workload.layers[:layers[0]]))
        hot = hot[(hot >= first) & (hot < first + n)] - first
    idx, values, rest_mean, rest_var = _drawn(rng, workload, hot, starts, sizes, scales, T, below, q)
    if hot is not None:   # a layer's hot and cold parts interleave (without hot sets, the parts are sorted already)
        order = np.argsort(idx, kind="stable")
        idx, values = idx[order], values[order]
    values.setflags(write=False)
    rest = _Rest(workload, rank, iteration, hot, starts, scales, T, span)
    idx = idx.astype(np.int32 if n < 2**31 else np.int64)   # the index dtype of the selection kernels
    idx.setflags(write=False)
    # the vector's mean and standard deviation: its drawn entries as they are, the
    # sums over the others (many, i.i.d. below the floor, symmetric) by the central limit theorem
    v = values.astype(np.float64)
    total = float(v.sum()) + rng.normal(0.0, math.sqrt(rest_mean))
    squares = sum_of_squares(v) + rest_mean + rng.normal(0.0, math.sqrt(rest_var))
    mean = total / n
    std = math.sqrt(max(squares - n * mean * mean, 0.0) / max(n - 1, 1))
    return Sampled(n, idx, values, F, rest, (mean, std))


def _drawn(rng, workload, hot, starts, sizes, scales, T, below, q):
    """Each layer's (and class's) entries reaching the floor, in layer
    order: their positions and values, and the mean and variance of the sum
    of squares of the entries not drawn. A normal gradient without hot sets
    draws compiled (:func:`_drawn_layers`: the same draws and sums)."""
    rest_mean, rest_var = 0.0, 0.0
    if hot is None and workload.distribution == "normal" and _DRAWN is not None:
        idx, values, counts = _DRAWN(rng, starts, sizes, T, scales, COEFFICIENTS, np.empty(1024, dtype=workload.dtype))
        for li, (m, count) in enumerate(zip(sizes.tolist(), counts.tolist())):
            e2, v2 = below[li][0]
            rest_mean += (m - count) * e2 * scales[li] ** 2
            rest_var += (m - count) * v2 * scales[li] ** 4
        return idx, values, rest_mean, rest_var
    d = workload.k / workload.n
    idx_parts, value_parts = [], []
    for li, (a, m, t) in enumerate(zip(starts.tolist(), sizes.tolist(), T.tolist())):
        if hot is None:
            classes = [(None, m, 0.0, 1.0)]
        else:
            h = hot[(hot >= a) & (hot < a + m)]
            classes = [(h, len(h), 0.0, d), (h, m - len(h), d, 1.0)]
        for ci, (h, size, lo, hi) in enumerate(classes):
            top = min(t, hi)
            p = (top - lo) / (hi - lo) if size and top > lo else 0.0
            # each coordinate of the class reaches the floor with probability p, independently
            if h is None:
                pos = a + _bernoulli(rng, m, p)
            elif ci == 0:
                pos = h[_bernoulli(rng, len(h), p)]
            else:
                pos = a + _bernoulli(rng, m, p)
                pos = pos[~np.isin(pos, h)]
            count = len(pos)
            e2, v2 = below[li][ci if hot is None else 1 - ci]
            rest_mean += (size - count) * e2 * scales[li] ** 2
            rest_var += (size - count) * v2 * scales[li] ** 4
            if count == 0:
                continue
            idx_parts.append(pos)
            value_parts.append(_class_values(rng.random(count), lo, top, scales[li], workload, q))
    if idx_parts:
        idx, values = np.concatenate(idx_parts), np.concatenate(value_parts)
    else:
        idx, values = np.zeros(0, np.int64), np.zeros(0, workload.dtype)
    return idx, values, rest_mean, rest_var


def _drawn_layers(rng, starts, sizes, T, scales, K, values):
    """:func:`_drawn`'s loop over the layers of a normal gradient
    without hot sets, compiled: each layer's kept positions
    (:func:`.draws._kept_layer`), then a uniform each turned into its value
    (:func:`.quantile._tail_values`), drawn from ``rng`` in the loop's order
    (the same entries); ``values``: an array of the workload's dtype to
    grow. Returns the positions, the values and each layer's count."""
    counts = np.zeros(starts.shape[0], dtype=np.int64)
    idx, c = np.empty(1024, dtype=np.int64), np.int64(0)
    for layer in range(starts.shape[0]):
        first, top = c, min(T[layer], 1.0)
        idx, c = _kept_layer(rng, sizes[layer], top if top > 0.0 else 0.0, starts[layer], idx, c)
        counts[layer] = c - first
        if c > first:
            values = _room(values, first, c - first)
            r = np.empty(c - first)
            for i in range(c - first):
                r[i] = rng.random()
            _tail(r, 0.0, top, scales[layer], K, values[first:c])
    return idx[:c].copy(), values[:c].copy(), counts


_DRAWN = None
if draws._LAYERS is not None:   # (its helpers compiled)
    _kept_layer, _room, _tail = draws._kept_layer, draws._room, quantile._TAIL
    _DRAWN = njit(_drawn_layers)


def _tail_and_sign(r: np.ndarray, lo: float, top: float) -> tuple[np.ndarray, np.ndarray]:
    """Tail probabilities i.i.d. uniform on [lo, top) and independent fair
    signs (True: positive), from one uniform u = 2 r on [0, 2) each (``r``:
    uniforms on [0, 1)): the sign is u >= 1, the probability u's fraction
    (exact: given the sign, the fraction is uniform on [0, 1)). Half the
    draws of two uniforms."""
    u = 2.0 * r
    up = u >= 1.0
    return lo + (top - lo) * (u - up), up


def _class_values(r: np.ndarray, lo: float, top: float, scale: float, workload, q) -> np.ndarray:
    """One class's drawn values from its uniforms ``r``: sign times the
    layer's scale times the magnitude quantile ``q`` (of log tau) at each tail
    probability (floored at 1e-300), in the workload's dtype. The normal's,
    the default, runs fused and compiled (:func:`.quantile.tail_values`, the
    same operations: at P = 4096 drawing took 29 s of Ok-Topk's iterations)."""
    if workload.distribution == "normal":
        fused = tail_values(r, lo, top, scale, workload.dtype)
        if fused is not None:
            return fused
    tau, up = _tail_and_sign(r, lo, top)
    tau = np.maximum(tau, 1e-300)
    mag = (-ndtri(0.5 * tau) if workload.distribution == "normal" else q(np.log(tau))) * scale
    return (np.where(up, 1.0, -1.0) * mag).astype(workload.dtype)


class _Rest:
    """Values of a sampled gradient's entries below the floor, at any index:
    tau uniform on its class's range below T (hot: (T, k/n), cold: (max(T,
    k/n), 1)), hashed from (seed, iteration, rank, index), so an index always
    gets the same value."""

    def __init__(self, workload, rank, iteration, hot, starts, scales, T, span=()):
        from ..workload import _abs_quantile

        self.q = _abs_quantile(workload.distribution, workload.df)
        self.seeds = [seed_of(workload.seed, _TAG_SAMPLED, iteration, rank, j, *span) for j in (0, 1)]
        self.hot, self.d = hot, workload.k / workload.n
        self.starts, self.scales, self.T, self.dtype = starts, scales, np.minimum(T, 1.0), workload.dtype

    def _uniform(self, seed: int, idx: np.ndarray) -> np.ndarray:
        h = _fmix((idx.astype(np.int64) * 0x9E3779B1 + seed) & _M32, np.bitwise_and)
        return ((h >> 8).astype(np.float64) + 0.5) / float(1 << 24)

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        layer = np.searchsorted(self.starts, idx, side="right") - 1
        lo, hi = self.T[layer], np.ones(len(idx))
        if self.hot is not None:
            is_hot = np.isin(idx, self.hot)
            hi = np.where(is_hot, self.d, 1.0)
            lo = np.where(is_hot, np.minimum(lo, self.d), np.maximum(lo, self.d))
        tau = lo + (hi - lo) * self._uniform(self.seeds[0], idx)
        sign = np.where(self._uniform(self.seeds[1], idx) < 0.5, -1.0, 1.0)
        return (sign * self.q(np.log(tau)) * self.scales[layer]).astype(self.dtype)

