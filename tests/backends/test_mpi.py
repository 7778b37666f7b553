"""The real backend (mpiexec + mpi4py + torch on CPU) runs the same algorithm
objects: same results and the same bytes as the simulator."""
import numpy as np
import pytest

from simsparse.experiments.run.measure import measure_points
from simsparse.experiments.config.point import to_dense
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi]

ALGOS = [("ring", {}), ("recursive_doubling", {}), ("rabenseifner", {}), ("topka", {}),
         ("topka", {"allgather": "ring"}), ("topka", {"error_feedback": True})]


@pytest.mark.parametrize("P", [2, 3, 4])
def test_same_results_and_bytes_as_the_simulator(P, tmp_path):
    points = [make_point(a, P, n=1000 + P, density=0.03, params=prm, iterations=2, warmup=1, seed=7)
              for a, prm in ALGOS]
    measured = measure_points(points, device="cpu", dump_results=str(tmp_path))
    for point, m in zip(points, measured):
        s = simulate_point(point, keep_results=True)
        row = m.row
        assert row["backend"] == "mpi" and row["correct"] is True, point.algorithm
        for col in ("bytes_total", "bytes_sent_max", "msgs_total"):
            assert row[col] == s.row[col], (point.algorithm, col)
        dumped = np.load(tmp_path / f"{point.point_id('mpi')}.npz")
        for r in range(P):
            np.testing.assert_allclose(dumped[f"arr_{r}"], to_dense(s.results[r], point.workload["n"]),
                                       rtol=1e-5, atol=1e-5)
        assert row["time_s"] > 0


def test_trace_has_the_same_schema(tmp_path):
    p = make_point("ring", 2, n=64)
    (m,) = measure_points([p], device="cpu", trace=True, speed_probe=True)
    ops = {t["op"] for t in m.trace}
    assert {"send", "recv"} <= ops and any(o.startswith("compute:") for o in ops)
    assert {"rank", "phase", "peer", "bytes", "start_s", "end_s"} <= set(m.trace[0])
    # the ranks' process CPU per iteration, beside the time: at most the time on each of its cores, plus slack
    assert 0 < m.row["cpu_s"] <= m.row["time_s"] * __import__("os").cpu_count() + 0.05
    # the host's speed just before the point (compute.speed_probe), on both clocks
    assert 0 < m.row["host_probe_cpu_s"] < 5 and 0 < m.row["host_probe_wall_s"] < 5


def test_measure_sends_the_same_bytes_as_run_for_every_algorithm(tmp_path):
    """Every algorithm's helper collectives, requests of the contract, run as
    the same point-to-point messages under mpiexec as the simulator counts
    (whether it evaluates them in bulk or as messages)."""
    from simsparse.algorithms import ALGORITHMS

    points = [make_point(a, 3, n=600, density=0.05, seed=3) for a in sorted(ALGORITHMS)]
    for point, m in zip(points, measure_points(points, device="cpu")):
        s = simulate_point(point).row
        assert m.row["correct"] is True, point.algorithm
        assert "start_late_s" not in m.row   # the default start, a barrier, has no common start to miss
        assert (m.row["bytes_total"], m.row["msgs_total"]) == (s["bytes_total"], s["msgs_total"]), point.algorithm


def test_a_kernels_record_says_the_bytes_it_touches_in_both_backends():
    """A compute record's ``bytes``: the kernel's ``Work.bytes``, the same in the
    simulator's trace and the measured one (what a co-runner's share of the
    caches is read from)."""
    p = make_point("topka", 2, n=3000, density=0.05, iterations=1, warmup=0)
    (m,) = measure_points([p], device="cpu", trace=True)
    s = simulate_point(p, trace=True)

    def kernels(trace):
        return sorted((t["rank"], t["op"], t["bytes"]) for t in trace if t["op"].startswith("compute:"))

    got = kernels(m.trace)
    assert got == kernels(s.trace) and got and all(b > 0 for _, _, b in got)
