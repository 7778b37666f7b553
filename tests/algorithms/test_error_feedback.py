"""Error feedback (Ok-Topk Alg. 2, SparCML Alg. 1): residuals carry unsent values."""
import numpy as np
import pytest

from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point


def test_topka_with_error_feedback_keeps_unsent_mass():
    p = make_point("topka", 4, n=400, density=0.05, params={"error_feedback": True}, iterations=3, warmup=0)
    out = simulate_point(p, keep_results=True)
    assert out.row["correct"] is True  # checked against the actual inputs (gradient + residual)


def test_residual_is_input_minus_what_was_sent():
    from simsparse.algorithms import get_algorithm
    from simsparse.backends.events.sim import Simulator
    from simsparse.network.alphabeta import AlphaBetaNetwork
    from simsparse.workload import Workload

    P, n = 3, 200
    cls = get_algorithm("topka")
    params = cls.Params(error_feedback=True)
    algs = [cls(make_point("topka", P, n=n).setup(r), params) for r in range(P)]
    sim = Simulator(AlphaBetaNetwork(1e-6, 1e9))
    wl = Workload(n=n, density=0.05)
    for it in range(3):
        grads = wl.grads(P, it)
        prev = [a.residual for a in algs]
        sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, grads)])
        for a, g, r0 in zip(algs, grads, prev):
            acc = g if r0 is None else g + r0
            np.testing.assert_allclose(a.last_input, acc, rtol=1e-6)
            sent = np.zeros(n, bool)
            sent[a.contributed] = True
            np.testing.assert_array_equal(a.residual[sent], 0)
            np.testing.assert_allclose(a.residual[~sent], acc[~sent], rtol=1e-6)


SPARSE = ["cltk", "deft", "dsar_split_allgather", "fft_allgather", "gaussiank", "gtopk", "oktopk", "qsgd_allgather",
          "ssar_recursive_double", "ssar_split_allgather", "terngrad_allgather", "topka", "topkdsa"]


@pytest.mark.parametrize("name", SPARSE)
def test_an_unchecked_run_updates_its_residual_in_place_to_the_same_values(name):
    """Without keep_input the residual's buffer takes the gradient and is zeroed where it lies: the
    results, residuals and simulated times equal the copying path's, iteration by iteration."""
    from simsparse.backends.events.sim import Simulator
    from simsparse.network.alphabeta import AlphaBetaNetwork
    from simsparse.workload import Workload

    P, n = 5, 600
    wl = Workload(n=n, density=0.05, drift=0.5)
    runs = []
    for keep in (True, False):
        algs = make_point(name, P, n=n, density=0.05, params={"error_feedback": True}).instances()
        for a in algs:
            a.keep_input = keep
        sim = Simulator(AlphaBetaNetwork(1e-6, 1e9))
        got = []
        for it in range(4):
            s = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, wl.grads(P, it))])
            got.append((s.finish_s, [_dense(r, n) for r in s.results], [np.array(a.residual) for a in algs]))
        runs.append(got)
    for (t0, r0, e0), (t1, r1, e1) in zip(*runs):
        assert t0 == t1
        for a, b in zip(r0 + e0, r1 + e1):
            np.testing.assert_array_equal(a, b)


def _dense(result, n):
    from simsparse.ops import COO

    if isinstance(result, COO):
        out = np.zeros(n, result.values.dtype)
        out[result.indices] = result.values
        return out
    return np.asarray(result)
