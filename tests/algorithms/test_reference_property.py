"""Every algorithm against its numpy reference on random cases: shapes, P
(non-powers of two included), densities, dtypes, error feedback, several
iterations, and gradients with many ties among magnitudes (few distinct
values, zeros, both signs). The experiment loop's own check decides
(:func:`simsparse.experiments.run.loop.check`). A few dozen fixed cases by
default; ``SIMSPARSE_FUZZ=long`` draws at least 1000 fresh ones."""
import os

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simsparse.algorithms import ALGORITHMS
from simsparse.algorithms.base import SparseParams
from simsparse.experiments.run.loop import run_point
from simsparse.experiments.config.point import Point

from tests.helpers import sim_backend

LONG = os.environ.get("SIMSPARSE_FUZZ") == "long"
NAMES = sorted(ALGORITHMS)


class TiedGradients:
    """Per-rank gradients of a random mix: smooth values, a few repeated magnitudes, zeros."""

    def __init__(self, n: int, dtype: str, seed: int, tie_fraction: float, levels: int):
        self.n, self.dtype, self.seed, self.tie_fraction, self.levels = n, dtype, seed, tie_fraction, levels

    def grads(self, P: int, it: int) -> list:
        out = []
        for r in range(P):
            rng = np.random.default_rng([self.seed, r, it])
            g = rng.standard_normal(self.n)
            tied = rng.random(self.n) < self.tie_fraction
            g[tied] = rng.integers(-self.levels, self.levels + 1, int(tied.sum())) * 0.5
            out.append(g.astype(self.dtype))
        return out


@st.composite
def cases(draw):
    name = draw(st.sampled_from(NAMES))
    P = draw(st.integers(1, 12))
    n = draw(st.integers(max(P, 8), 2500))
    params = {}
    if issubclass(ALGORITHMS[name].Params, SparseParams) and draw(st.booleans()):
        params["error_feedback"] = True
    point = Point(algorithm=name, P=P, params=params, network={"model": "alphabeta", "alpha_s": 1e-6},
                  workload={"n": n, "density": draw(st.sampled_from([0.001, 0.01, 0.05, 0.2, 1.0])),
                            "dtype": draw(st.sampled_from(["float32", "float64"])), "seed": 0},
                  iterations=draw(st.integers(1, 2)), warmup=draw(st.integers(0, 1)), evaluation="events")
    grads = TiedGradients(n, point.workload["dtype"], draw(st.integers(0, 2**32 - 1)),
                          draw(st.sampled_from([0.0, 0.3, 0.9, 1.0])), draw(st.integers(0, 4)))
    return point, grads


SEEN: set = set()


@settings(max_examples=1200 if LONG else 40, derandomize=not LONG, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_every_algorithm_matches_its_numpy_reference(case):
    point, grads = case
    assume(ALGORITHMS[point.algorithm].check_setup(point.P, point.workload["n"], point.params_model()) is None)
    backend = sim_backend(point)
    backend.workload = grads
    row = run_point(point, backend).row
    SEEN.add(point.algorithm)
    assert row["correct"] is True, (point, grads.__dict__, row["max_rel_err"])
