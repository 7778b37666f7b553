"""CLT-k: the cyclic leader's top-k indices, every worker's values summed there."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.algorithms import Setup, get_algorithm
from simsparse.backends.events.sim import Simulator
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.workload import Workload

from tests.helpers import ALPHA, BW, simulate

CLTk = get_algorithm("cltk")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(16, 400), st.floats(0.005, 0.5), st.integers(0, 10**6))
def test_random_cases_equal_the_reference(P, n, density, seed):
    row, _ = simulate("cltk", P, n=n, density=density, seed=seed, iterations=2)
    assert row["correct"] is True


@pytest.mark.parametrize("P", [3, 4])
def test_leader_rotates_and_its_indices_are_used(P):
    n, density = 300, 0.05
    k = round(density * n)
    wl = Workload(n=n, density=density, seed=1)
    algs = [CLTk(Setup(rank=r, P=P, n=n, density=density)) for r in range(P)]
    sim = Simulator(AlphaBetaNetwork(ALPHA, BW))
    for it in range(2 * P):
        grads = wl.grads(P, it)
        res = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, grads)]).results
        assert [a.check_state()["leader"] for a in algs] == [it % P] * P
        top = np.sort(np.argsort(-np.abs(grads[it % P]))[:k])
        want = np.sum([g[top].astype(np.float64) for g in grads], axis=0)
        for r in res:
            np.testing.assert_array_equal(r.indices, top)
            np.testing.assert_allclose(r.values, want, rtol=1e-5)


@pytest.mark.parametrize("P", [2, 8, 64])
def test_no_gradient_build_up(P):
    _, res = simulate("cltk", P, n=6400, density=0.01)
    assert all(r.nnz == 64 for r in res)


@pytest.mark.parametrize("P", [4, 8, 16, 32, 64])
@pytest.mark.parametrize("k", [64, 640])
def test_bytes_are_a_bcast_and_an_allreduce_of_k_words(P, k):
    """Binomial bcast of k indices ((P-1) messages) plus an allreduce of k
    values: recursive doubling (k words each way, log2 P rounds) up to 2 KiB,
    Rabenseifner (2(P-1)/P k words per rank) above."""
    row, _ = simulate("cltk", P, n=100 * k, density=0.01)
    w, lg = 4 * k, math.log2(P)
    bcast = (P - 1) * w
    rd = k * 4 <= 2048
    allreduce = P * lg * w if rd else 2 * (P - 1) * w
    assert row["correct"] is True
    assert row["bytes_total"] == bcast + allreduce
    t_bcast = lg * (ALPHA + w / BW)
    t_allreduce = lg * (ALPHA + w / BW) if rd else 2 * lg * ALPHA + 2 * (P - 1) / P * w / BW
    assert t_allreduce <= row["time_s"] <= (t_bcast + t_allreduce) * (1 + 1e-9)


def test_error_feedback_zeroes_the_leaders_indices():
    row, _ = simulate("cltk", 5, n=500, density=0.04, iterations=4, params={"error_feedback": True})
    assert row["correct"] is True
