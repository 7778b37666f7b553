"""The real backend (mpiexec + mpi4py + torch on CPU) runs the same algorithm
objects: same results and the same bytes as the simulator."""
import pytest

from simsparse.experiments.run.runner import simulate_point

from tests import real_batch
from tests.helpers import make_point, requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi]

ALGOS = [("ring", {}), ("recursive_doubling", {}), ("rabenseifner", {}), ("topka", {}),
         ("topka", {"allgather": "ring"}), ("topka", {"error_feedback": True})]


for _P in (2, 3, 4):
    real_batch.register(f"mpi_{_P}", [make_point(a, _P, n=1000 + _P, density=0.03, params=prm, iterations=2, warmup=1,
                                                 seed=7) for a, prm in ALGOS])
TRACED = real_batch.register("mpi_traced", [make_point("ring", 2, n=64)], probe=True)
KERNELS = real_batch.register("mpi_kernels", [make_point("topka", 2, n=3000, density=0.05, iterations=1, warmup=0)])


@pytest.mark.parametrize("P", [2, 3, 4])
def test_same_results_and_bytes_as_the_simulator(P, tmp_path_factory, worker_id):
    real_batch.check_against_simulator(f"mpi_{P}", tmp_path_factory, worker_id)


def test_trace_has_the_same_schema(tmp_path_factory, worker_id):
    row, trace = real_batch.measured(TRACED[0], tmp_path_factory, worker_id)
    ops = {t["op"] for t in trace}
    assert {"send", "recv"} <= ops and any(o.startswith("compute:") for o in ops)
    assert {"rank", "phase", "peer", "bytes", "start_s", "end_s"} <= set(trace[0])
    # the ranks' process CPU per iteration, beside the time: at most the time on each of its cores, plus slack
    assert 0 < row["cpu_s"] <= row["time_s"] * __import__("os").cpu_count() + 0.05
    # the host's speed just before the point (compute.speed_probe), on both clocks
    assert 0 < row["host_probe_cpu_s"] < 5 and 0 < row["host_probe_wall_s"] < 5


def _every_algorithm():
    from simsparse.algorithms import ALGORITHMS

    return [make_point(a, 3, n=600, density=0.05, seed=3) for a in sorted(ALGORITHMS)]


EVERY = real_batch.register("mpi_every_algorithm", _every_algorithm())


def test_measure_sends_the_same_bytes_as_run_for_every_algorithm(tmp_path_factory, worker_id):
    """Every algorithm's helper collectives, requests of the contract, run as
    the same point-to-point messages under mpiexec as the simulator counts
    (whether it evaluates them in bulk or as messages), with the same results."""
    real_batch.check_against_simulator("mpi_every_algorithm", tmp_path_factory, worker_id)
    for point in EVERY:
        row, _ = real_batch.measured(point, tmp_path_factory, worker_id)
        assert "start_late_s" not in row   # the default start, a barrier, has no common start to miss


def test_a_kernels_record_says_the_bytes_it_touches_in_both_backends(tmp_path_factory, worker_id):
    """A compute record's ``bytes``: the kernel's ``Work.bytes``, the same in the
    simulator's trace and the measured one (what a co-runner's share of the
    caches is read from)."""
    p = KERNELS[0]
    _, trace = real_batch.measured(p, tmp_path_factory, worker_id)
    s = simulate_point(p, trace=True)

    def kernels(trace):
        return sorted((t["rank"], t["op"], t["bytes"]) for t in trace if t["op"].startswith("compute:"))

    got = kernels(trace)
    assert got == kernels(s.trace) and got and all(b > 0 for _, _, b in got)
