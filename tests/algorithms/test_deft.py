"""DEFT (Yoon & Oh, ICPP'23): partitioning (Alg. 2), norm-based local k
(Alg. 3), bin packing (Alg. 4), layer-wise selection (Alg. 5) and the
exchange of Alg. 1; its density against TopkA's build-up, and Eq. 9.
Also the real-backend check of gtopk, gaussiank, cltk and deft (one launch)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.algorithms import Setup, get_algorithm
from simsparse.algorithms.deft import assign_k, bin_pack, partition
from simsparse.backends.events.sim import Simulator
from simsparse.compute.devices import IdealDevice
from simsparse.compute.kernels import get_kernel
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.workload import model_layer_params

from tests.helpers import ALPHA, BW, make_point, requires_mpi, requires_torch
from tests import real_batch

DEFT = get_algorithm("deft")


def resnet20_layers():
    return tuple(model_layer_params()["resnet20_cifar10"]["sizes_in_registration_order"])


def layered_grads(layers, P, iteration, spread=2.0, seed=0):
    """Per-rank normal gradients, layer l scaled by 10^(-spread U_l) (DEFT's
    layer-norm differences; the same scales on every rank)."""
    scales = np.repeat(10 ** (-spread * np.random.default_rng(seed).uniform(size=len(layers))), layers)
    n = sum(layers)
    return [(np.random.default_rng([seed, iteration, r]).standard_normal(n) * scales).astype(np.float32)
            for r in range(P)]


def run(name, inputs, layers, density, device=None, trace=False, **params):
    """Drive an algorithm over iterations of given per-rank inputs (layers in
    the Setup); returns (algs, IterationStats of the last iteration, params)."""
    cls = get_algorithm(name)
    P, n = len(inputs[0]), len(inputs[0][0])
    prm = cls.Params(**params)
    algs = [cls(Setup(rank=r, P=P, n=n, density=density, layers=tuple(layers)), prm) for r in range(P)]
    sim = Simulator(AlphaBetaNetwork(ALPHA, BW), device or IdealDevice(), trace=trace)
    for grads in inputs:
        stats = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, grads)])
    return algs, stats, prm


def reference_of(algs, prm):
    return DEFT.reference([a.last_input for a in algs], algs[0].setup, prm, [a.check_state() for a in algs])


# -- Alg. 2, 3, 4 -------------------------------------------------------------------

def test_partition_examples():
    assert partition((10, 3, 7), 2) == [(0, 10), (10, 13), (13, 20)]  # 10 is not > n/P = 10
    assert partition((11, 3, 6), 2) == [(0, 6), (6, 11), (11, 14), (14, 20)]
    assert partition((2, 9), 4) == [(0, 2), (2, 5), (5, 7), (7, 9), (9, 11)]  # 9 = 3+2+2+2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=12), st.integers(1, 16))
def test_partition_covers_the_vector_and_splits_only_large_layers(layers, P):
    frags = partition(layers, P)
    n = sum(layers)
    assert frags[0][0] == 0 and frags[-1][1] == n
    assert all(b > a for a, b in frags) and all(f[1] == g[0] for f, g in zip(frags, frags[1:]))
    pos = 0
    for size in layers:
        mine = [(a, b) for a, b in frags if pos <= a < pos + size]
        pieces = [b - a for a, b in mine]
        if size > n / P:
            assert len(mine) == min(P, size) and max(pieces) - min(pieces) <= 1 and pieces == sorted(pieces)[::-1]
        else:
            assert pieces == [size]
        pos += size


def test_assign_k_examples():
    assert assign_k([4.0, 3.0, 2.0, 1.0], [100] * 4, 10) == [4, 3, 2, 1]
    assert assign_k([10.0, 1.0, 1.0], [2, 100, 100], 12) == [2, 5, 5]  # capped at the size
    assert assign_k([100.0, 1.0, 1.0], [50] * 3, 3) == [2, 1, 1]  # at least 1: k + 1 in all
    # equal norms: the later fragment first (the code's argsort(...)[::-1]); the last one gets what remains
    assert assign_k([3.0, 3.0, 3.0], [100] * 3, 10) == [4, 3, 3]
    assert assign_k([5.0, 2.5, 2.5], [5, 100, 100], 20) == [5, 8, 7]
    # a capped last fragment leaves k unassigned; fill_remainder (the code) hands it back by priority
    assert assign_k([8.0, 2.0, 1.0], [100, 100, 1], 20, fill_remainder=False) == [14, 4, 1]
    assert assign_k([8.0, 2.0, 1.0], [100, 100, 1], 20) == [15, 4, 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.floats(0, 100)), min_size=1, max_size=20),
       st.floats(0.001, 1.0), st.booleans())
def test_assign_k_bounds(frags, density, fill):
    sizes, norms = [s for s, _ in frags], [v for _, v in frags]
    k = max(1, min(sum(sizes), round(density * sum(sizes))))
    ks = assign_k(norms, sizes, k, fill)
    assert all(1 <= ki <= s for ki, s in zip(ks, sizes))
    assert sum(ks) <= k + len(sizes)
    if fill:
        assert sum(ks) >= k


def test_bin_pack_example():
    sizes, ks = [100, 100, 100, 10], [16, 4, 2, 10]
    assert bin_pack(sizes, ks, 2) == ([[0], [1, 2]], [3])  # k = size: the common part
    assert bin_pack(sizes, ks, 2, common_part=False) == ([[0], [1, 2, 3]], [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1000), st.integers(1, 64)), min_size=1, max_size=30), st.integers(1, 16))
def test_bin_pack_is_lpt(frags, P):
    sizes, ks = [s for s, _ in frags], [min(k, s) for s, k in frags]
    bins, common = bin_pack(sizes, ks, P)
    placed = sorted([j for b in bins for j in b] + common)
    assert placed == list(range(len(sizes)))
    assert all(ks[j] == sizes[j] for j in common)
    cost = [s * math.log2(k) if k > 1 else s for s, k in zip(sizes, ks)]
    loads = [sum(cost[j] for j in b) for b in bins]
    if loads:
        assert max(loads) <= sum(loads) / P + max(cost) + 1e-9  # greedy list-scheduling bound


# -- the algorithm in the simulator ----------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(1, 120), min_size=1, max_size=6), st.floats(0.01, 0.5),
       st.integers(0, 10**6), st.sampled_from([{}, {"index_allgather": "exact"}, {"common_part": False},
                                               {"fill_remainder": False}, {"error_feedback": True}]))
def test_random_cases_equal_the_reference(P, layers, density, seed, params):
    inputs = [layered_grads(layers, P, it, seed=seed) for it in range(2)]
    algs, stats, prm = run("deft", inputs, layers, density, **params)
    want = reference_of(algs, prm)
    for res in stats.results:
        np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-6)


def test_layers_must_cover_the_gradient():
    with pytest.raises(ValueError, match="layer sizes sum to 90"):
        run("deft", [[np.ones(100, np.float32)]], [40, 50], 0.1)


def test_one_worker_one_layer_is_plain_topk():
    g = np.random.default_rng(0).standard_normal(500).astype(np.float32)
    (a,), stats, _ = run("deft", [[g]], [500], 0.04)
    top = np.argsort(-np.abs(g))[:20]
    want = np.zeros(500, np.float32)
    want[top] = g[top]
    np.testing.assert_array_equal(stats.results[0], want)


@pytest.mark.parametrize("P", [2, 4, 7])
def test_workers_select_in_disjoint_fragments(P):
    """Identical inputs, one layer: fragment x (1/P of the vector) contributes
    its own top-k_x, found by exactly one worker, summed P times."""
    n, density = 700, 0.05
    g = np.random.default_rng(P).standard_normal(n).astype(np.float32)
    algs, stats, _ = run("deft", [[g] * P], [n], density)
    frags = partition([n], P)
    ks = assign_k([float(np.linalg.norm(g[a:b].astype(np.float64))) for a, b in frags], [b - a for a, b in frags],
                  round(density * n))
    want = np.zeros(n)
    for (a, b), kx in zip(frags, ks):
        top = a + np.argsort(-np.abs(g[a:b]))[:kx]
        want[top] = P * g[top].astype(np.float64)
    for res in stats.results:
        np.testing.assert_allclose(res, want, rtol=1e-6)
    assert np.count_nonzero(stats.results[0]) == round(density * n)
    for a in algs:
        assert sorted(a.contributed.tolist()) == np.flatnonzero(want).tolist()


def test_error_feedback_zeroes_every_selected_index():
    layers = (40, 200, 60)
    inputs = [layered_grads(layers, 3, it) for it in range(3)]
    algs, stats, prm = run("deft", inputs, layers, 0.05, error_feedback=True)
    np.testing.assert_allclose(stats.results[0], reference_of(algs, prm), rtol=1e-5, atol=1e-6)
    for a in algs:
        sent = np.zeros(300, bool)
        sent[a.contributed] = True
        assert sent.sum() == np.count_nonzero(stats.results[0])
        np.testing.assert_array_equal(a.residual[sent], 0)
        np.testing.assert_array_equal(a.residual[~sent], a.last_input[~sent])


@pytest.mark.parametrize("P", [4, 8, 16, 32, 64])
def test_bytes_per_phase(P):
    """Bcast of the plan (P + L int32), allgather of the P counts, padded
    allgather of the indices (P (P-1) k_max words), and an allreduce of the k'
    selected values (Rabenseifner: 2(P-1) k' words, up to block rounding);
    the counts recomputed from Alg. 3 and 4."""
    layers = resnet20_layers()
    density, n = 0.01, sum(layers)
    algs, stats, prm = run("deft", [layered_grads(layers, P, 0)], layers, density, trace=True)
    sent = {}
    for t in stats.trace:
        if t.op == "send":
            sent[t.phase] = sent.get(t.phase, 0) + t.bytes
    frags = algs[0].fragments
    sizes, bounds = [b - a for a, b in frags], [a for a, _ in frags] + [n]
    ks = [assign_k(get_kernel("fragment_norms").numpy(a.last_input, bounds), sizes, a.k) for a in algs]
    bins, common = bin_pack(sizes, ks[0], P)  # iteration 0: rank 0 decides
    counts = [sum(ks[r][j] for j in bins[r]) for r in range(P)]
    kprime = np.count_nonzero(stats.results[0])
    assert kprime == sum(counts) + sum(sizes[j] for j in common)
    assert sent["partition"] == (P - 1) * 4 * (P + len(frags))
    assert sent["gather"] == P * (P - 1) * 4 * (1 + max(counts))
    allreduce = sum(stats.bytes_sent) - sent["partition"] - sent["gather"]
    assert abs(allreduce - 2 * (P - 1) * 4 * kprime) <= P * math.log2(P) * 4
    assert abs(kprime - round(density * n)) <= 0.05 * density * n


# -- what the paper claims -----------------------------------------------------------

def test_density_stays_at_the_set_density_while_topka_builds_up():
    """Section 5.2 / Fig. 1 and 4: TopkA's result density grows with P
    (gradient build-up); DEFT's stays at the set density (within 5%)."""
    layers = resnet20_layers()
    n, density = sum(layers), 0.01
    topka = []
    for P in [4, 8, 16, 32, 64]:
        grads = [layered_grads(layers, P, 0)]
        _, deft, _ = run("deft", grads, layers, density)
        _, topk, _ = run("topka", grads, layers, density)
        assert abs(np.count_nonzero(deft.results[0]) / n / density - 1) <= 0.05, P
        topka.append(np.count_nonzero(topk.results[0]) / n / density)
    assert all(b > a for a, b in zip(topka, topka[1:])) and topka[0] > 2 and topka[-1] > 10


def selection_costs(monkeypatch, name, grads, layers, density):
    """Per-rank selection cost, Eq. 3 summed over the top-k kernel calls each
    rank made: n_x log2 k_x (n_x when k_x <= 1, as the code's cost)."""
    topk = get_kernel("topk")
    owner = {id(g): r for r, g in enumerate(grads)}
    cost = [0.0] * len(grads)
    real = topk.numpy

    def recording(x, k):
        r = owner[id(x if x.base is None else x.base)]
        cost[r] += len(x) * math.log2(k) if k > 1 else len(x)
        return real(x, k)

    monkeypatch.setattr(topk, "numpy", recording)
    run(name, [grads], layers, density)
    monkeypatch.setattr(topk, "numpy", real)
    return cost


def test_selection_cost_per_worker_falls_at_least_linearly(monkeypatch):
    """Eq. 9: f(P) = n log k / max_r C_r >= P, C_r the Eq. 3 cost of the
    top-k calls rank r actually ran (TopkA: one call on all n per worker)."""
    layers = resnet20_layers()
    density = 0.01
    for P in [2, 4, 8, 16, 32, 64]:
        grads = layered_grads(layers, P, 0)
        full = selection_costs(monkeypatch, "topka", grads, layers, density)
        deft = selection_costs(monkeypatch, "deft", grads, layers, density)
        assert max(full) == min(full)
        assert max(full) / max(deft) >= P, P


# -- kernels and the real backend ---------------------------------------------------------

@requires_torch
def test_torch_kernels_match_numpy():
    import torch

    from simsparse.ops import COO

    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    T = torch.from_numpy
    bounds = [0, 10, 500, 501, 1000]
    K = get_kernel
    np.testing.assert_allclose(K("fragment_norms").numpy(x, bounds), K("fragment_norms").torch_fn(T(x), bounds),
                               rtol=1e-13)
    parts = [COO(np.array([0, 3], np.int32), np.ones(2, np.float32), 10), COO(np.array([1], np.int32), x[:1], 5)]
    np.testing.assert_array_equal(K("fragment_indices").numpy(parts, [10, 600], x),
                                  K("fragment_indices").torch_fn([p.map(T) for p in parts], [10, 600], T(x)).numpy())
    assert len(K("fragment_indices").torch_fn([], [], T(x))) == 0 == len(K("fragment_indices").numpy([], [], x))
    np.testing.assert_array_equal(K("index_ranges").numpy([(3, 5), (9, 12)], x),
                                  K("index_ranges").torch_fn([(3, 5), (9, 12)], T(x)).numpy())
    idx = np.array([7, 2, 5], np.int32)
    np.testing.assert_array_equal(K("scatter_values").numpy(idx, x[:3], 10, x),
                                  K("scatter_values").torch_fn(T(idx), T(x[:3]), 10, T(x)).numpy())


real_batch.register("deft", [
    make_point(a, real_batch.P, n=3000, density=0.02, params=prm, iterations=5, warmup=0, seed=3)
    for a, prm in [("gtopk", {}), ("gtopk", {"error_feedback": True}), ("gaussiank", {}),
                   ("gaussiank", {"adjust": "paper", "allgather": "ring"}), ("cltk", {"error_feedback": True}),
                   ("deft", {}), ("deft", {"index_allgather": "exact", "error_feedback": True})]])


@requires_mpi
@pytest.mark.mpi
def test_real_backend_same_bytes_and_results(tmp_path_factory, worker_id):
    """gtopk, gaussiank, cltk, deft under mpiexec -n 4."""
    real_batch.check_against_simulator("deft", tmp_path_factory, worker_id)
