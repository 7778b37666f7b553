"""gTopk: a reduction tree with top-k at every level, then a broadcast.
Result = the tree of Top_k(S_a + S_b) over local top-k; bytes as Table 1."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.algorithms import Setup, get_algorithm
from simsparse.backends.events.sim import Simulator
from simsparse.network.alphabeta import AlphaBetaNetwork

from tests.helpers import ALPHA, BW, simulate

GTopk = get_algorithm("gtopk")


def run_inputs(inputs, density, iterations=1, **params):
    """Drive gtopk on given per-rank inputs; returns (algs, results of the last iteration)."""
    P, n = len(inputs[0]), len(inputs[0][0])
    prm = GTopk.Params(**params)
    algs = [GTopk(Setup(rank=r, P=P, n=n, density=density), prm) for r in range(P)]
    sim = Simulator(AlphaBetaNetwork(ALPHA, BW))
    for it in range(iterations):
        stats = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, inputs[it])])
    return algs, stats.results


def dense(res, n):
    out = np.zeros(n)
    out[res.indices] = res.values
    return out


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(16, 400), st.floats(0.005, 0.5), st.integers(0, 10**6))
def test_random_cases_equal_the_tree_reference(P, n, density, seed):
    row, _ = simulate("gtopk", P, n=n, density=density, seed=seed, iterations=2)
    assert row["correct"] is True


@pytest.mark.parametrize("P", [2, 4, 7, 8])
def test_identical_inputs_give_P_times_the_local_topk(P):
    n, density = 300, 0.05
    g = np.random.default_rng(P).standard_normal(n).astype(np.float32)
    _, res = run_inputs([[g] * P], density)
    k = round(density * n)
    top = np.argsort(-np.abs(g))[:k]
    want = np.zeros(n)
    want[top] = P * g[top].astype(np.float64)
    for r in res:
        np.testing.assert_allclose(dense(r, n), want, rtol=1e-6)


@pytest.mark.parametrize("P", [3, 4, 8])
def test_disjoint_supports_give_the_global_topk_of_the_local_topks(P):
    """With disjoint local top-k sets no value is summed, so every level's
    Top_k keeps the largest: the result is Top_k(sum_i Top_k(G_i))."""
    n, k = 400, 10
    rng = np.random.default_rng(P)
    perm = rng.permutation(n)
    inputs = []
    for r in range(P):
        g = (0.01 * rng.standard_normal(n)).astype(np.float32)
        g[perm[r * k:(r + 1) * k]] = rng.uniform(1, 10, k) * rng.choice([-1, 1], k)
        inputs.append(g)
    _, res = run_inputs([inputs], k / n)
    local = np.zeros(n)
    for g in inputs:
        top = np.argsort(-np.abs(g))[:k]
        local[top] += g[top]
    want = np.zeros(n)
    top = np.argsort(-np.abs(local))[:k]
    want[top] = local[top]
    for r in res:
        np.testing.assert_allclose(dense(r, n), want, rtol=1e-6)


@pytest.mark.parametrize("P", [4, 8, 16, 32, 64])
def test_bytes_and_time_match_table_1(P):
    """Table 1: 2 log2(P) alpha + 4k log2(P) words; every non-root sends 2k
    words up the tree and the broadcast moves 2k words to each of P-1 ranks."""
    n, density, k = 10000, 0.01, 100
    row, _ = simulate("gtopk", P, n=n, density=density)
    msg = 2 * k * 4
    assert row["correct"] is True
    assert row["bytes_total"] == 2 * (P - 1) * msg
    assert row["bytes_sent_max"] == math.log2(P) * msg  # the root's broadcast
    assert row["time_s"] == pytest.approx(2 * math.log2(P) * ALPHA + 4 * k * math.log2(P) * 4 / BW, rel=1e-9)


@pytest.mark.parametrize("P", [3, 5, 6, 12])
def test_folded_non_powers_of_two_move_the_same_bytes(P):
    row, _ = simulate("gtopk", P, n=2000, density=0.02)
    assert row["correct"] is True
    assert row["bytes_total"] == 2 * (P - 1) * 2 * 40 * 4


def test_error_feedback_keeps_what_did_not_survive():
    P, n, density = 4, 200, 0.05
    rng = np.random.default_rng(3)
    inputs = [[rng.standard_normal(n).astype(np.float32) for _ in range(P)] for _ in range(3)]
    algs, res = run_inputs(inputs, density, iterations=3, error_feedback=True)
    final = set(res[0].indices.tolist())
    for a in algs:
        x = a.last_input
        local = set(np.argsort(-np.abs(x))[:a.k].tolist())
        assert set(a.contributed.tolist()) == local & final
        sent = np.zeros(n, bool)
        sent[a.contributed] = True
        np.testing.assert_array_equal(a.residual[sent], 0)
        np.testing.assert_array_equal(a.residual[~sent], x[~sent])
    row, _ = simulate("gtopk", 5, n=500, density=0.04, iterations=3, params={"error_feedback": True})
    assert row["correct"] is True
