"""The standard normal quantile for sampled gradients, compiled.

:func:`sampled_gradient <simsparse.sampling.gradient.sampled_gradient>` turns every
drawn tail probability into a magnitude, ``|x| = -Phi^-1(tau / 2)``: at
P = 4096 that is half a billion quantiles, and scipy's ``ndtri`` (about
50 ns each here) was the largest part of drawing. :func:`ndtri` is Wichura's
algorithm AS 241 (PPND16; Applied Statistics 37 (1988) 477-484), whose
relative error is about 1e-16: three rational approximations in
``q = p - 1/2`` (centre) or ``r = sqrt(-log p)`` (tails), compiled with numba
into one loop. scipy's ``ndtri`` stays the pure path (inside
``jit.python``); the tests require both to agree to 1e-14 relative.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np

from .jit import njit


def _on_first_use(name: str):
    """Module ``name``, executed on its first attribute access."""
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: scipy.special, imported when first used: it takes 0.15 s, which a command that draws nothing
#: (simsparse --help, report, a config's error, a rank of measure) need not pay
special = sys.modules.get("scipy.special") or _on_first_use("scipy.special")

# AS 241 (PPND16) coefficients, highest power last: centre |q| <= 0.425 (A/B in r = 0.180625 - q^2),
# tails with r = sqrt(-log(min(p, 1-p))) <= 5 (C/D in r - 1.6) and beyond (E/F in r - 5)
_A = (3.3871328727963666080e0, 1.3314166789178437745e2, 1.9715909503065514427e3, 1.3731693765509461125e4,
      4.5921953931549871457e4, 6.7265770927008700853e4, 3.3430575583588128105e4, 2.5090809287301226727e3)
_B = (1.0, 4.2313330701600911252e1, 6.8718700749205790830e2, 5.3941960214247511077e3,
      2.1213794301586595867e4, 3.9307895800092710610e4, 2.8729085735721942674e4, 5.2264952788528545610e3)
_C = (1.42343711074968357734e0, 4.63033784615654529590e0, 5.76949722146069140550e0, 3.64784832476320460504e0,
      1.27045825245236838258e0, 2.41780725177450611770e-1, 2.27238449892691845833e-2, 7.74545014278341407640e-4)
_D = (1.0, 2.05319162663775882187e0, 1.67638483018380384940e0, 6.89767334985100004550e-1,
      1.48103976427480074590e-1, 1.51986665636164571966e-2, 5.47593808499534494600e-4, 1.05075007164441684324e-9)
_E = (6.65790464350110377720e0, 5.46378491116411436990e0, 1.78482653991729133580e0, 2.96560571828504891230e-1,
      2.65321895265761230930e-2, 1.24266094738807843860e-3, 2.71155556874348757815e-5, 2.01033439929228813265e-7)
_F = (1.0, 5.99832206555887937690e-1, 1.36929880922735805310e-1, 1.48753612908506148525e-2,
      7.86869131145613259100e-4, 1.84631831751005468180e-5, 1.42151175831644588870e-7, 2.04426310338993978564e-15)
COEFFICIENTS = np.array([_A, _B, _C, _D, _E, _F])


def _phi_inv(p, K):
    """Phi^-1(p) for one p in (0, 1) (AS 241); K the coefficient rows."""
    q = p - 0.5
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        num, den = K[0, 7], K[1, 7]
        for j in range(6, -1, -1):
            num = num * r + K[0, j]
            den = den * r + K[1, j]
        return q * num / den
    r = np.sqrt(-np.log(p if q < 0 else 1.0 - p))
    a = 2
    if r <= 5.0:
        r -= 1.6
    else:
        r -= 5.0
        a = 4
    num, den = K[a, 7], K[a + 1, 7]
    for j in range(6, -1, -1):
        num = num * r + K[a, j]
        den = den * r + K[a + 1, j]
    return -num / den if q < 0 else num / den


_PHI_INV = njit(_phi_inv, inline="always")


def _as241(p, out, K):
    """out[i] = Phi^-1(p[i]) for p in (0, 1)."""
    for i in range(p.shape[0]):
        out[i] = _PHI_INV(p[i], K)
    return out


def _tail_values(r, lo, top, scale, K, out):
    """A class of a sampled normal gradient's drawn entries, from one uniform
    r[i] on [0, 1) each (:func:`simsparse.sampling.gradient._tail_and_sign`): u = 2 r,
    positive iff u >= 1, tail probability tau = lo + (top - lo)(u - [u >= 1])
    (at least 1e-300), value +-scale * -Phi^-1(tau / 2), stored in ``out``'s
    dtype: the numpy path's operations in its order, fused in one loop."""
    for i in range(r.shape[0]):
        u = 2.0 * r[i]
        up = u >= 1.0
        tau = lo + (top - lo) * (u - (1.0 if up else 0.0))
        if tau < 1e-300:
            tau = 1e-300
        mag = -_PHI_INV(0.5 * tau, K) * scale
        out[i] = (1.0 if up else -1.0) * mag
    return out


_KERNEL = njit(_as241)
_TAIL = njit(_tail_values)


def ndtri(p: np.ndarray) -> np.ndarray:
    """Phi^-1(p) elementwise for p in (0, 1), float64: AS 241 compiled, or scipy's ``ndtri``."""
    p = np.ascontiguousarray(p, dtype=np.float64)
    if _KERNEL is None:
        return special.ndtri(p)
    return _KERNEL(p, np.empty_like(p), COEFFICIENTS)


def tail_values(r: np.ndarray, lo: float, top: float, scale: float, dtype) -> np.ndarray | None:
    """:func:`_tail_values` compiled into a new array of ``dtype``, or None without numba."""
    if _TAIL is None:
        return None
    return _TAIL(r, float(lo), float(top), float(scale), COEFFICIENTS, np.empty(len(r), dtype=dtype))
