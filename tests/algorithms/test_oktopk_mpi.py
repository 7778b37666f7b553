"""Ok-Topk on the real backend (mpiexec -n 4, mpi4py + torch on the CPU): the
same results and the same bytes as the simulator, for each optimisation."""
import numpy as np
import pytest

from simsparse.experiments.run.measure import measure_points
from simsparse.experiments.config.point import to_dense
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi]

VARIANTS = [
    {"tau": 2, "tau_prime": 2},  # exact, reused and re-evaluated in 3 iterations
    {"threshold_reuse": False, "global_exact": "gather", "count_exchange": True},
    {"rotation": False, "overlap": False, "bucket_size": 1, "balance": "always"},
    {"balanced_boundaries": False, "error_feedback": True, "tau": 2},
]


def test_same_results_and_bytes_as_the_simulator(tmp_path):
    P = 4
    points = [make_point("oktopk", P, n=3001, density=0.02, params=prm, iterations=2, warmup=1, seed=11)
              for prm in VARIANTS]
    measured = measure_points(points, device="cpu", dump_results=str(tmp_path))
    for point, m in zip(points, measured):
        s = simulate_point(point, keep_results=True)
        assert m.row["correct"] is True and s.row["correct"] is True, point.params
        for col in ("bytes_total", "bytes_sent_max", "msgs_total"):
            assert m.row[col] == s.row[col], (point.params, col)
        dumped = np.load(tmp_path / f"{point.point_id('mpi')}.npz")
        for r in range(P):
            np.testing.assert_allclose(dumped[f"arr_{r}"], to_dense(s.results[r], 3001), rtol=1e-5, atol=1e-6)
