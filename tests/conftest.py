import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point

HAVE_MPI = all(importlib.util.find_spec(m) for m in ("mpi4py", "torch")) and (
    (Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec") is not None)
HAVE_TORCH = importlib.util.find_spec("torch") is not None

ALPHA, BW = 2.0e-6, 1.0e9


def make_point(algorithm, P, n=1024, density=0.05, params=None, alpha=ALPHA, bw=BW, eager=65536,
               iterations=1, warmup=0, seed=0, compute=None, values="full", **net):
    """A bare-collective point; ``values="full"`` so results are checked (size-only runs skip the check)."""
    return Point(algorithm=algorithm, P=P, params=params or {},
                 workload={"n": n, "density": density, "dtype": "float32", "seed": seed},
                 network={"model": "alphabeta", "alpha_s": alpha, "bandwidth_Bps": bw, "eager_threshold_B": eager,
                          **net},
                 compute=compute, iterations=iterations, warmup=warmup, check=True, values=values)


def simulate(algorithm, P, **kw):
    """Simulate one point; returns (results row, per-rank results of the last iteration)."""
    out = simulate_point(make_point(algorithm, P, **kw), keep_results=True)
    return out.row, out.results


requires_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs the [mpi] extra (mpi4py, torch, mpiexec)")
requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")


# Property tests draw the same examples on every run, so CI is deterministic;
# HYPOTHESIS_EXPLORE=1 draws fresh random examples (and more of them) to hunt bugs.
from hypothesis import settings as _hsettings  # noqa: E402
import os as _os  # noqa: E402

_hsettings.register_profile("ci", derandomize=True, deadline=None)
_hsettings.register_profile("explore", max_examples=300, deadline=None)
_hsettings.load_profile("explore" if _os.environ.get("HYPOTHESIS_EXPLORE") else "ci")
