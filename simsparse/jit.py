"""numba for the hot paths, each with its Python twin.

Every compiled path (the max-min solver, the alpha-beta replay and waves,
the split and reduce's sums, the normal quantile of sampled gradients, the
Dragonfly's route choice) keeps its pure numpy/Python twin. The tests run
both and require the same results: the replay's twins are evaluators of
their own (``evaluation: replay`` and ``replay_py``), the kernels' twins run
inside :func:`python`. No setting of a user's chooses between them.
"""
from __future__ import annotations

from contextlib import contextmanager

try:
    import numba
except ImportError:   # pragma: no cover - numba is a core dependency
    numba = None

_on = [numba is not None]


def enabled() -> bool:
    """Whether compiled paths run (numba is installed, and not inside :func:`python`)."""
    return _on[0]


@contextmanager
def python():
    """Run the Python twins of the compiled kernels inside (their tests)."""
    was = _on[0]
    _on[0] = False
    try:
        yield
    finally:
        _on[0] = was


def njit(fn, **options):
    """``fn`` compiled (cached on disk, compiled on its first call), or None without numba."""
    return numba.njit(cache=True, **options)(fn) if numba is not None else None


def jitable(fn):
    """``fn`` as it is for Python, and callable from compiled code (numba's
    ``register_jitable``): one source for a rule both use."""
    if numba is None:   # pragma: no cover - numba is a core dependency
        return fn
    from numba.extending import register_jitable
    return register_jitable(fn)
