"""Exact draws in O(kept): which of m coordinates a coin of probability p
keeps (:func:`_bernoulli`), shared by the sampled gradients of one
iteration (:mod:`.gradient`) and of several (:mod:`.paths`)."""
from __future__ import annotations

import math

import numpy as np

from ..jit import njit


def _bernoulli(rng, m: int, p: float) -> np.ndarray:
    """The ascending positions among 0 .. m-1 kept by independent coin flips
    of probability p, in O(kept): the gaps between kept positions are i.i.d.
    geometric, each ``1 + floor(E / lambda)`` for E standard exponential and
    ``lambda = -log(1 - p)`` (exact: P(gap = g) = (1 - p)^(g - 1) p), as
    numpy's ziggurat draws E in a fifth of the time of its ``geometric``."""
    if p <= 0.0 or m == 0:
        return np.zeros(0, dtype=np.int64)
    if p >= 1.0:
        return np.arange(m, dtype=np.int64)
    scale = -1.0 / math.log1p(-p)
    parts, end = [], -1
    while True:
        want = int(m * p + 6.0 * math.sqrt(m * p) + 16)
        E = rng.standard_exponential(want)
        if _WALK is not None:   # the same walk in one compiled pass
            kept = np.empty(want, dtype=np.int64)
            c, end = _WALK(E, scale, m, end, kept)
            parts.append(kept[:c])
            if end >= m:
                return np.concatenate(parts)
            continue
        # (a gap of m or more ends the draw: capped there, so a tiny p cannot overflow the integers)
        gaps = np.minimum(E * scale, m).astype(np.int64)
        gaps += 1
        pos = end + np.cumsum(gaps)
        parts.append(pos[pos < m])
        if pos[-1] >= m:
            return np.concatenate(parts)
        end = int(pos[-1])


def _walk(E, scale, m, end, kept):
    """The positions ``end + cumsum(1 + floor(min(E * scale, m)))`` below m
    into ``kept`` (ascending); returns (how many, the last position reached)."""
    c = 0
    for i in range(E.shape[0]):
        g = E[i] * scale
        if g > m:
            g = m
        end += np.int64(g) + 1
        if end >= m:
            break
        kept[c] = end
        c += 1
    return c, end


_WALK = njit(_walk)


def kept_in_layers(rng, starts: np.ndarray, sizes: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_bernoulli` for each layer in turn (its positions offset by its
    start), concatenated, and each layer's count: compiled, one call that
    draws from ``rng`` what the loop would, in its order (the same positions)."""
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    if _LAYERS is not None:
        return _LAYERS(rng, starts, sizes, p)
    parts = [a + _bernoulli(rng, int(m), float(q)) for a, m, q in zip(starts.tolist(), sizes.tolist(), p.tolist())]
    counts = np.array([len(x) for x in parts], dtype=np.int64)
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), counts


def _kept_layers(rng, starts, sizes, p):
    """:func:`kept_in_layers` in one loop of :func:`_kept_layer`."""
    counts = np.zeros(starts.shape[0], dtype=np.int64)
    out, c = np.empty(1024, dtype=np.int64), np.int64(0)
    for layer in range(starts.shape[0]):
        first = c
        out, c = _kept_layer(rng, sizes[layer], p[layer], starts[layer], out, c)
        counts[layer] = c - first
    return out[:c].copy(), counts


def _kept_layer(rng, m, q, a, out, c):
    """One layer's :func:`_bernoulli` (m coordinates from ``a``, probability
    q), the same batches of exponentials (``want`` each) walked, appended to
    ``out`` after its first c; returns (out, the new c)."""
    if q <= 0.0 or m == 0:
        return out, c
    if q >= 1.0:
        out = _room(out, c, m)
        for i in range(m):   # (loops, not slice expressions, in these helpers: numba compiles those for seconds)
            out[c + i] = a + i
        return out, c + m
    scale, end = -1.0 / np.log1p(-q), np.int64(-1)
    while end < m:
        want = int(m * q + 6.0 * np.sqrt(m * q) + 16)
        out = _room(out, c, want)
        E = np.empty(want)
        for i in range(want):
            E[i] = rng.standard_exponential()
        k, end = _WALK(E, scale, m, end, out[c:])
        for i in range(c, c + k):
            out[i] += a
        c += k
    return out, c


def _room(out, c, extra):
    """``out`` (its first c filled) with room for ``extra`` more."""
    if c + extra <= out.shape[0]:
        return out
    grown = np.empty(2 * (c + extra), dtype=out.dtype)
    for i in range(c):
        grown[i] = out[i]
    return grown


_LAYERS = None
if _WALK is not None:   # (the loop's helpers are called compiled: rebound to their compiled selves)
    _room = njit(_room)
    _kept_layer = njit(_kept_layer)
    _LAYERS = njit(_kept_layers)


def selected(density: float, n: int) -> int:
    """k of a vector of n entries: round(density n), at least 1 (``Setup.k``)."""
    return max(1, min(n, int(round(density * n))))


def span_layers(workload, layers: tuple | None = None):
    """The layers a sampled vector draws: the whole gradient's, or those of
    the span (first, end) of whole layers (a training schedule's bucket),
    counted from its first element. Returns their sizes, starts and scales,
    and the vector's n and k."""
    from ..workload import layer_scales

    sizes = np.asarray(workload.layers or (workload.n,), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    scales = layer_scales(workload) if workload.layers and workload.layer_spread > 0 else np.ones(len(sizes))
    if layers is not None:
        lo, hi = layers
        sizes, starts, scales = sizes[lo:hi], starts[lo:hi] - starts[lo], scales[lo:hi]
    n = int(sizes.sum())
    return sizes, starts, scales, n, selected(workload.density, n)


_TAG_WIDEN = 2**40 + 11


def salt_of(widen: tuple | None) -> tuple:
    """Entropy that keeps a widened run's draws apart from the run it follows
    (which chose the floors: independent of the draws made with them)."""
    return () if widen is None else (_TAG_WIDEN, *(int(round(1000 * w)) for w in widen))
