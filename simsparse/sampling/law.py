"""Sampled gradients over several iterations: drift and error feedback.

With ``values: sampled`` a rank draws only the entries it could select
(:mod:`simsparse.sampling`). Over the T iterations a point simulates, a
coordinate's noise follows an AR(1) path ``u_0 .. u_{T-1}`` (``rho = 1 -
drift``, unit variance), and the vector an algorithm selects from holds,
at a coordinate no selection has taken, ``A_t = u_t`` (no error feedback)
or ``A_t = u_0 + ... + u_t`` (error feedback: the residual keeps every
unsent value). ``A`` is Gaussian with covariance ``M U M'`` (``U_st =
rho^|s-t|``, M the running sum or the identity); a layer of scale ``s``
holds ``s A``.

Every iteration t gets a floor ``F_t``, set so that about ``margin x k``
entries of ``s A_t`` reach it. A coordinate of layer l is drawn iff some
``|A_t|`` reaches ``f_t = F_t / s_l`` (probability ``p_l``, the first
exceedance summed over t); its whole path is drawn conditioned on that (a
union proposal: an iteration t* with probability proportional to ``P(|A_t*|
>= f_t*)``, A_t* from that tail, the rest from the Gaussian given it,
accepted with probability one over the number of iterations whose floor
the path reaches: exact). A coordinate not drawn never reaches a floor, so
no selection at or above the floors ever took it and its value at t is
``s A_t`` conditioned on the box ``|A_t| < f_t`` for every t: the vector's
entries at or above ``F_t`` are exactly the drawn ones. What the other
entries contribute is integrated over that box: their sum and sum of
squares (a Gaussian-k threshold's moments, by the central limit theorem,
drawn per iteration), counts above a threshold below the floor (a reused
threshold: conditional binomials per layer, exact in distribution for any
sequence of queries), and values at given indices (paths drawn by rejection
from hashed normals).

Box integrals are Gauss-Legendre products over all coordinates but one,
which is integrated in closed form (the Gaussian given the others): at most
``MAX_ITERATIONS - 1`` dimensions, 24 to 48 nodes each (1e-9 of the drawn
probability on the paper's laws, ``tests/experiments/test_sampled_paths.py``).
Needs normal, unplanted gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from numpy.polynomial import legendre
from scipy import special


#: the most iterations a point may simulate with drifting or error-feedback sampled gradients
MAX_ITERATIONS = 4
#: Gauss-Legendre nodes per dimension of a box integral, by its dimensions
_NODES = {0: 1, 1: 48, 2: 32, 3: 24}


@dataclass(frozen=True)
class PathLaw:
    """A coordinate's vector over T iterations: ``rho`` of the AR(1)
    noise, ``ef``: error feedback (running sums)."""

    rho: float
    ef: bool
    T: int

    @cached_property
    def cov(self) -> np.ndarray:
        t = np.arange(self.T)
        U = self.rho ** np.abs(np.subtract.outer(t, t)).astype(float)
        M = np.tril(np.ones((self.T, self.T))) if self.ef else np.eye(self.T)
        return M @ U @ M.T

    @cached_property
    def chol(self) -> np.ndarray:
        return np.linalg.cholesky(self.cov)

    def given(self, t: int, idx: tuple) -> tuple[np.ndarray, float]:
        """A_t given A_idx: the coefficients of its mean and its standard deviation."""
        return _given(self, t, idx)

    def rest_given(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The other coordinates given A_t = 1: their mean, and the Cholesky
        factor of their covariance (the union proposal's second step)."""
        return _rest_given(self, t)


@lru_cache(maxsize=256)
def _given(law: PathLaw, t: int, idx: tuple) -> tuple[np.ndarray, float]:
    C = law.cov
    if not idx:
        return np.zeros(0), math.sqrt(C[t, t])
    c = C[t, list(idx)]
    coef = np.linalg.solve(C[np.ix_(idx, idx)], c)
    return coef, math.sqrt(max(C[t, t] - c @ coef, 0.0))


@lru_cache(maxsize=64)
def _rest_given(law: PathLaw, t: int) -> tuple[np.ndarray, np.ndarray]:
    C, o = law.cov, [s for s in range(law.T) if s != t]
    mean = C[o, t] / C[t, t]
    S = C[np.ix_(o, o)] - np.outer(C[o, t], C[t, o]) / C[t, t]
    return mean, np.linalg.cholesky(S + 1e-300 * np.eye(len(o)))


def path_law(workload, error_feedback: bool, T: int) -> PathLaw | None:
    """The law to draw a point's gradients with, or None where one draw per
    iteration is exact (a single iteration, independent or static
    gradients without error feedback)."""
    if T <= 1 or (not error_feedback and workload.drift in (0.0, 1.0)):
        return None
    return PathLaw(1.0 - workload.drift, bool(error_feedback), int(T))


def path_problem(workload, error_feedback: bool, T: int) -> str | None:
    """Why gradients that drift or feed back errors over T iterations cannot be sampled, or None."""
    if path_law(workload, error_feedback, T) is None:
        return None
    what = "error feedback" if error_feedback else f"workload.drift = {workload.drift}"
    if workload.distribution != "normal" or workload.planted:
        return (f"{what} over iterations with values: sampled needs normal gradients without planted coordinates "
                f"(overlap, skew): the running sums are integrated as Gaussians")
    if T > MAX_ITERATIONS:
        return (f"{what} with values: sampled integrates each coordinate's path over the iterations simulated; "
                f"this point simulates {T}, at most {MAX_ITERATIONS} are supported")
    if error_feedback and workload.drift == 0:
        return "error feedback with workload.drift = 0 and values: sampled is not supported (a static gradient)"
    return None


# -- box integrals ------------------------------------------------------------------

def _grid(f: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes (N, d) and weights (N,) on the box prod [-f_i, f_i]."""
    d = len(f)
    if d == 0:
        return np.zeros((1, 0)), np.ones(1)
    x, w = _leggauss(n)
    X = np.meshgrid(*[fi * x for fi in f], indexing="ij")
    W = np.meshgrid(*[fi * w for fi in f], indexing="ij")
    return np.stack([g.ravel() for g in X], 1), np.prod(np.stack([g.ravel() for g in W]), 0)


@lru_cache(maxsize=8)
def _leggauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    return legendre.leggauss(n)


def _density(law: PathLaw, X: np.ndarray, idx: list) -> np.ndarray:
    """The Gaussian density of A_idx at the rows of X."""
    if not idx:
        return np.ones(len(X))
    S = law.cov[np.ix_(idx, idx)]
    q = np.einsum("ni,ij,nj->n", X, np.linalg.inv(S), X)
    return np.exp(-0.5 * q) / math.sqrt((2 * math.pi) ** len(idx) * np.linalg.det(S))


def _others(law: PathLaw, f: np.ndarray, t: int):
    """Nodes, weighted densities and A_t's conditional mean and sd over the box of the coordinates but t."""
    o = [s for s in range(law.T) if s != t]
    X, W = _grid(f[o], _NODES[len(o)])
    coef, sd = law.given(t, tuple(o))
    return W * _density(law, X, o), X @ coef, sd


def drawn_probability(law: PathLaw, f: np.ndarray) -> float:
    """P(some |A_t| >= f_t): the first exceedance at each t, summed (no
    cancellation against the box's mass, which is near 1)."""
    p = 0.0
    for t in range(law.T):
        idx = list(range(t))
        X, W = _grid(f[idx], _NODES[t])
        coef, sd = law.given(t, tuple(idx))
        mu = X @ coef
        tail = special.ndtr((-f[t] - mu) / sd) + special.ndtr((mu - f[t]) / sd)
        p += float(np.dot(W * _density(law, X, idx), tail))
    return p


def _trunc_moments(mu, sd, lo, hi, j: int) -> np.ndarray:
    """E[X^j 1{lo < X < hi}] for X ~ N(mu, sd^2), elementwise."""
    a, b = (lo - mu) / sd, (hi - mu) / sd
    pa, pb = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi), np.exp(-0.5 * b * b) / math.sqrt(2 * math.pi)
    m = [special.ndtr(b) - special.ndtr(a), pa - pb]
    for i in range(2, j + 1):   # standard truncated moments: m_i = (i-1) m_{i-2} + a^{i-1} phi(a) - b^{i-1} phi(b)
        m.append((i - 1) * m[i - 2] + a ** (i - 1) * pa - b ** (i - 1) * pb)
    return sum(math.comb(j, i) * mu ** (j - i) * sd ** i * m[i] for i in range(j + 1))


def box_moments(law: PathLaw, f: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """P(box), and per t E[A_t^2 | box] and E[A_t^4 | box] (box: |A_s| < f_s for all s)."""
    P, E2, E4 = 0.0, np.zeros(law.T), np.zeros(law.T)
    for t in range(law.T):
        w, mu, sd = _others(law, f, t)
        P = float(np.dot(w, _trunc_moments(mu, sd, -f[t], f[t], 0)))
        E2[t] = np.dot(w, _trunc_moments(mu, sd, -f[t], f[t], 2))
        E4[t] = np.dot(w, _trunc_moments(mu, sd, -f[t], f[t], 4))
    if not P > 1e-300:   # (every coordinate is drawn: nothing below the floors to average)
        return 0.0, np.zeros(law.T), np.zeros(law.T)
    return P, E2 / P, E4 / P


def tail_in_box(law: PathLaw, f: np.ndarray, t: int, y: np.ndarray) -> np.ndarray:
    """P(y <= |A_t|, box) for each 0 <= y <= f_t."""
    w, mu, sd = _others(law, f, t)
    y = np.asarray(y, float)[:, None]
    mass = _trunc_moments(mu, sd, y, f[t], 0) + _trunc_moments(mu, sd, -f[t], -y, 0)
    return mass @ w
