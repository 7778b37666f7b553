"""Error feedback (Ok-Topk Alg. 2, SparCML Alg. 1): residuals carry unsent values."""
import numpy as np

from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point


def test_topka_with_error_feedback_keeps_unsent_mass():
    p = make_point("topka", 4, n=400, density=0.05, params={"error_feedback": True}, iterations=3, warmup=0)
    out = simulate_point(p, keep_results=True)
    assert out.row["correct"] is True  # checked against the actual inputs (gradient + residual)


def test_residual_is_input_minus_what_was_sent():
    from simsparse.algorithms import get_algorithm
    from simsparse.backends.sim import Simulator
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
