"""Integrals of a coordinate's path law (:class:`.law.PathLaw`: A Gaussian,
covariance ``cov``) over the box ``|A_s| < f_s`` below the floors, and over
the regions where a path first leaves it.

Nested Gauss-Legendre rules: one coordinate at a time given those before
(its conditional mean and standard deviation), on its interval clipped to
``REACH`` standard deviations about that mean, the tightest bound (f_s over
the standard deviation) outermost and the widest in closed form (the
Gaussian given the others). A coordinate nested inside one its value
follows makes the outer integrand a step; a product grid over [-f, f] had
left the running sums' narrow ridge unresolved and, where a layer's scale
puts the floors 100 standard deviations out, nodes where the Gaussian has
no mass (E[A^2 | box] = 2.7e4 for a variance of 1). At most
``MAX_ITERATIONS - 1`` dimensions, 24 to 48 nodes each: the box's mass and
the drawn probability sum to 1 within 1e-7 for bounds from half a standard
deviation to 200, alike or mixed over the iterations
(``tests/experiments/test_sampled_paths.py``).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.polynomial import legendre

from ..quantile import special
from .law import PathLaw

#: Gauss-Legendre nodes per dimension of a nested rule, by its dimensions
_NODES = {0: 1, 1: 48, 2: 32, 3: 24}
#: a coordinate is integrated over its interval clipped to this many standard deviations
#: about its conditional mean (the Gaussian's mass beyond: 8e-11)
REACH = 6.5


@lru_cache(maxsize=8)
def _leggauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    return legendre.leggauss(n)


def _tightness(law: PathLaw, f: np.ndarray, s: int) -> float:
    return f[s] / math.sqrt(law.cov[s, s])


def _region(law: PathLaw, f: np.ndarray, coords: list, first: tuple | None = None):
    """The nested rule over ``|A_s| < f_s`` for s in ``coords``, the other
    coordinates marginalised out; ``first``: (coordinate, positions,
    weights), a fixed rule for one more coordinate, outermost (a tail or a
    band of it). Returns nodes X (N, d) in the order ``outer``, weights W
    (densities included), and the closed-form coordinate ``c`` (the widest of
    coords) with its conditional mean and standard deviation at each node."""
    c = max(coords, key=lambda s: _tightness(law, f, s))
    inner = sorted((s for s in coords if s != c), key=lambda s: _tightness(law, f, s))
    X, W, outer, root = np.zeros((1, 0)), np.ones(1), [], np.zeros(1, dtype=np.int64)
    if first is not None:
        i, xs, ws = first
        sd = math.sqrt(law.cov[i, i])
        X, W, outer = xs[:, None], ws * np.exp(-0.5 * (xs / sd) ** 2) / (math.sqrt(2 * math.pi) * sd), [i]
        root = np.arange(len(xs))
    if inner:
        x, w = _leggauss(_NODES[len(outer) + len(inner)])
        for i in inner:
            coef, sd = law.given(i, tuple(outer))
            mu = X @ coef
            lo, hi = np.maximum(-f[i], mu - REACH * sd), np.minimum(f[i], mu + REACH * sd)
            half = np.maximum(hi - lo, 0.0)[:, None] / 2
            xi = (hi + lo)[:, None] / 2 + half * x
            z = (xi - mu[:, None]) / sd
            W = (W[:, None] * half * w * np.exp(-0.5 * z * z) / (math.sqrt(2 * math.pi) * sd)).ravel()
            X = np.concatenate([np.repeat(X, len(x), axis=0), xi.reshape(-1, 1)], axis=1)
            live = W > 0
            X, W, root = X[live], W[live], np.repeat(root, len(x))[live]
            outer.append(i)
    coef, sd = law.given(c, tuple(outer))
    return X, W, outer, c, X @ coef, sd, root


def _rule(lo: float, hi: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre positions and weights on [lo, hi]."""
    x, w = _leggauss(n)
    half = max(hi - lo, 0.0) / 2
    return (hi + lo) / 2 + half * x, half * w


def _trunc_moments(mu, sd, lo, hi, js: tuple = (0,)) -> list:
    """E[X^j 1{lo < X < hi}] for X ~ N(mu, sd^2), elementwise, for each j in ``js``."""
    a, b = (lo - mu) / sd, (hi - mu) / sd
    if max(js) == 0:   # (the mass alone: the tails' and the drawn probability's case)
        return [special.ndtr(b) - special.ndtr(a)] * len(js)
    pa, pb = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi), np.exp(-0.5 * b * b) / math.sqrt(2 * math.pi)
    m = [special.ndtr(b) - special.ndtr(a), pa - pb]
    for i in range(2, max(js) + 1):   # standard truncated moments: m_i = (i-1) m_{i-2} + a^{i-1} phi(a) - b^{i-1} phi(b)
        m.append((i - 1) * m[i - 2] + a ** (i - 1) * pa - b ** (i - 1) * pb)
    return [sum(math.comb(j, i) * mu ** (j - i) * sd ** i * m[i] for i in range(j + 1)) for j in js]


def _bounded(law: PathLaw, f: np.ndarray, coords: list) -> list:
    """The coordinates of ``coords`` whose bound lies within ``REACH``
    standard deviations: the others are marginalised out (each one's mass
    beyond its bound is at most 8e-11)."""
    return [s for s in coords if _tightness(law, f, s) < REACH]


def _wide(law: PathLaw, f: np.ndarray) -> bool:
    """Whether every bound lies ``REACH`` standard deviations out: the box
    holds all but 1e-9 of the mass, its integrals are the Gaussian's own."""
    return bool(np.all(f >= REACH * np.sqrt(np.diag(law.cov))))


def drawn_probability(law: PathLaw, f: np.ndarray) -> float:
    """P(some |A_t| >= f_t): the first exceedance at each t (twice the upper
    tail: the law and the box are symmetric), summed (no cancellation
    against the box's mass, which is near 1)."""
    p = 2 * float(special.ndtr(-_tightness(law, f, 0)))
    for t in range(1, law.T):
        reach = max(f[t], REACH * math.sqrt(law.cov[t, t]))
        X, W, _, c, mu, sd, _ = _region(law, f, list(range(t)), (t, *_rule(f[t], reach, _NODES[t])))
        p += 2 * float(np.dot(W, _trunc_moments(mu, sd, -f[c], f[c])[0]))
    return p


def _box(law: PathLaw, f: np.ndarray, moments: bool = False):
    """P(box); with ``moments``, per t E[A_t^2; box] and E[A_t^4; box] too."""
    X, W, outer, c, mu, sd, _ = _region(law, f, list(range(law.T)))
    m0, m2, m4 = _trunc_moments(mu, sd, -f[c], f[c], (0, 2, 4) if moments else (0, 0, 0))
    P = float(np.dot(W, m0))
    if not moments:
        return P
    E2, E4 = np.zeros(law.T), np.zeros(law.T)
    Wm = W * m0
    for j, s in enumerate(outer):
        x2 = X[:, j] ** 2
        E2[s], E4[s] = np.dot(Wm, x2), np.dot(Wm, x2 * x2)
    E2[c], E4[c] = np.dot(W, m2), np.dot(W, m4)
    return P, E2, E4


def box_moments(law: PathLaw, f: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """P(box), and per t E[A_t^2 | box] and E[A_t^4 | box] (box: |A_s| < f_s for all s)."""
    if _wide(law, f):
        var = np.diag(law.cov).copy()
        return 1.0, var, 3 * var * var
    P, E2, E4 = _box(law, f, moments=True)
    if not P > 1e-300:   # (every coordinate is drawn: nothing below the floors to average)
        return 0.0, np.zeros(law.T), np.zeros(law.T)
    return P, E2 / P, E4 / P


#: Gauss-Legendre nodes of each band between the thresholds of :func:`tail_in_box` (bands of at
#: most half a standard deviation: 5 nodes are within 1e-12 of 8 on the Ok-Topk paper's BERT layers)
_BAND_NODES = 5


def tail_in_box(law: PathLaw, f: np.ndarray, t: int, y: np.ndarray) -> np.ndarray:
    """P(y <= |A_t|, box) for each 0 <= y <= f_t: A_t outermost, the bands
    between consecutive thresholds (and f_t, or ``REACH`` standard deviations)
    each with a rule of its own, the masses summed from the top."""
    y = np.asarray(y, float)
    sd = math.sqrt(law.cov[t, t])
    others = _bounded(law, f, [s for s in range(law.T) if s != t])
    if not others:
        return 2 * (special.ndtr(-y / sd) - special.ndtr(-f[t] / sd))
    top = min(f[t], REACH * sd)
    # the bands: between the thresholds, and no wider than half a standard deviation (the others' bounds,
    # nested inside A_t, make its integrand a step where a tight one follows it closely)
    edges = np.unique(np.concatenate([np.minimum(y, top), np.linspace(0.0, top, int(math.ceil(top / (0.5 * sd))) + 1)]))
    rules = [_rule(a, b, _BAND_NODES) for a, b in zip(edges[:-1], edges[1:])]
    xs, ws = np.concatenate([r[0] for r in rules]), np.concatenate([r[1] for r in rules])
    _, W, _, c, mu, sd_c, root = _region(law, f, others, (t, xs, ws))
    mass = W * _trunc_moments(mu, sd_c, -f[c], f[c])[0]
    per_band = np.bincount(root // _BAND_NODES, weights=mass, minlength=len(rules))
    above = np.append(2 * np.cumsum(per_band[::-1])[::-1], 0.0)   # the mass above each edge
    return above[np.searchsorted(edges, np.minimum(y, top))]
