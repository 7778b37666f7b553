"""Sampled gradients over several iterations (simsparse.sampling.paths):
drift and error feedback, each coordinate's path drawn where it reaches a
floor of some iteration, the others integrated over the box below them."""
import dataclasses

import numpy as np
import pytest
from scipy import stats

from simsparse.compute.sampled import BelowFloor
from simsparse.experiments.run.runner import simulate_point
from simsparse.sampling import sampled_gradient
from simsparse.sampling.box import box_moments, drawn_probability, tail_in_box
from simsparse.sampling.law import PathLaw, path_law
from simsparse.sampling.paths import draw_paths, path_plan
from simsparse.workload import Workload

from tests.experiments.test_sampled import _close
from tests.helpers import make_point

LAWS = [PathLaw(0.8, True, 2), PathLaw(0.8, True, 4), PathLaw(0.8, False, 3), PathLaw(0.0, True, 3),
        PathLaw(0.99, False, 2)]


@pytest.fixture(scope="module")
def mc():
    """Monte Carlo vectors of each law (4 M) and the bounds: 2.3 sd per iteration."""
    rng = np.random.default_rng(11)
    out = {}
    for law in LAWS:
        f = 2.3 * np.sqrt(np.diag(law.cov))
        out[law] = (f, rng.standard_normal((4_000_000, law.T)) @ np.linalg.cholesky(law.cov).T)   # (4x cheaper than the SVD)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("law", LAWS, ids=str)
def test_the_box_integrals_are_monte_carlos(law, mc):
    """Drawn probability, the moments below the floors and the tail masses
    within the box agree with 4 M Monte Carlo vectors within 4 standard errors."""
    f, A = mc[law]
    inside = np.all(np.abs(A) < f, axis=1)
    p = drawn_probability(law, f)
    P, E2, E4 = box_moments(law, f)
    assert abs(P + p - 1) < 1e-5
    assert abs(p - (1 - inside.mean())) < 4 * np.sqrt(p * (1 - p) / len(A))
    In = A[inside]
    for t in range(law.T):
        for got, x in ((E2[t], In[:, t] ** 2), (E4[t], In[:, t] ** 4)):
            assert abs(got - x.mean()) < 4 * x.std() / np.sqrt(len(x)), (t, got, x.mean())
    y = np.array([0.3, 0.7, 0.95]) * f[-1]
    for got, yy in zip(tail_in_box(law, f, law.T - 1, y) / P, y):
        q = np.mean(np.abs(In[:, -1]) >= yy)
        assert abs(got - q) < 4 * np.sqrt(q * (1 - q) / len(In)) + 1e-9


@pytest.mark.parametrize("law", LAWS, ids=str)
def test_the_box_integrals_hold_from_narrow_to_far_wider_than_the_gaussian(law):
    """Bounds from half a standard deviation to 200 (a BERT layer of scale
    0.01 puts the floors 100 out), alike and mixed over the iterations: the
    box's mass and the drawn probability sum to 1 within 1e-7, and a box
    that holds nearly everything has the Gaussian's own moments (a product
    grid over [-f, f] had given E[A^2 | box] = 2.7e4 for a variance of 1)."""
    sd = np.sqrt(np.diag(law.cov))
    mixed = np.where(np.arange(law.T) % 2 == 0, 40.0, 1.5)
    for r in [0.5, 1.0, 2.3, 4.0, 6.4, 6.6, 12.0, 200.0, mixed, mixed[::-1]]:
        f = sd * r
        P, E2, E4 = box_moments(law, f)
        p = drawn_probability(law, f)
        assert abs(P + p - 1) < 1e-7, (r, P, p)
        if np.ndim(r) == 0 and r >= 12:
            assert np.allclose(E2, sd ** 2, rtol=1e-8) and np.allclose(E4, 3 * sd ** 4, rtol=1e-6)
            assert p < 1e-30
    f = sd * mixed   # against Monte Carlo: the wide iterations' moments are nearly the Gaussian's, the others not
    A = np.random.default_rng(5).multivariate_normal(np.zeros(law.T), law.cov, size=1_000_000)
    In = A[np.all(np.abs(A) < f, axis=1)]
    P, E2, _ = box_moments(law, f)
    assert abs(P - len(In) / len(A)) < 4 * np.sqrt(P * (1 - P) / len(A))
    for t in range(law.T):
        x = In[:, t] ** 2
        assert abs(E2[t] - x.mean()) < 4 * x.std() / np.sqrt(len(x)), (t, E2[t], x.mean())


@pytest.mark.parametrize("law", LAWS, ids=str)
def test_the_drawn_paths_are_the_vectors_that_reach_a_floor(law, mc):
    """The union proposal gives the law conditioned on reaching some floor:
    every marginal (KS) and the correlation of the first two iterations."""
    f, A = mc[law]
    out = A[~np.all(np.abs(A) < f, axis=1)][:100_000]
    tail = 2 * stats.norm.sf(f / np.sqrt(np.diag(law.cov)))
    D = draw_paths(np.random.default_rng(3), law, f[None, :], np.zeros(len(out), dtype=np.int64), tail[None, :])
    assert np.all(np.any(np.abs(D) >= f, axis=1))
    for t in range(law.T):
        assert stats.ks_2samp(D[:, t], out[:, t]).pvalue > 1e-3
    r1, r2 = np.corrcoef(D[:, 0], D[:, 1])[0, 1], np.corrcoef(out[:, 0], out[:, 1])[0, 1]
    assert abs(np.arctanh(r1) - np.arctanh(r2)) < 4 * np.sqrt(2 / (len(D) - 3))


def _sums(w, r, T, ef):
    """Rank r's full vectors at iterations 0 .. T-1: the gradient, or its running sum under error feedback."""
    g = [w.grad(r, t).astype(np.float64) for t in range(T)]
    return list(np.cumsum(g, axis=0)) if ef else g


@pytest.mark.parametrize("ef", [False, True])
def test_every_iteration_is_the_full_draws_in_distribution(ef):
    """Over ranks: per iteration, counts above a magnitude near the k-th
    largest (above and below the floor), the k-th largest magnitude, and the
    moments a Gaussian-k threshold reads, against full draws (running sums
    of them under error feedback, as no selection takes anything)."""
    w = Workload(n=6000, density=0.01, drift=0.3, layers=(1500, 2500, 2000), layer_spread=1.0)
    T = 3
    law = path_law(w, ef, T)
    F = path_plan(w, 4.0, None, law).F
    full, samp = {}, {}
    for r in range(160):
        xs = _sums(w, r, T, ef)
        acc = None
        for t in range(T):
            g = sampled_gradient(w, r, t, 4.0, law=law)
            acc = g if acc is None or not ef else g.plus(acc)
            x = xs[t]
            kth = np.sort(np.abs(x))[-w.k]
            full.setdefault(t, []).append((np.count_nonzero(np.abs(x) >= 1.2 * F[t]),
                                           np.count_nonzero(np.abs(x) >= 0.8 * F[t]), kth, x.std(ddof=1)))
            samp.setdefault(t, []).append((acc.count_above(1.2 * F[t]), acc.count_above(0.8 * F[t]),
                                           np.abs(acc.topk(w.k).values).min(), acc.moments[1]))
    for t in range(T):
        a, b = np.array(full[t]), np.array(samp[t])
        for j in range(4):
            assert _close(a[:, j], b[:, j]), (t, j, a[:, j].mean(), b[:, j].mean())
        assert stats.ks_2samp(a[:, 2], b[:, 2]).pvalue > 1e-3


def test_counts_under_the_floor_are_consistent_and_values_there_stay_under_it():
    w = Workload(n=6000, density=0.01, drift=0.5)
    law = path_law(w, True, 2)
    s = sampled_gradient(w, 0, 1, 4.0, law=law)
    thr = s.floor * np.array([0.9, 0.5, 0.7, 0.6, 0.95])
    counts = [s.count_above(x) for x in thr]
    order = np.argsort(thr)
    assert np.all(np.diff(np.array(counts)[order]) <= 0) and counts == [s.count_above(x) for x in thr]
    with pytest.raises(BelowFloor):
        s.threshold_select(0.9 * s.floor)
    idx = np.setdiff1d(np.arange(200), s.indices)[:20]
    v = s.gather_at(idx)
    assert np.all(np.abs(v) < s.floor) and np.array_equal(v, s.gather_at(idx))


def test_a_top_k_whose_smallest_carried_magnitude_is_under_the_floor_is_refused():
    w = Workload(n=6000, density=0.01, drift=0.5)
    s = sampled_gradient(w, 0, 1, 4.0, law=path_law(w, False, 3))
    assert np.abs(s.values).min() < s.floor   # (drawn for another iteration)
    with pytest.raises(BelowFloor):
        s.topk(len(s.values) - 1)
    assert len(s.topk(w.k).values) == w.k


@pytest.mark.parametrize("algorithm", ["topka", "gaussiank", "gtopk", "topkdsa", "cltk", "oktopk"])
def test_runs_with_drift_and_error_feedback_match_full_runs_in_distribution(algorithm):
    """Times and bytes over seeds at P = 4: error feedback over two
    iterations with drift 0.2 (Ok-Topk: its thresholds exact in the first,
    reused in the second, where the residual puts them under the floor:
    run again with that floor widened)."""
    full, samp = [], []
    for seed in range(8):
        params = {"error_feedback": True, **({"tau": 2, "tau_prime": 2} if algorithm == "oktopk" else {})}
        p = make_point(algorithm, 4, n=8000, density=0.01, seed=seed, iterations=1, warmup=1, params=params)
        p = dataclasses.replace(p, workload={**p.workload, "drift": 0.2, "layers": [1500, 4000, 2500]})
        f, s = simulate_point(p).row, simulate_point(dataclasses.replace(p, evaluation="sampled")).row
        assert s["values"] == "sampled" and (s["sampled_widen"] != "") == (algorithm == "oktopk"), s["sampled_widen"]
        full.append((f["time_s"], f["bytes_total"]))
        samp.append((s["time_s"], s["bytes_total"]))
    full, samp = np.array(full), np.array(samp)
    assert _close(full[:, 0], samp[:, 0]) and _close(full[:, 1], samp[:, 1]), (full.mean(0), samp.mean(0))


def test_the_compiled_rounds_draw_what_numpy_draws(monkeypatch):
    """draw_paths compiled (its rounds in one call, drawing from the
    generator itself) and in numpy, from one seed: the same vectors to
    1e-12 and the generator left in the same state (so every round took
    the same draws and accepted the same rows)."""
    from simsparse.sampling import paths

    if paths._ROUNDS is None:
        pytest.skip("numba disabled")
    w = Workload(n=60000, density=0.01, drift=0.3, layers=(15000, 25000, 20000), layer_spread=1.0)
    for ef, T in ((True, 2), (True, 4), (False, 3)):
        law = path_law(w, ef, T)
        plan = path_plan(w, 4.0, None, law)
        rows = np.random.default_rng(T).integers(0, 3, 20000)
        got = []
        for rounds in (paths._ROUNDS, None):
            monkeypatch.setattr(paths, "_ROUNDS", rounds)
            rng = np.random.default_rng(7)
            got.append((draw_paths(rng, law, plan.f, rows, plan.tail), rng.random()))
        np.testing.assert_allclose(got[0][0], got[1][0], rtol=1e-12, atol=1e-12)
        assert got[0][1] == got[1][1]


def test_the_compiled_layer_coins_are_the_numpy_coins(monkeypatch):
    """Which coordinates of each layer are kept, compiled in one call and
    layer by layer in numpy: the same positions and counts, the generator
    left in the same state (layers empty, never kept, always kept)."""
    from simsparse.sampling import draws

    if draws._LAYERS is None:
        pytest.skip("numba disabled")
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 50000, 40)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    p = rng.random(40) ** 4 * 0.1
    p[3], p[5], sizes[7] = 0.0, 1.0, 0
    got = []
    for fn in (draws._LAYERS, None):
        monkeypatch.setattr(draws, "_LAYERS", fn)
        g = np.random.default_rng(3)
        got.append((*draws.kept_in_layers(g, starts, sizes, p), g.random()))
    assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])
    assert got[0][2] == got[1][2] and got[0][1][5] == sizes[5] and got[0][1][3] == 0


def test_coordinates_bounded_far_out_are_marginalised_in_the_tails():
    """tail_in_box leaves out the coordinates whose bound lies 6.5 standard
    deviations out or more: within 1e-9 of the nested rule over all of them."""
    from simsparse.sampling import box

    for law in LAWS:
        if law.T < 3:
            continue
        sd = np.sqrt(np.diag(law.cov))
        f = sd * np.where(np.arange(law.T) == 1, 2.0, 7.0)
        f[0] = 2.5 * sd[0]
        y = np.linspace(0.0, f[1], 9)
        got = tail_in_box(law, f, 1, y)
        want = _tail_over_all(box, law, f, 1, y)
        assert np.max(np.abs(got - want)) < 1e-9, (law, got, want)


def _tail_over_all(box, law, f, t, y):
    """tail_in_box with every other coordinate in the nested rule (none marginalised)."""
    keep = box._bounded
    try:
        box._bounded = lambda law, f, coords: list(coords)
        return box.tail_in_box(law, f, t, y)
    finally:
        box._bounded = keep


def test_a_run_below_a_floor_widens_that_iteration_and_the_later_ones():
    """The next run's factors: the entries the query needed plus eight
    standard deviations over what the floor carried, at least 1.25 times as
    many, twice where the need is unknown; later iterations at least as wide."""
    from simsparse.sampling import widened

    err = BelowFloor("x", needed=400, have=200)
    err.iteration = 1
    w = widened(None, err, 4)
    assert w[0] == 1.0 and w[1] == pytest.approx((400 + 8 * 20 + 10) / 200) and w[2] == w[3] == w[1]
    err = BelowFloor("x", needed=100, have=200)
    err.iteration = 2
    assert widened(w, err, 4) == (1.0, w[1], w[2] * 1.25, w[2] * 1.25)
    err = BelowFloor("x")
    err.iteration = 0
    assert widened(None, err, 2) == (2.0, 2.0)


def test_a_selection_below_the_floor_says_what_it_needed():
    """A reused threshold under the floor: the count it needed (drawn above
    it, and under the floor by the conditional binomials) and what the floor
    carried, for the simulator to widen it."""
    w = Workload(n=6000, density=0.01, drift=0.5)
    s = sampled_gradient(w, 0, 1, 2.0, law=path_law(w, True, 2))
    with pytest.raises(BelowFloor) as err:
        s.threshold_select(0.8 * s.floor)
    have = int(np.count_nonzero(np.abs(s.values) >= s.floor))
    assert err.value.have == have and err.value.needed == s.count_above(0.8 * s.floor) > have


def test_paths_kept_between_iterations_are_the_paths_drawn_at_each():
    """Drawn once and kept to the last iteration, or drawn again at every
    one from the same seed: the same indices and values, and nothing kept
    after the last."""
    w = Workload(n=6000, density=0.01, drift=0.3, layers=(1500, 2500, 2000), layer_spread=1.0)
    law, kept = path_law(w, True, 3), {}
    for t in range(3):
        for r in range(2):
            a, b = sampled_gradient(w, r, t, 2.0, law=law, kept=kept), sampled_gradient(w, r, t, 2.0, law=law)
            assert np.array_equal(a.indices, b.indices) and np.array_equal(a.values, b.values)
    assert kept == {}


def test_points_that_draw_alike_share_a_ranks_paths(monkeypatch):
    """Exact top-k selectors of one config (TopkA, gTopk: the same margin,
    law and span) draw each rank's paths once per process: the second
    point draws nothing and gets the times it gets from fresh draws; past
    the cap the least recently used paths are let go."""
    from simsparse.sampling import paths

    base = make_point("topka", 6, n=20000, density=0.01, iterations=1, warmup=1, evaluation="sampled",
                      params={"error_feedback": True})
    base = dataclasses.replace(base, workload={**base.workload, "drift": 0.3}, check=False)
    other = dataclasses.replace(base, algorithm="gtopk")
    def fresh():
        monkeypatch.setattr(paths, "_SHARED", paths.OrderedDict())
        monkeypatch.setattr(paths, "_shared_B", [0])

    fresh()
    calls, real = [], paths.draw_paths
    monkeypatch.setattr(paths, "draw_paths", lambda *a: calls.append(1) or real(*a))
    simulate_point(base)
    first = len(calls)
    shared = simulate_point(other).row["time_s"]
    assert first == 6 and len(calls) == first
    fresh()
    assert simulate_point(other).row["time_s"] == shared and len(calls) == 2 * first
    one = sum(a.nbytes for a in next(iter(paths._SHARED.values())))
    monkeypatch.setattr(paths, "SHARED_PATHS_MAX_B", 8 * one + 1)
    simulate_point(dataclasses.replace(other, P=12))
    assert paths._shared_B[0] <= 8 * one + 1 and len(paths._SHARED) <= 9


def test_ok_topk_under_error_feedback_learns_its_floors_from_a_pilot(monkeypatch):
    """Ok-Topk's reused thresholds under error feedback: a pilot at PILOT_P
    ranks runs (and widens) first, the point itself then once, with the
    pilot's floors, and the same point at another P reuses the pilot; TopkA
    (exact top-k) runs no pilot."""
    import simsparse.experiments.run.simulate as simulate
    import simsparse.sampling as sampling

    made, real = [], simulate.SimBackend
    monkeypatch.setattr(sampling, "_PILOTS", {})

    def counting(resolved, *a, **kw):
        made.append((resolved.point.P, kw.get("widen", a[3] if len(a) > 3 else None)))
        return real(resolved, *a, **kw)

    monkeypatch.setattr(simulate, "SimBackend", counting)
    for algorithm, params in (("oktopk", {"error_feedback": True, "tau": 2, "tau_prime": 2}),
                              ("topka", {"error_feedback": True})):
        made.clear()
        p = make_point(algorithm, 8, n=8000, density=0.01, seed=0, iterations=1, warmup=1, params=params)
        p = dataclasses.replace(p, workload={**p.workload, "drift": 0.2}, evaluation="sampled")
        row = simulate_point(p).row
        if algorithm == "oktopk":
            pilot = [w for P, w in made if P == simulate.PILOT_P]
            assert len(pilot) >= 2 and pilot[0] is None and row["sampled_widen"]
            # (once, or twice where its bulk evaluation met what fast does not keep and it ran again as events)
            assert set(w for P, w in made if P == 8) == {pilot[-1]}
            made.clear()
            again = simulate_point(dataclasses.replace(p, P=12)).row
            assert {x for x in made} == {(12, pilot[-1])} and again["sampled_widen"] == row["sampled_widen"]
        else:
            assert made == [(8, None)] and row["sampled_widen"] == ""
