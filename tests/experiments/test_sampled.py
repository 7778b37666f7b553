"""Sampled sparse workloads (evaluation: sampled, simsparse.sampling): each rank
draws only the entries above a floor, exactly in distribution, at O(k)."""
import dataclasses
import textwrap

import numpy as np
import pytest
from scipy import stats

from simsparse.compute.sampled import BelowFloor
from simsparse.experiments.config.schema import ConfigError, load_config
from simsparse.experiments.run.runner import simulate_point
from simsparse.sampling import sampled_gradient
from simsparse.sampling.gradient import _plan
from simsparse.workload import Workload

from tests.helpers import make_point

WORKLOADS = {
    "iid normal": {},
    "planted laplace": {"overlap": 0.5, "skew": 0.5, "distribution": "laplace"},
    "layers student_t": {"layers": [1500, 4000, 2500], "layer_spread": 2.0, "distribution": "student_t"},
}


def _close(a, b, z=4.0):
    """Means of two samples within z standard errors (or equal)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    se = np.sqrt(a.var() / len(a) + b.var() / len(b))
    return abs(a.mean() - b.mean()) <= z * se + 1e-12 * abs(a.mean())


@pytest.mark.parametrize("name", WORKLOADS)
def test_the_entries_above_a_magnitude_are_the_full_draws(name):
    """Over many draws: how many entries reach a magnitude near the k-th
    largest, and the k-th largest magnitude itself, have the full draw's
    distribution."""
    w = Workload(n=8000, density=0.01, **WORKLOADS[name])
    F = _plan(w, 4.0)[0]
    full = [w.grad(r, t) for r in range(4) for t in range(40)]
    samp = [sampled_gradient(w, r, t) for r in range(4) for t in range(40)]
    thr = 1.3 * F
    assert _close([np.count_nonzero(np.abs(g) >= thr) for g in full], [s.count_above(thr) for s in samp])
    kth_full = [np.sort(np.abs(g))[-w.k] for g in full]
    kth_samp = [np.abs(s.topk(w.k).values).min() for s in samp]
    assert stats.ks_2samp(kth_full, kth_samp).pvalue > 1e-3
    assert all(len(s.values) < 8 * w.k for s in samp)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["topka", "gaussiank", "oktopk", "cltk"])
def test_runs_match_full_runs_in_distribution(algorithm):
    """Times and bytes (the selected counts) of sampled runs against
    full-value runs at P = 4, over seeds, on three workloads."""
    for wl in WORKLOADS.values():
        full, samp = [], []
        for seed in range(8):
            p = make_point(algorithm, 4, n=8000, density=0.01, seed=seed, iterations=2, warmup=1,
                           params={"tau": 2, "tau_prime": 2} if algorithm == "oktopk" else None)
            p = dataclasses.replace(p, workload={**p.workload, **wl})
            f, s = simulate_point(p).row, simulate_point(dataclasses.replace(p, evaluation="sampled")).row
            assert s["values"] == "sampled" and s["correct"] is None
            full.append((f["time_s"], f["bytes_total"]))
            samp.append((s["time_s"], s["bytes_total"]))
        full, samp = np.array(full), np.array(samp)
        assert _close(full[:, 0], samp[:, 0]) and _close(full[:, 1], samp[:, 1]), (algorithm, wl)


def test_o_of_k():
    """A billion-element gradient: about margin x k entries, in milliseconds."""
    w = Workload(n=10**9, density=1e-5)
    s = sampled_gradient(w, 3, 0)
    assert len(s) == 10**9 and 3 * w.k < len(s.values) < 5 * w.k
    assert s.values.nbytes + s.indices.nbytes < 1e6


def test_the_coin_flips_and_signs_are_exact_in_distribution():
    """The kept positions (geometric gaps from exponentials): their count is
    Binomial(m, p) and they fall uniformly over 0 .. m-1; the signs are fair
    and the tail probabilities uniform on [lo, top); a tiny p keeps nothing
    without overflowing the gaps."""
    from simsparse.sampling.draws import _bernoulli
    from simsparse.sampling.gradient import _tail_and_sign

    rng = np.random.default_rng(7)
    m, p = 5000, 0.013
    draws = [_bernoulli(rng, m, p) for _ in range(600)]
    counts = np.array([len(d) for d in draws])
    assert abs(counts.mean() - m * p) < 4 * np.sqrt(m * p * (1 - p) / len(counts))
    assert 0.8 < counts.var() / (m * p * (1 - p)) < 1.25
    pos = np.concatenate(draws)
    assert all(np.all(np.diff(d) > 0) for d in draws) and pos.min() >= 0 and pos.max() < m
    assert stats.chisquare(np.bincount(pos * 20 // m, minlength=20)).pvalue > 1e-3
    assert len(_bernoulli(rng, 10**6, 1e-300)) == 0
    tau, up = _tail_and_sign(rng.random(40000), 0.25, 0.5)
    assert abs(up.mean() - 0.5) < 4 * 0.5 / np.sqrt(len(up))
    assert tau.min() >= 0.25 and tau.max() < 0.5
    assert stats.kstest(tau[up], stats.uniform(0.25, 0.25).cdf).pvalue > 1e-3
    assert stats.kstest(tau[~up], stats.uniform(0.25, 0.25).cdf).pvalue > 1e-3


def test_a_threshold_below_the_floor_is_refused():
    s = sampled_gradient(Workload(n=5000, density=0.01), 0, 0)
    with pytest.raises(BelowFloor, match="below the sampled floor.*evaluation: exact"):
        s.threshold_select(0.5 * s.floor)
    # values at indices not drawn come from below the floor, the same each time
    idx = np.setdiff1d(np.arange(40), s.indices)[:5]
    v = s.gather_at(idx)
    assert (np.abs(v) < s.floor).all() and np.array_equal(v, s.gather_at(idx))


@pytest.mark.parametrize("extra,refusal", [
    ("algorithms: [fft_allgather]", "reads every value of its input"),
    ("algorithms: [deft]", "reads every value of its input"),
    ("algorithms: [qsgd_allgather]\niterations: 2", "reads every value of its input"),
    # drift and error feedback over iterations (simsparse.sampling.paths)
    ("algorithms: [topka]\nworkload: {n: 4000, drift: 0.5, overlap: 0.5}", "normal gradients without planted"),
    ("algorithms: [{name: topka, error_feedback: true}]\niterations: 2\nworkload: {n: 4000, distribution: laplace}",
     "normal gradients"),
    ("algorithms: [{name: topka, error_feedback: true}]\niterations: 5", "at most 4"),
    ("algorithms: [{name: topka, error_feedback: true}]\niterations: 2\nworkload: {n: 4000, drift: 0}", "drift = 0"),
])
def test_what_cannot_be_sampled_is_refused_with_one_sentence(tmp_path, extra, refusal):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(textwrap.dedent("""
        name: s
        network: aries_alphabeta
        workload: {n: 4000}
        P: 4
        evaluation: sampled
        """) + extra + "\n")
    with pytest.raises(ConfigError, match=refusal):
        load_config(cfg)
    ok = tmp_path / "ok.yaml"
    ok.write_text("name: s\nnetwork: aries_alphabeta\nworkload: {n: 4000}\nP: 4\nevaluation: sampled\n"
                  "algorithms: [ring, oktopk, topkdsa]\n")
    assert len(load_config(ok).points) == 3


def test_the_compiled_normal_quantile_is_scipys(monkeypatch):
    """AS 241 (compiled) against scipy's ndtri, from the deepest tails to the
    centre; without numba the module is scipy's."""
    from scipy import special

    from simsparse import quantile

    p = np.concatenate([np.logspace(-300, -1, 3000), np.linspace(0.01, 0.99, 3001), 1 - np.logspace(-16, -1, 500)])
    want = special.ndtri(p)
    got = quantile.ndtri(p)
    assert np.all(np.abs(got - want) <= 1e-14 * np.maximum(np.abs(want), 1.0))
    monkeypatch.setattr(quantile, "_KERNEL", None)
    assert np.array_equal(quantile.ndtri(p), want)


@pytest.mark.parametrize("algorithm,margin", [("oktopk", 4 / 3 + 8 / 2000 ** 0.5), ("topka", 1 + 8 / 2000 ** 0.5),
                                              ("gaussiank", 4.0)])
def test_each_algorithm_draws_its_own_margin(monkeypatch, algorithm, margin):
    """Ok-Topk's thresholds stay near its k-th magnitude: it draws 4/3 k
    entries per rank plus eight standard deviations (at most 2 k); an exact
    top-k (TopkA) k plus eight; the others 4 k (``Sampling.margin_for``)."""
    import simsparse.experiments.run.simulate as simulate

    drawn, real = [], simulate.sampled_gradient

    def spy(w, rank, it, m=4.0, **kw):
        g = real(w, rank, it, m, **kw)
        drawn.append((m, len(g.values) / w.k))
        return g

    monkeypatch.setattr(simulate, "sampled_gradient", spy)
    p = make_point(algorithm, 4, n=200000, density=0.01, seed=1, iterations=1, warmup=0)
    assert simulate_point(dataclasses.replace(p, evaluation="sampled")).row["values"] == "sampled"
    assert drawn and all(m == margin and 0.9 * margin < per_k < 1.1 * margin for m, per_k in drawn)


def test_the_fused_draws_equal_the_numpy_path_bit_for_bit():
    """The compiled walk of the coin flips' gaps and the fused tail values
    give the numpy path's positions and values exactly (the same operations
    in the same order; both read the compiled normal quantile)."""
    from simsparse import quantile
    from simsparse.sampling import draws as sampling
    from simsparse.sampling.gradient import _tail_and_sign

    if sampling._WALK is None or quantile._TAIL is None:
        pytest.skip("numba disabled")
    rng = np.random.default_rng(5)
    for m, p in [(5000, 0.013), (10**6, 0.02), (10**6, 1e-300), (300, 0.9)]:
        seed = int(rng.integers(2**31))
        got = sampling._bernoulli(np.random.default_rng(seed), m, p)
        walk, sampling._WALK = sampling._WALK, None
        try:
            want = sampling._bernoulli(np.random.default_rng(seed), m, p)
        finally:
            sampling._WALK = walk
        assert got.dtype == want.dtype and np.array_equal(got, want)
    r = np.concatenate([rng.random(20000), [0.0, 0.5, 0.9999999999]])
    for lo, top, scale, dtype in [(0.0, 0.02, 1.0, np.float32), (0.01, 1.0, 3.5, np.float64), (0.0, 1e-310, 2.0, np.float32)]:
        got = quantile.tail_values(r, lo, top, scale, dtype)
        tau, up = _tail_and_sign(r, lo, top)
        want = (np.where(up, 1.0, -1.0) * (-quantile.ndtri(0.5 * np.maximum(tau, 1e-300)) * scale)).astype(dtype)
        assert got.dtype == want.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("layers", [None, [1500, 4000, 2500, 7]])
def test_the_compiled_layer_loop_draws_the_python_loops_gradient(monkeypatch, layers):
    """A normal gradient drawn in one compiled pass over its layers has the
    Python loop's indices, values and moments bit for bit (float32 and
    float64, a layer every coordinate of which reaches the floor)."""
    from simsparse.sampling import gradient

    if gradient._DRAWN is None:
        pytest.skip("numba disabled")
    for dtype, margin in [("float32", 4.0), ("float64", 1.3), ("float32", 9000.0)]:
        w = Workload(n=8007 if layers else 20000, density=0.01, dtype=dtype, seed=3,
                     **({"layers": layers, "layer_spread": 2.0} if layers else {}))
        got = []
        for fn in (gradient._DRAWN, None):
            monkeypatch.setattr(gradient, "_DRAWN", fn)
            g = sampled_gradient(w, 2, 1, margin)
            got.append((g.indices, g.values, g.moments))
        (i1, v1, m1), (i2, v2, m2) = got
        assert i1.dtype == i2.dtype and np.array_equal(i1, i2) and len(i1) > 0
        assert v1.dtype == v2.dtype and np.array_equal(v1, v2) and m1 == m2


def test_a_sampled_top_k_is_the_k_largest_magnitudes_with_the_first_of_tied_ones():
    from simsparse.compute.sampled import Sampled

    values = np.array([0.5, -3.0, 2.0, -2.0, 1.0, 2.0, -0.1], dtype=np.float32)
    s = Sampled(100, np.arange(10, 17, dtype=np.int32), values, 0.05, None, (0.0, 1.0))
    assert s.topk(3).indices.tolist() == [11, 12, 13]   # 3.0, then the first two of the three 2.0s
    assert s.topk(4).indices.tolist() == [11, 12, 13, 15]
    assert s.topk(7).indices.tolist() == list(range(10, 17)) and s.topk(0).nnz == 0
    rng = np.random.default_rng(2)
    v = rng.standard_normal(5000).astype(np.float32)
    got = Sampled(10**6, np.arange(5000, dtype=np.int32) * 7, v, 0.0, None, (0.0, 1.0)).topk(700)
    want = np.sort(np.argsort(-np.abs(v), kind="stable")[:700])
    assert got.indices.tolist() == (want * 7).tolist() and np.array_equal(got.values, v[want])


def test_ok_topk_draws_less_at_large_k_and_its_reused_thresholds_stay_above_the_floor():
    """The margin falls with k (2 k up to k = 144, 1.41 k at 10 k); ten
    iterations of Ok-Topk at k = 10 k, reusing its thresholds between exact
    ones, never reach below the floor (which would be a clear error)."""
    from simsparse.algorithms import ALGORITHMS

    sampling = ALGORITHMS["oktopk"].sampling
    assert sampling.margin_for(80) == 2.0 and sampling.margin_for(144) == 2.0
    assert sampling.margin_for(10_000) == pytest.approx(4 / 3 + 0.08)
    p = make_point("oktopk", 4, n=10**6, density=0.01, seed=3, iterations=10, warmup=0,
                   params={"tau": 5, "tau_prime": 5})
    row = simulate_point(dataclasses.replace(p, evaluation="sampled")).row
    assert row["values"] == "sampled" and row["time_s"] > 0


def test_a_widened_single_iteration_draw_admits_more_from_streams_of_its_own():
    """One draw per iteration (no path law): the widest factor sets one floor
    for every iteration (a static gradient stays the same one), about that
    many times the entries, from salted streams (not the run that chose it)."""
    w = Workload(n=200000, density=0.01, drift=0.0)
    plain = sampled_gradient(w, 0, 0, 2.0)
    wide = [sampled_gradient(w, 0, t, 2.0, widen=(1.0, 1.5)) for t in (0, 1)]
    assert np.array_equal(wide[0].indices, wide[1].indices) and wide[0].floor < plain.floor
    assert 1.4 < len(wide[0].values) / len(plain.values) < 1.6
    top = np.intersect1d(wide[0].indices, plain.indices)
    assert len(top) < 0.2 * len(plain.indices)   # independent draws: overlap by chance only (about 3 %)


def test_the_compiled_merge_finds_what_the_binary_search_finds(monkeypatch):
    """Sampled._find and zero_at for ascending queries (one compiled merge
    pass each) and by searchsorted and a mask: the same positions, carried
    flags and entries left, with
    queries repeated, beyond the last index and into an empty vector."""
    from simsparse.compute import sampled as sm

    if sm._LOCATE is None:
        pytest.skip("numba disabled")
    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(1, 3000))
        carried = np.sort(rng.choice(n, size=int(rng.integers(0, min(n, 400) + 1)), replace=False)).astype(np.int32)
        v = sm.Sampled(n, carried, rng.standard_normal(len(carried)).astype(np.float32), 1.0, None, (0.0, 1.0))
        q = np.sort(rng.integers(0, n + 5, int(rng.integers(2, 300)))).astype(np.int32)
        got, kept = v._find(q), v.zero_at(q)
        monkeypatch.setattr(sm, "_LOCATE", None)
        monkeypatch.setattr(sm, "_DROP", None)
        want, wkept = v._find(q), v.zero_at(q)
        monkeypatch.undo()
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(kept.indices, wkept.indices)   # zero_at: one merge pass, and by a mask
        np.testing.assert_array_equal(kept.values, wkept.values)
