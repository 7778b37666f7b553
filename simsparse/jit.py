"""numba for the hot paths, behind one switch.

Every compiled path (the max-min solver, the alpha-beta bulk replay, the
normal quantile of sampled gradients) keeps its pure numpy/Python twin,
which runs without numba or with ``SIMSPARSE_NUMBA=0``; the tests compare
the two.
"""
from __future__ import annotations

import os

try:
    import numba
except ImportError:   # pragma: no cover - numba is a core dependency
    numba = None


def enabled() -> bool:
    """Whether compiled paths run: numba installed and ``SIMSPARSE_NUMBA`` not ``0`` (read now)."""
    return numba is not None and os.environ.get("SIMSPARSE_NUMBA", "1") != "0"


def njit(fn, **options):
    """``fn`` compiled (cached on disk, compiled on its first call), or None where :func:`enabled` is false."""
    return numba.njit(cache=True, **options)(fn) if enabled() else None


def jitable(fn):
    """``fn`` as it is for Python, and callable from compiled code (numba's
    ``register_jitable``): one source for a rule both use."""
    if numba is None:   # pragma: no cover - numba is a core dependency
        return fn
    from numba.extending import register_jitable
    return register_jitable(fn)
