"""Ok-Topk on the real backend (mpiexec -n 4, mpi4py + torch on the CPU): the
same results and the same bytes as the simulator, for each optimisation."""
import pytest

from tests.helpers import make_point, requires_mpi
from tests import real_batch

pytestmark = [requires_mpi, pytest.mark.mpi]

VARIANTS = [
    {"tau": 2, "tau_prime": 2},  # exact, reused and re-evaluated in 3 iterations
    {"threshold_reuse": False, "global_exact": "gather", "count_exchange": True},
    {"rotation": False, "overlap": False, "bucket_size": 1, "balance": "always"},
    {"balanced_boundaries": False, "error_feedback": True, "tau": 2},
]


real_batch.register("oktopk", [make_point("oktopk", real_batch.P, n=3001, density=0.02, params=prm,
                                             iterations=2, warmup=1, seed=11) for prm in VARIANTS], atol=1e-6)


def test_same_results_and_bytes_as_the_simulator(tmp_path_factory, worker_id):
    real_batch.check_against_simulator("oktopk", tmp_path_factory, worker_id)
