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

The integrals over the box: :mod:`.box`.
Needs normal, unplanted gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np


#: the most iterations a point may simulate with drifting or error-feedback sampled gradients
MAX_ITERATIONS = 4


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
