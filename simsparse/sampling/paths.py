"""Drawing sampled gradients over several iterations (the scheme and its
integrals: :mod:`.law`): a vector's plan (floors, each layer's drawn
probability and moments below the floors), the drawn coordinates' paths
by the union proposal, and what stands for the others (their sums, counts
under a floor, values at given indices)."""
from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache, partial

import numpy as np
from numpy.polynomial import chebyshev

from ..compression.rng import _M32, _fmix, seed_of
from ..compute.sampled import Sampled
from ..jit import njit
from ..quantile import _PHI_INV, COEFFICIENTS, ndtri, special
from .draws import kept_in_layers, salt_of, span_layers
from .box import box_moments, drawn_probability, tail_in_box
from .law import PathLaw

#: Chebyshev nodes of a layer's tail mass below the floor (counts under a reused threshold)
_TAIL_NODES = 17
_TAG_PATHS, _TAG_SUMS, _TAG_BELOW, _TAG_REST = 2**40 + 7, 2**40 + 8, 2**40 + 9, 2**40 + 10


# -- a vector's plan ------------------------------------------------------------------

class PathPlan:
    """Floors F (T,); per layer: start, size, scale, the probability of
    being drawn, and E[A_t^2 | box], E[A_t^4 | box] (L, T; integrated when
    first asked: only a Gaussian-k threshold's moments read them)."""

    def __init__(self, law: PathLaw, F, starts, sizes, scales, p):
        self.law, self.F, self.starts, self.sizes, self.scales = law, F, starts, sizes, scales
        self.p = p
        self._tails: dict = {}
        self._moments: tuple | None = None

        #: per layer its bounds f = F / s and P(|A_t| >= f_t) (L, T)
        self.f = F[None, :] / scales[:, None]
        self.tail = 2 * special.ndtr(-self.f / np.sqrt(np.diag(law.cov)))

    def bounds(self, layer: int) -> np.ndarray:
        return self.f[layer]

    @property
    def E2(self) -> np.ndarray:
        return self.moments()[0]

    @property
    def E4(self) -> np.ndarray:
        return self.moments()[1]

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        if self._moments is None:
            got = [box_moments(self.law, f)[1:] for f in self.f]
            self._moments = (np.array([g[0] for g in got]), np.array([g[1] for g in got]))
        return self._moments

    def tails(self, t: int) -> np.ndarray:
        """Per layer, Chebyshev coefficients of r -> P(|A_t| >= r f_t | box)
        on r in [0, 1] (computed when a threshold first goes below F_t)."""
        if t not in self._tails:
            r = 0.5 * (1 + np.cos(np.pi * (np.arange(_TAIL_NODES) + 0.5) / _TAIL_NODES))
            out = []
            for layer in range(len(self.sizes)):
                f = self.bounds(layer)
                P = max(float(1.0 - self.p[layer]), 1e-300)
                out.append(chebyshev.chebfit(2 * r - 1, tail_in_box(self.law, f, t, r * f[t]) / P, _TAIL_NODES - 1))
            self._tails[t] = np.array(out)
        return self._tails[t]


@lru_cache(maxsize=256)
def path_plan(workload, margin: float, layers: tuple | None, law: PathLaw, widen: tuple | None = None) -> PathPlan:
    """``widen``: per iteration, a factor on the entries its floor admits."""
    sizes, starts, scales, n, k = span_layers(workload, layers)
    sd = np.sqrt(np.diag(law.cov))
    F = np.empty(law.T)
    for t in range(law.T):   # entries of s A_t at or above F_t: about margin x k (under error feedback
        # plus the t k that earlier selections took, which A_t no longer holds: mostly its largest)
        want = min(float(n), (margin + (t if law.ef else 0)) * k * (1.0 if widen is None else widen[t]) + 10.0)
        lo_, hi_ = -30.0, 30.0
        for _ in range(100):
            mid = 0.5 * (lo_ + hi_)
            above = float(np.dot(sizes, 2 * special.ndtr(-math.exp(mid) / (scales * sd[t]))))
            lo_, hi_ = (mid, hi_) if above > want else (lo_, mid)
        F[t] = math.exp(hi_)
    p = np.array([min(1.0, drawn_probability(law, F / s)) for s in scales])
    return PathPlan(law, F, starts, sizes, scales, p)


# -- drawing -------------------------------------------------------------------------

def draw_paths(rng, law: PathLaw, f: np.ndarray, rows: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """One vector A for each entry of ``rows`` (its layer, whose bounds are
    ``f[layer]``, (L, T); ``tail[layer, t] = P(|A_t| >= f_t)``), conditioned
    on some |A_t| >= f_t: the union proposal of the module docstring
    (exact), in rounds over the rows not yet accepted, each round's
    uniforms (m, 4) and then its normals (m, T - 1) from ``rng``. Compiled,
    the rounds run in one call that draws from ``rng`` itself, in the same
    order: the same vectors (:func:`_rounds`); else numpy (:func:`_round_numpy`)."""
    N, T = len(rows), law.T
    sd = np.sqrt(np.diag(law.cov))
    cum = np.cumsum(tail, axis=1)
    means = np.zeros((T, T))           # row t: A_s / A_t for s != t (0 at t)
    chol = np.zeros((T, T, T - 1))     # [t, s, j]: the others' Cholesky factor, 0 at s = t
    for t in range(T):
        o = [s for s in range(T) if s != t]
        mean, L = law.rest_given(t)
        means[t, o], chol[t, o] = mean, L
    out = np.empty((N, T))
    if _ROUNDS is not None:
        return _ROUNDS(rng, np.ascontiguousarray(rows, dtype=np.int64), f, tail, cum, sd, means, chol, COEFFICIENTS, out)
    todo = np.arange(N)
    while len(todo):
        m = len(todo)
        r = rng.random((m, 4))          # the iteration t*, A_t*'s tail, its sign, the acceptance
        z = rng.standard_normal((m, T - 1))
        layer = rows[todo]
        A, keep = np.empty((m, T)), np.empty(m, dtype=np.bool_)
        _round_numpy(layer, f, tail, cum, sd, means, chol, r, z, COEFFICIENTS, A, keep)
        out[todo[keep]] = A[keep]
        todo = todo[~keep]
    return out


def _round(layer, f, tail, cum, sd, means, chol, r, z, K, A, keep):
    """Row i: t* = the first t with cum[t] >= r0 * cum[-1]; |A_t*| = sd_t* *
    -Phi^-1(tail_t* r1 / 2), its sign r2 < 1/2; the others their mean given
    A_t* plus the Cholesky factor times z; kept iff r3 * (iterations whose
    bound it reaches) < 1."""
    T = A.shape[1]
    for i in range(A.shape[0]):
        l = layer[i]
        x = r[i, 0] * cum[l, T - 1]
        t = 0
        while t < T - 1 and cum[l, t] < x:
            t += 1
        u = r[i, 1]
        if u < 1e-300:
            u = 1e-300
        a = -sd[t] * _PHI_INV(0.5 * tail[l, t] * u, K)
        if r[i, 2] >= 0.5:
            a = -a
        reach = 0
        for s in range(T):
            v = a * means[t, s]
            for j in range(T - 1):
                v += chol[t, s, j] * z[i, j]
            if s == t:
                v = a
            A[i, s] = v
            if abs(v) >= f[l, s]:
                reach += 1
        keep[i] = r[i, 3] * reach < 1.0


def _round_numpy(layer, f, tail, cum, sd, means, chol, r, z, K, A, keep):
    """:func:`_round` in numpy, the same operations in the same order."""
    T = A.shape[1]
    c = cum[layer]
    t = np.minimum(np.count_nonzero(c[:, :T - 1] < (r[:, 0] * c[:, T - 1])[:, None], axis=1), T - 1)
    a = -sd[t] * ndtri(0.5 * tail[layer, t] * np.maximum(r[:, 1], 1e-300))
    a = np.where(r[:, 2] >= 0.5, -a, a)
    for s in range(T):
        v = a * means[t, s]
        for j in range(T - 1):
            v = v + chol[t, s, j] * z[:, j]
        A[:, s] = np.where(t == s, a, v)
    reach = np.count_nonzero(np.abs(A) >= f[layer], axis=1)
    keep[:] = r[:, 3] * reach < 1.0


def _rounds(rng, rows, f, tail, cum, sd, means, chol, K, out):
    """:func:`draw_paths`' rounds in one compiled call: each round's uniforms
    and normals drawn from ``rng`` in the order of numpy's ``rng.random((m,
    4))`` and ``rng.standard_normal((m, T - 1))`` (numba's Generator draws
    numpy's streams), then :func:`_round`, the rows kept written out."""
    N, T = rows.shape[0], out.shape[1]
    todo = np.arange(N)
    r, z = np.empty((N, 4)), np.empty((N, max(T - 1, 1)))
    A, keep = np.empty((N, T)), np.empty(N, dtype=np.bool_)
    m = N
    while m:
        for i in range(m):
            for j in range(4):
                r[i, j] = rng.random()
        for i in range(m):
            for j in range(T - 1):
                z[i, j] = rng.standard_normal()
        layer = rows[todo[:m]]
        _ROUND(layer, f, tail, cum, sd, means, chol, r[:m], z[:m], K, A[:m], keep[:m])
        left = 0
        for i in range(m):
            if keep[i]:
                for j in range(T):   # (not a row assignment: its shape check compiled for 1.4 s)
                    out[todo[i], j] = A[i, j]
            else:
                todo[left] = todo[i]
                left += 1
        m = left
    return out


_ROUND = njit(_round)
_ROUNDS = None if _ROUND is None else njit(_rounds)


def values_at(A: np.ndarray, law: PathLaw, t: int) -> np.ndarray:
    """The gradient's noise u_t from the vectors A (running sums under error feedback)."""
    if law.ef and t > 0:
        return A[:, t] - A[:, t - 1]
    return A[:, t]


def path_gradient(workload, rank: int, it: int, margin: float, layers: tuple | None, law: PathLaw,
                  widen: tuple | None = None, kept: dict | None = None) -> Sampled:
    """Rank's vector at iteration ``it`` of the paths (module docstring): the
    gradient's values at the drawn coordinates, the floor ``F_it``; under
    error feedback it ``accumulates``: adding the last residual gives the
    vector the algorithm selects from, whose other entries are ``s A_it``;
    ``widen``: the floors' factors (:func:`simsparse.sampling.widened`), with
    draws of their own; ``kept``: where a rank's paths wait from its first
    iteration to its last (drawn once, not at each: the same values)."""
    plan = path_plan(workload, margin, layers, law, widen)
    span = (() if layers is None else (layers[0] + 1,)) + salt_of(widen)
    drawn = partial(_shared, (workload, rank, margin, layers, law, widen), partial(_paths, workload, rank, plan, span))
    idx, undrawn, values = _kept(kept, (rank, span), it == law.T - 1, drawn)
    n = int(plan.sizes.sum())
    rest_sums = _RestSums(plan, it, undrawn, [workload.seed, _TAG_SUMS, it, rank, *span])
    seed = seed_of(workload.seed, _TAG_REST, rank, *span)
    return Sampled(n, idx, values[it], float(plan.F[it]), _PathRest(plan, it, seed, workload.dtype), None,
                   undrawn=rest_sums, below=_Below(plan, it, undrawn, seed_of(workload.seed, _TAG_BELOW, it, rank, *span)),
                   accumulates=law.ef)


def _kept(kept: dict | None, key, last: bool, draw):
    """``kept[key]``, drawn first if absent; removed at the last use (None: nothing kept, drawn each time)."""
    if kept is None:
        return draw()
    got = kept.pop(key, None) if last else kept.get(key)
    if got is None:
        got = draw()
        if not last:
            kept[key] = got
    return got


#: the most a process keeps of ranks' paths for the points after (:func:`_shared`)
SHARED_PATHS_MAX_B = 512 << 20
_SHARED: OrderedDict = OrderedDict()
_shared_B = [0]


def _shared(key: tuple, draw):
    """A rank's paths drawn for an earlier point of this process with the
    same ``key`` (workload, rank, margin, span, law, widening: they do not
    depend on P or the algorithm, so TopkA, TopkDSA and gTopk of one config,
    and the ranks of every smaller P, draw alike), else ``draw()``; the
    least recently used are let go past ``SHARED_PATHS_MAX_B``, and a rank's
    paths over an eighth of it are not kept."""
    got = _SHARED.get(key)
    if got is not None:
        _SHARED.move_to_end(key)
        return got
    got = draw()
    size = sum(a.nbytes for a in got)
    if size <= SHARED_PATHS_MAX_B // 8:
        _SHARED[key] = got
        _shared_B[0] += size
        while _shared_B[0] > SHARED_PATHS_MAX_B:
            _shared_B[0] -= sum(a.nbytes for a in _SHARED.popitem(last=False)[1])
    return got


def _paths(workload, rank: int, plan: PathPlan, span: tuple):
    """A rank's paths (the same at every iteration): the indices drawn, each
    layer's count not drawn, and the gradient's values there at every
    iteration ((T, N) in the workload's dtype)."""
    law = plan.law
    rng = np.random.default_rng([workload.seed, _TAG_PATHS, rank, *span])
    idx, counts = kept_in_layers(rng, plan.starts, plan.sizes, plan.p)
    n = int(plan.sizes.sum())
    rows = np.repeat(np.arange(len(counts)), counts)   # each drawn coordinate's layer
    A = draw_paths(rng, law, plan.f, rows, plan.tail)
    scale = plan.scales[rows]
    values = np.stack([(scale * values_at(A, law, t)).astype(workload.dtype) for t in range(law.T)])
    idx = idx.astype(np.int32 if n < 2**31 else np.int64)
    undrawn = plan.sizes - counts
    for a in (idx, undrawn, values):
        a.setflags(write=False)
    return idx, undrawn, values


class _RestSums:
    """The sum and the sum of squares of the entries not drawn (by the
    central limit theorem; mean 0: the box is symmetric), as the pair
    :class:`~simsparse.compute.sampled.Sampled` unpacks, drawn from their
    own stream when first unpacked (only a Gaussian-k threshold's moments
    do: the plan's moments below the floors are integrated then)."""

    __slots__ = ("plan", "it", "undrawn", "seed", "_pair")

    def __init__(self, plan: PathPlan, it: int, undrawn: np.ndarray, seed: list):
        self.plan, self.it, self.undrawn, self.seed, self._pair = plan, it, undrawn, seed, None

    def __iter__(self):
        if self._pair is None:
            plan, it, undrawn = self.plan, self.it, self.undrawn
            s2 = plan.scales ** 2
            e2 = undrawn * s2 * plan.E2[:, it]
            v4 = undrawn * s2 * s2 * np.maximum(plan.E4[:, it] - plan.E2[:, it] ** 2, 0.0)
            sums = np.random.default_rng(self.seed)
            self._pair = (float(sums.normal(0.0, math.sqrt(e2.sum()))),
                          float(e2.sum() + sums.normal(0.0, math.sqrt(v4.sum()))))
        return iter(self._pair)


class _PathRest:
    """Values of the entries not drawn, at any index: ``s A_it`` of a path
    conditioned on the box, by rejection from normals hashed from (seed,
    index, attempt, t), so an index always gets the same path."""

    def __init__(self, plan: PathPlan, it: int, seed: int, dtype):
        self.plan, self.it, self.seed, self.dtype = plan, it, seed, dtype

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        plan, T = self.plan, self.plan.law.T
        layer = np.searchsorted(plan.starts, idx, side="right") - 1
        f = plan.F[None, :] / plan.scales[layer][:, None]
        out = np.full(len(idx), np.nan)
        todo = np.arange(len(idx))
        for attempt in range(64):
            h = [_fmix((idx[todo].astype(np.int64) * 0x9E3779B1 + seed_of(self.seed, attempt, t)) & _M32,
                       np.bitwise_and) for t in range(T)]
            z = special.ndtri(((np.stack(h, 1) >> 8).astype(np.float64) + 0.5) / float(1 << 24))
            A = z @ plan.law.chol.T
            inside = np.all(np.abs(A) < f[todo], axis=1)
            out[todo[inside]] = A[inside, self.it]
            todo = todo[~inside]
            if not len(todo):
                break
        return (np.nan_to_num(out) * plan.scales[layer]).astype(self.dtype)


class _Below:
    """How many entries not drawn reach a threshold under the floor: per
    layer a count, drawn as a binomial between the counts already drawn at
    the nearest thresholds below and above (0: every entry not drawn;
    F_it: none), so every sequence of queries has the full draw's joint
    distribution of counts."""

    def __init__(self, plan: PathPlan, it: int, undrawn: np.ndarray, seed: int):
        self.plan, self.it = plan, it
        self.known = {0.0: undrawn, float(plan.F[it]): np.zeros_like(undrawn)}
        self.rng = np.random.default_rng(seed)

    def _mass(self, thr: float) -> np.ndarray:
        """Per layer P(|s A_it| >= thr | box)."""
        if thr <= 0.0:
            return np.ones(len(self.plan.sizes))
        r = min(thr / float(self.plan.F[self.it]), 1.0)
        coef = self.plan.tails(self.it)
        return np.clip(chebyshev.chebval(2 * r - 1, coef.T), 0.0, 1.0)

    def count(self, thr: float) -> int:
        thr = max(float(thr), 0.0)
        if thr not in self.known:
            keys = sorted(self.known)
            i = np.searchsorted(keys, thr)
            a, b = keys[i - 1], keys[i]
            ma, mb, mq = self._mass(a), self._mass(b), self._mass(thr)
            share = np.where(ma > mb, (mq - mb) / np.maximum(ma - mb, 1e-300), 0.0)
            ca, cb = self.known[a], self.known[b]
            self.known[thr] = cb + self.rng.binomial(ca - cb, np.clip(share, 0.0, 1.0))
        return int(self.known[thr].sum())
