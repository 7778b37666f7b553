"""Settings for the whole suite. Shared helpers live in tests/helpers.py."""
import os
import sys
import tempfile

from hypothesis import settings


def _bytecode_outside_the_tree():
    """The suite starts a few hundred interpreters (mpiexec ranks, CLI runs, sweep workers), and
    each compiled simsparse from source when PYTHONDONTWRITEBYTECODE is set: 0.2 s a rank, 3 s of
    each worker's collection. Where it is set and no PYTHONPYCACHEPREFIX is, the suite keeps its
    bytecode under the temp folder instead, so the checkout stays as clean as the setting asks.
    The prefix holds everything the suite imports, the installed packages' too (about 140 MB), so
    the first run after a fresh install compiles those once."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = os.path.join(tempfile.gettempdir(), f"simsparse-pycache-{os.getuid()}")
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix


_bytecode_outside_the_tree()

# Property tests draw the same examples on every run, so CI is deterministic;
# HYPOTHESIS_EXPLORE=1 draws fresh random examples (and more of them) to hunt bugs.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=300, deadline=None)
settings.load_profile("explore" if os.environ.get("HYPOTHESIS_EXPLORE") else "ci")


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (modules, test items) lives for the whole
    session: freeze it, so that the full collections some points ask for (experiments/run/
    simulate.py) traverse only what the tests allocate. Without this, each one walked the whole
    suite's heap: 8 of the papers smoke test's 40 s."""
    import gc
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """``slow``: what the edit-test loop (``pytest -m "not slow"``) leaves to the full run: every
    test under mpiexec (``mpi``), every notebook, and the tests marked ``slow`` themselves."""
    import pytest

    for item in items:
        if item.get_closest_marker("mpi") or item.nodeid.endswith(".ipynb") or ".ipynb::" in item.nodeid:
            item.add_marker(pytest.mark.slow)
