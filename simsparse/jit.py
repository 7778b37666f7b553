"""numba for the hot paths, each with its Python twin.

Every compiled path (the max-min solver, the alpha-beta replay and waves,
the split and reduce's sums, the normal quantile of sampled gradients, the
Dragonfly's route choice) keeps its pure numpy/Python twin. The tests run
both and require the same results: the replay's twins are evaluators of
their own (``evaluation: replay`` and ``replay_py``), the kernels' twins run
inside :func:`python`. No setting of a user's chooses between them.

numba is imported on the first call of a compiled function, not before:
importing it (and the scipy it loads) takes about 0.45 s, which every rank
of the real backend, every CLI command and every worker of a sweep paid
though none of them runs compiled code. A compiled function is a
:class:`Lazy` until then; compiled code that calls another one by its
global name sees its dispatcher (numba types a :class:`Lazy` as the
dispatcher it stands for).
"""
from __future__ import annotations

import importlib.util
import warnings
from contextlib import contextmanager

#: numba is installed (found without importing it)
AVAILABLE = importlib.util.find_spec("numba") is not None

_on = [AVAILABLE]
#: functions :func:`jitable` marked before numba was imported: registered when it is
_pending: list = []
_loaded: list = []


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


def numba():
    """The numba module, imported on first use with the hooks :class:`Lazy` and :func:`jitable` need."""
    if _loaded:
        return _loaded[0]
    import numba as nb
    from numba.core.typing.typeof import typeof_impl
    from numba.extending import register_jitable

    @typeof_impl.register(Lazy)
    def _typeof_lazy(val, c):   # compiled code calling a Lazy by name calls its dispatcher
        return typeof_impl(val.dispatcher(), c)

    quiet_inlining(nb)
    for fn, options in _pending:
        _register(register_jitable, fn, options)
    _pending.clear()
    _loaded.append(nb)
    return nb


def quiet_inlining(nb) -> None:
    """Silence numba's pedantic SSA check on functions inlined with
    ``inline="always"`` (numba#7802: the inliner leaves the callee's variables
    out of the caller's scope, and the check says so at every compile, with a
    request to report it). The compiled replay and waves that inline the
    ports are held equal to their Python twins to the bit by the tests."""
    warnings.filterwarnings("ignore", message=r".*variable '.*' is not in scope",
                            category=nb.core.errors.NumbaIRAssumptionWarning)


class Lazy:
    """``numba.njit(cache=True, **options)(fn)``, built (imported, and compiled
    or loaded from the disk cache) on its first call."""

    __slots__ = ("fn", "options", "_dispatcher", "__weakref__")

    def __init__(self, fn, options: dict):
        self.fn, self.options, self._dispatcher = fn, options, None

    def dispatcher(self):
        if self._dispatcher is None:
            self._dispatcher = numba().njit(cache=True, **self.options)(self.fn)
        return self._dispatcher

    def __call__(self, *args):
        return (self._dispatcher or self.dispatcher())(*args)

    def __repr__(self) -> str:
        return f"<compiled {self.fn.__qualname__}>"


def njit(fn, **options):
    """``fn`` compiled (cached on disk, compiled on its first call), or None without numba."""
    return Lazy(fn, options) if AVAILABLE else None


def _register(register_jitable, fn, options: dict) -> None:
    register_jitable(**options)(fn) if options else register_jitable(fn)   # (it takes a function or options)


def jitable(fn=None, **options):
    """``fn`` as it is for Python, and callable from compiled code (numba's
    ``register_jitable``, once numba is imported, with ``options``:
    ``inline="always"`` for a small function a hot loop calls): one source
    for a rule both use."""
    if fn is None:
        return lambda f: jitable(f, **options)
    if AVAILABLE:
        if _loaded:
            from numba.extending import register_jitable
            _register(register_jitable, fn, options)
        else:
            _pending.append((fn, options))
    return fn
