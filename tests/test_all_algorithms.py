"""Every registered algorithm, whoever wrote it: documented, correct in the
simulator for awkward P, and identical in bytes and results under mpiexec -n 4."""
import numpy as np
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.experiments.config.point import to_dense
from simsparse.experiments.run.runner import simulate_point

from conftest import make_point, requires_mpi

NAMES = sorted(ALGORITHMS)


@pytest.mark.parametrize("name", NAMES)
def test_docstring_cites_a_source_and_a_cost(name):
    doc = (ALGORITHMS[name].__doc__ or "").lower()
    assert len(doc) > 200, f"{name}: docstring too short"
    assert "cost" in doc or "alpha" in doc, f"{name}: docstring states no cost model"


@pytest.mark.parametrize("P", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("name", NAMES)
def test_correct_in_the_simulator(name, P):
    point = make_point(name, P, n=3000, density=0.02, iterations=2, warmup=1, seed=11)
    problem = ALGORITHMS[name].check_setup(P, 3000, point.params_model())
    if problem:
        pytest.skip(problem)
    row = simulate_point(point).row
    assert row["correct"] is True, (name, P, row["max_rel_err"])
    assert row["bytes_total"] >= 0 and row["time_s"] >= 0


@requires_mpi
@pytest.mark.mpi
def test_every_algorithm_same_bytes_and_results_under_mpiexec(tmp_path):
    from simsparse.experiments.run.measure import measure_points

    P = 4
    points = [make_point(name, P, n=2048, density=0.02, iterations=2, warmup=1, seed=5) for name in NAMES]
    measured = measure_points(points, device="cpu", dump_results=str(tmp_path), timeout_s=300)
    for point, m in zip(points, measured):
        s = simulate_point(point, keep_results=True)
        assert m.row["correct"] is True, point.algorithm
        assert m.row["bytes_total"] == s.row["bytes_total"], point.algorithm
        assert m.row["msgs_total"] == s.row["msgs_total"], point.algorithm
        dumped = np.load(tmp_path / f"{point.point_id('mpi')}.npz")
        for r in range(P):
            np.testing.assert_allclose(dumped[f"arr_{r}"], to_dense(s.results[r], 2048), rtol=1e-4, atol=1e-5,
                                       err_msg=point.algorithm)
