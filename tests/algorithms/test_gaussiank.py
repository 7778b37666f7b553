"""Gaussiank: normal-fit threshold, its adjustment rule, the allgather-based
exchange (counts, then pairs) and its bytes against Table 1."""
import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.algorithms import Setup, get_algorithm
from simsparse.backends.events.sim import Simulator
from simsparse.compression.gaussian import gaussian_threshold, mean_std
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.workload import Workload

from tests.helpers import ALPHA, BW, requires_torch, simulate

Gaussiank = get_algorithm("gaussiank")
N, DENSITY, K = 100_000, 0.01, 1000


def drive(inputs, density, **params):
    """One iteration on given inputs; returns (algs, IterationStats)."""
    P, n = len(inputs), len(inputs[0])
    prm = Gaussiank.Params(**params)
    algs = [Gaussiank(Setup(rank=r, P=P, n=n, density=density), prm) for r in range(P)]
    stats = Simulator(AlphaBetaNetwork(ALPHA, BW)).run([lambda ctx, a=a, g=g: a.iteration(ctx, g)
                                                        for a, g in zip(algs, inputs)])
    return algs, stats


def sample(kind, seed=0):
    rng = np.random.default_rng(seed)
    x = {"normal": lambda: rng.standard_normal(N),
         "laplace": lambda: rng.laplace(size=N),                     # heavier tail than the fit: too many pass
         "spiky": lambda: np.where(rng.uniform(size=N) < 1e-3, 20, 1) * rng.standard_normal(N),  # too few pass
         "uniform": lambda: rng.uniform(-1, 1, N)}[kind]()            # nothing passes the fitted threshold
    return x.astype(np.float32)


def test_statistics_and_threshold_follow_the_code():
    x = sample("laplace")
    mu, sigma = mean_std.numpy(x)
    assert mu == pytest.approx(np.mean(x.astype(np.float64)), rel=1e-12)
    assert sigma == pytest.approx(np.std(x.astype(np.float64), ddof=1), rel=1e-12)
    # utils.gen_threshold_from_normal_distribution(1 - density, mu, sigma): mu - Phi^-1((1-p)/2) sigma
    z = NormalDist().inv_cdf((1 - (1 - DENSITY)) / 2)
    assert gaussian_threshold(mu, sigma, DENSITY) == pytest.approx(mu - z * sigma, rel=1e-12)
    with pytest.raises(ValueError, match="density"):
        gaussian_threshold(0, 1, 0)


def test_normal_data_select_about_k_without_adjustment():
    (a,), _ = drive([sample("normal")], DENSITY)
    assert a.check_state()["retries"] == 0
    assert abs(a.contributed.size - K) < 0.1 * K


@pytest.mark.parametrize("kind", ["laplace", "spiky"])
def test_code_rule_brings_the_count_into_three_to_five_quarters_of_k(kind):
    (a,), _ = drive([sample(kind)], DENSITY)
    s = a.check_state()
    assert s["retries"] > 0
    assert 3 * K // 4 <= a.contributed.size <= 5 * K // 4
    assert a.contributed.size == np.count_nonzero(np.abs(a.last_input) >= s["threshold"])


def test_paper_rule_only_lowers_the_threshold():
    (a,), _ = drive([sample("laplace")], DENSITY, adjust="paper")
    assert a.check_state()["retries"] == 0 and a.contributed.size > 5 * K // 4
    (b,), _ = drive([sample("spiky")], DENSITY, adjust="paper")
    assert b.check_state()["retries"] > 0 and b.contributed.size >= 3 * K // 4


def test_retries_are_bounded():
    (a,), _ = drive([sample("uniform")], DENSITY, max_retries=3)
    assert a.check_state()["retries"] == 3 and a.contributed.size < 3 * K // 4


def test_bad_params_name_the_key():
    with pytest.raises(ValueError, match="scale"):
        Gaussiank.Params(scale=0.9)
    with pytest.raises(ValueError, match="adjust"):
        Gaussiank.Params(adjust="sometimes")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(16, 400), st.floats(0.005, 0.5), st.integers(0, 10**6),
       st.sampled_from(["code", "paper"]))
def test_random_cases_equal_the_reference(P, n, density, seed, adjust):
    row, _ = simulate("gaussiank", P, n=n, density=density, seed=seed, iterations=2, params={"adjust": adjust})
    assert row["correct"] is True


@pytest.mark.parametrize("P", [4, 8, 16, 32, 64])
def test_bytes_match_table_1(P):
    """Every block reaches every other rank: (P-1) (4 + 8 k_i) bytes per rank i
    (count, then k_i index-value pairs); with k_i in [3k/4, 5k/4] the words each
    rank receives are within [3/4, 5/4] of Table 1's 2k(P-1)."""
    n, density = 20000, 0.01
    k = 200
    grads = Workload(n=n, density=density, seed=P).grads(P, 0)
    algs, stats = drive(grads, density)
    ks = [a.contributed.size for a in algs]
    assert all(3 * k // 4 <= ki <= 5 * k // 4 for ki in ks)
    assert sum(stats.bytes_sent) == (P - 1) * sum(4 + 8 * ki for ki in ks)
    for i in range(P):
        received = 2 * (sum(ks) - ks[i])
        assert 0.75 * 2 * k * (P - 1) <= received <= 1.25 * 2 * k * (P - 1)
    lg = math.log2(P)
    # recursive doubling: step j moves 2^j blocks, at most 2^j of the largest
    assert 2 * lg * ALPHA < stats.time_s <= 2 * lg * ALPHA + (P - 1) * (4 + 8 * max(ks)) / BW * (1 + 1e-9)


def test_error_feedback():
    row, _ = simulate("gaussiank", 4, n=2000, density=0.02, iterations=3, params={"error_feedback": True})
    assert row["correct"] is True


@requires_torch
def test_torch_statistics_match_numpy():
    import torch

    x = sample("spiky")
    a, b = mean_std.numpy(x), mean_std.torch_fn(torch.from_numpy(x))
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert mean_std.numpy(x[:1]) == mean_std.torch_fn(torch.from_numpy(x[:1])) == (float(x[0]), 0.0)
