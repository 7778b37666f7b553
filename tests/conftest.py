"""Settings for the whole suite. Shared helpers live in tests/helpers.py."""
import os
import sys

from hypothesis import settings


def _bytecode_written():
    """The suite starts a few hundred interpreters (mpiexec ranks, CLI runs, sweep workers, notebook
    kernels). Where PYTHONDONTWRITEBYTECODE is set, each compiled simsparse from source (0.2 s a
    rank, 3 s of each worker's collection). The suite writes bytecode where Python keeps it, beside
    the source (``__pycache__``, ignored by git, where numba's cache already lives), and reads the
    installed packages' from where pip compiled it at install. (A prefix under the temp folder, tried
    before, ignored pip's bytecode: each fresh install compiled its packages again in its first run, and
    a first import of torch, numpy, scipy, pandas, matplotlib, simpy and pydantic took 9.8 s that way, 3.6 s with
    pip's.)"""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        sys.dont_write_bytecode = False


_bytecode_written()

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
