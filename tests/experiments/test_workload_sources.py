"""Gradient sources: determinism, distributions, top-k overlap, skew, layer norms, drift, npz replay."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import special, stats

import simsparse.workload as wlmod
from simsparse.workload import Workload, model_layer_params

from tests.helpers import requires_torch


def topk_set(g, k):
    return set(np.argpartition(-np.abs(g), k - 1)[:k].tolist())


def jaccard(a, b):
    return len(a & b) / len(a | b)


def test_default_stream_is_unchanged_and_deterministic():
    w = Workload(n=500, seed=3)
    g = w.grad(2, 7)
    np.testing.assert_array_equal(g, np.random.default_rng([3, 7, 2]).standard_normal(500, dtype=np.float32))
    assert not g.flags.writeable
    w2 = Workload(n=500, seed=3, overlap=0.5, skew=0.3, drift=0.2, distribution="laplace", layers=(200, 300))
    a = [w2.grad(r, 2) for r in range(3)]
    wlmod._STATE.items.clear()
    wlmod._STATE.size = 0
    b = Workload(**{"n": 500, "seed": 3, "overlap": 0.5, "skew": 0.3, "drift": 0.2, "distribution": "laplace",
                    "layers": [200, 300]}).grads(3, 2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert w2.grads(3, 2) is w2.grads(3, 2)  # cached
    assert not np.array_equal(Workload(n=500, seed=4).grad(2, 7), g)


@settings(max_examples=25, deadline=None)
@given(st.floats(0, 1), st.integers(2, 6), st.sampled_from([0.0, 0.6]), st.integers(0, 99))
def test_overlap_sets_the_jaccard_index_of_top_k_sets(f, P, skew, seed):
    w = Workload(n=4000, density=0.02, overlap=f, skew=skew, seed=seed)
    k, m = w.k, int(round(f * w.k))
    sets = [topk_set(g, k) for g in w.grads(P, 1)]
    for r, s in enumerate(sets):
        assert s == set(w.hot_set(r).tolist())  # the planted hot set is exactly the top-k
    for a, b in itertools.combinations(sets, 2):
        assert jaccard(a, b) == pytest.approx(m / (2 * k - m))
    common = set.intersection(*sets)
    assert len(common) == m  # the shared part is shared by all ranks


def test_overlap_extremes_and_independent_default():
    ident = Workload(n=10000, density=0.01, overlap=1.0)
    disj = Workload(n=10000, density=0.01, overlap=0.0)
    indep = Workload(n=10000, density=0.01)
    for w, want in ((ident, 1.0), (disj, 0.0)):
        s = [topk_set(g, w.k) for g in w.grads(8)]
        assert all(jaccard(a, b) == want for a, b in itertools.combinations(s, 2))
    s = [topk_set(g, indep.k) for g in indep.grads(8)]
    mean_j = np.mean([jaccard(a, b) for a, b in itertools.combinations(s, 2)])
    assert mean_j < 0.03  # i.i.d.: about k/(2n) = 0.005
    assert disj.check_P(101) is not None and "P*100" in disj.check_P(101)
    with pytest.raises(ValueError, match="raise n or overlap"):
        disj.grads(101)


def test_planting_keeps_the_marginal_distribution():
    for dist, ref in (("normal", stats.norm()), ("laplace", stats.laplace(scale=2 ** -0.5)),
                      ("student_t", stats.t(5, scale=np.sqrt(3 / 5)))):
        g = Workload(n=40000, density=0.05, overlap=0.3, distribution=dist, df=5, seed=1).grad(0, 0)
        assert stats.kstest(g.astype(np.float64), ref.cdf).pvalue > 1e-3, dist


def test_heavy_tails():
    kurt = {}
    for dist in ("normal", "laplace", "student_t"):
        g = Workload(n=200000, distribution=dist, df=4.5, seed=2).grad(0, 0).astype(np.float64)
        assert g.var() == pytest.approx(1.0, rel=0.08)
        kurt[dist] = stats.kurtosis(g)
    assert abs(kurt["normal"]) < 0.1 and kurt["laplace"] == pytest.approx(3.0, rel=0.15)
    assert kurt["student_t"] > kurt["laplace"]  # 6/(df-4) = 12 in theory; heavy tails make the estimate noisy


def test_student_t_quantile_table_is_accurate():
    q = wlmod._abs_quantile("student_t", 3.0)
    logtau = np.concatenate([np.linspace(-99, -1e-6, 5001), [-150.0]])
    exact = -special.stdtrit(3.0, 0.5 * np.exp(logtau)) * np.sqrt(1 / 3)
    np.testing.assert_allclose(q(logtau), exact, rtol=1e-6)
    center = np.array([-1e-7, -1e-12])  # 1 - tau = -log tau: m = (1 - tau) / (2 f(0)), f(0) = 2 / (pi sqrt(3))
    np.testing.assert_allclose(q(center), -center * np.pi * np.sqrt(3) / 4 * np.sqrt(1 / 3), rtol=1e-6)


def head_fraction(w, q):
    """Per rank: the fraction of its top-k coordinates in the first q of the index space."""
    return [np.mean(np.array(sorted(topk_set(g, w.k))) < q * w.n) for g in w.grads(2, 0)]


@pytest.mark.parametrize("skew", [0.0, 0.5])
def test_skew_concentrates_large_coordinates_at_the_start(skew):
    for w in (Workload(n=200000, density=0.01, skew=skew, seed=5),
              Workload(n=200000, density=0.01, skew=skew, overlap=0.5, seed=5)):
        for q in (1 / 8, 1 / 2):
            assert head_fraction(w, q) == pytest.approx([q ** (1 - skew)] * 2, abs=0.03)


def test_strong_skew_saturates_the_head():
    w = Workload(n=200000, density=0.01, skew=0.8, seed=5)
    frac = head_fraction(w, 1 / 8)
    assert min(frac) > 0.5 and max(frac) < 1 / 8 ** 0.2  # beyond s = 0.5's 0.35, short of the unsaturated law
    assert set(range(30)) <= topk_set(w.grad(0, 0), w.k)  # the head is full


def test_layers_have_log_uniform_norms():
    sizes = [3000] * 40
    w = Workload(n=sum(sizes), layers=sizes, layer_spread=3.0, seed=4)
    g = w.grad(0, 0).astype(np.float64)
    rms = np.sqrt([np.mean(s ** 2) for s in np.split(g, np.cumsum(sizes)[:-1])])
    want = wlmod.layer_scales(w)
    np.testing.assert_allclose(rms, want, rtol=0.05)
    logs = np.log10(want)
    assert logs.min() >= -3 and logs.max() <= 0 and logs.max() - logs.min() > 2  # spread over ~3 decades
    assert stats.kstest(-logs / 3, "uniform").pvalue > 1e-3
    np.testing.assert_array_equal(w.grad(1, 0) != 0, True)
    flat = Workload(n=sum(sizes), layers=sizes, layer_spread=0.0, seed=4).grad(0, 0)
    np.testing.assert_array_equal(flat, Workload(n=sum(sizes), seed=4).grad(0, 0))


def test_model_layers():
    info = model_layer_params()["resnet20_cifar10"]
    w = Workload(n=info["total"], model="resnet20_cifar10")
    assert w.layers == tuple(info["sizes_in_registration_order"]) and sum(w.layers) == w.n
    with pytest.raises(ValueError, match="269722"):
        Workload(n=1000, model="resnet20_cifar10")
    with pytest.raises(ValueError, match="known models"):
        Workload(n=1000, model="resnet21")


@pytest.mark.parametrize("drift", [0.05, 0.3])
def test_drift_gives_ar1_correlation(drift, monkeypatch):
    rho = 1 - drift
    w = Workload(n=50000, drift=drift, seed=6)
    g = [w.grad(1, t).astype(np.float64) for t in range(6)]
    assert np.corrcoef(g[4], g[5])[0, 1] == pytest.approx(rho, abs=0.02)
    assert np.corrcoef(g[3], g[5])[0, 1] == pytest.approx(rho ** 2, abs=0.02)
    assert np.var(g[5]) == pytest.approx(1.0, rel=0.03)
    calls = []
    real = wlmod._normal
    monkeypatch.setattr(wlmod, "_normal", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    w.grad(1, 6)
    assert len(calls) == 1  # iteration t after t-1 costs one draw
    wlmod._STATE.items.clear()
    wlmod._STATE.size = 0
    np.testing.assert_array_equal(w.grad(1, 5), g[5].astype(np.float32))  # same values from scratch


def test_drift_zero_is_static_and_hot_sets_persist():
    w = Workload(n=3000, drift=0.0, seed=1)
    np.testing.assert_array_equal(w.grad(0, 0), w.grad(0, 9))
    w = Workload(n=3000, drift=0.5, overlap=0.5, seed=1)
    assert topk_set(w.grad(0, 0), w.k) == topk_set(w.grad(0, 3), w.k)


def test_npz_replay(tmp_path):
    pat = str(tmp_path / "g" / "rank{rank}_iter{iteration}.npz")
    data = {(r, t): np.random.default_rng([r, t]).standard_normal(300) for r in range(2) for t in range(2)}
    for (r, t), g in data.items():
        (tmp_path / "g").mkdir(exist_ok=True)
        np.savez(pat.format(rank=r, iteration=t), grad=g, layers=np.array([100, 200]))
    w = Workload(n=300, source={"path": pat, "key": "grad"})
    for (r, t), g in data.items():
        np.testing.assert_array_equal(w.grad(r, t), g.astype(np.float32))
    with pytest.raises(FileNotFoundError, match="rank2_iter0.npz"):
        w.grad(2, 0)
    with pytest.raises(ValueError, match=r"rank0_iter0.npz holds 300 values.*workload.n = 200"):
        Workload(n=200, source={"path": pat}).grad(0, 0)
    with pytest.raises(ValueError, match="has no array 'g'"):
        Workload(n=300, source={"path": pat, "key": "g"}).grad(0, 0)


@requires_torch
def test_record_gradients_from_a_torch_model(tmp_path):
    import torch

    from simsparse.gradient_files import record_gradients

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    pat = str(tmp_path / "r{rank}_i{iteration}.npz")
    for it in range(2):
        model.zero_grad()
        model(torch.randn(5, 8)).pow(2).sum().backward()
        record_gradients(model.parameters(), pat, rank=0, iteration=it)
        want = np.concatenate([p.grad.reshape(-1).numpy() for p in model.parameters()])
        w = Workload(n=len(want), source={"path": pat})
        np.testing.assert_array_equal(w.grad(0, it), want)
    with np.load(pat.format(rank=0, iteration=1)) as z:
        assert z["layers"].tolist() == [p.numel() for p in model.parameters()]
