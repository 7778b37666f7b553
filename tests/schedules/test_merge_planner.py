"""Merge planners (simsparse.schedules.planner) against hand computations
and brute force over all 2^(L-1) plans."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simsparse
from simsparse.schedules.planner import (mgwfbp_plan, omgs_plan, optimal_plan, pipeline_time,
                                         threshold_plan)


def all_plans(L):
    for mask in range(1 << (L - 1)):
        plan, n = [], 0
        for i in range(L - 1):
            n += 1
            if mask >> i & 1:
                plan.append(n)
                n = 0
        yield tuple(plan) + (n + 1,)


def brute(tb, sizes, ts, tc, tf=0.0):
    return min(pipeline_time(p, tb, sizes, ts, tc, tf).t_iter for p in all_plans(len(tb)))


def t_of(plan, tb, sizes, ts, tc, tf=0.0):
    return pipeline_time(plan, tb, sizes, ts, tc, tf).t_iter


def zero(d):
    return 0.0


def model(seed, dense, L=None):
    """A random model: tb, sizes, ts (gamma d log2 d or 0), tc = alpha + beta d."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 13)) if L is None else L
    scale = 10 ** rng.uniform(-4, -1)
    tb = (rng.uniform(0, 1, L) * scale).tolist()
    sizes = np.maximum(1, 10 ** rng.uniform(0, 6, L)).astype(int).tolist()
    alpha, beta = 10 ** rng.uniform(-5, -1), 10 ** rng.uniform(-11, -7)
    gamma = 10 ** rng.uniform(-11, -7)

    def tc(d):
        return alpha + beta * d

    def ts(d):
        return gamma * d * math.log2(d) if d > 0 else 0.0

    return tb, sizes, (zero if dense else ts), tc, alpha, float(rng.uniform(0, scale))


# --- pipeline_time -------------------------------------------------------------------------

def test_pipeline_time_all_merged_is_topk_sgd_eq4():
    tb, sizes, tf = [1.0, 2.0, 0.5], [10, 20, 30], 0.25
    ts, tc = (lambda d: 0.01 * d), (lambda d: 3.0 + 0.1 * d)
    tl = pipeline_time((3,), tb, sizes, ts, tc, tf)
    assert tl.t_iter == pytest.approx(tf + 3.5 + 0.6 + 9.0)  # tf + sum tb + ts(d) + tc(d)
    assert tl.compute == pytest.approx(tf + 3.5 + 0.6)
    assert tl.non_overlapped == pytest.approx(9.0)
    assert tl.start_backward == (tf,) and tl.start_comm == pytest.approx((tf + 4.1,))


def test_pipeline_time_free_communication_is_compute():
    tb, sizes = [1.0, 2.0, 0.5], [10, 20, 30]
    ts = lambda d: 0.01 * d  # noqa: E731
    tl = pipeline_time((1, 1, 1), tb, sizes, ts, zero, 0.5)
    assert tl.t_iter == pytest.approx(0.5 + 3.5 + 0.6)
    assert tl.non_overlapped == pytest.approx(0.0)


def test_pipeline_time_hand_computed_groups():
    # groups (2, 1): device 0-3 backward, 3-4 ts(3); then 4-6 backward, 6-7 ts(1)
    # comm: group 0 at 4 for 1 + 3 = 4 -> 8; group 1 ready 7, waits for 8 -> 8 + 2 = 10
    tb, sizes = [1.0, 2.0, 2.0], [1, 2, 1]
    ts, tc = (lambda d: 1.0), (lambda d: 1.0 + d)
    tl = pipeline_time((2, 1), tb, sizes, ts, tc)
    assert tl.start_backward == (0.0, 4.0)
    assert tl.start_sparsify == (3.0, 6.0)
    assert tl.start_comm == (4.0, 8.0)
    assert tl.end_comm == (8.0, 10.0)
    assert (tl.t_iter, tl.compute, tl.non_overlapped) == (10.0, 7.0, 3.0)


def test_pipeline_time_one_tensor_and_bad_plans():
    tl = pipeline_time((1,), [2.0], [5], lambda d: 0.5, lambda d: 1.0 + d, 1.0)
    assert tl.t_iter == 1.0 + 2.0 + 0.5 + 6.0
    for bad in [(1, 1, 1), (3,), (0, 2), ()]:
        with pytest.raises(ValueError):
            pipeline_time(bad, [1.0, 1.0], [1, 1], zero, zero)


# --- threshold_plan (MGS-SGD) ------------------------------------------------------------

def _layer_sizes():
    data = json.loads((Path(simsparse.__file__).parent / "data" / "layer_params.json").read_text())
    return {k: v["sizes_in_registration_order"] for k, v in data.items()}


def test_threshold_plan_reproduces_table_v_mgs_counts():
    sizes = _layer_sizes()
    lstm = next(k for k in ("lstm_ptb", "lstm_ptb_2layer_1500") if k in sizes)
    expected = {"vgg16_cifar10": 13, "resnet50_imagenet": 53, "inception_v4_imagenet": 150, lstm: 9}
    for name, groups in expected.items():
        plan = threshold_plan(sizes[name][::-1], 8192)
        assert len(plan) == groups, name
        assert sum(plan) == len(sizes[name])


def test_threshold_plan_rule():
    assert threshold_plan([5000, 3000, 192, 1, 9000, 10], 8192) == (3, 2, 1)
    assert threshold_plan([1, 2, 3], 100) == (3,)
    assert threshold_plan([100, 100], 1) == (1, 1)


# --- optimal_plan ---------------------------------------------------------------------------

@settings(max_examples=150)
@given(seed=st.integers(0, 2**32 - 1), dense=st.booleans())
def test_optimal_plan_equals_brute_force(seed, dense):
    tb, sizes, ts, tc, _, tf = model(seed, dense)
    best = brute(tb, sizes, ts, tc, tf)
    assert t_of(optimal_plan(tb, sizes, ts, tc, tf), tb, sizes, ts, tc, tf) == pytest.approx(best, rel=1e-12)


@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["concave", "piecewise"]))
def test_optimal_plan_equals_brute_force_non_affine_tc(seed, kind):
    """Non-affine tc takes the Pareto search path."""
    tb, sizes, ts, _, alpha, tf = model(seed, dense=False, L=int(np.random.default_rng(seed).integers(3, 11)))
    if kind == "concave":
        def tc(d):
            return alpha + 1e-6 * d ** 0.7
    else:
        def tc(d):
            return alpha + 1e-8 * d if d < 20000 else 0.2 * alpha + 5e-9 * d
    best = brute(tb, sizes, ts, tc, tf)
    assert t_of(optimal_plan(tb, sizes, ts, tc, tf), tb, sizes, ts, tc, tf) == pytest.approx(best, rel=1e-12)


def test_optimal_plan_edge_cases():
    assert optimal_plan([1.0], [10], zero, lambda d: 1.0) == (1,)
    # free communication: any plan is optimal; expensive startup: merge everything
    tb, sizes = [1.0] * 5, [10] * 5
    assert optimal_plan(tb, sizes, zero, lambda d: 100.0 + d) == (5,)
    assert t_of(optimal_plan(tb, sizes, zero, zero), tb, sizes, zero, zero) == 5.0
    with pytest.raises(ValueError):
        optimal_plan(tb, sizes, zero, lambda d: -1.0)


def test_optimal_plan_large_model_matches_bound_and_beats_heuristics():
    sizes = _layer_sizes()["inception_v4_imagenet"][::-1]
    L = len(sizes)
    tb = [0.3 / L] * L
    alpha, beta = 0.022, 2 * 1.7e-8 * 0.001 * 64

    def tc(d):
        return alpha + beta * d

    def ts(d):
        return 2.18896957e-10 * d * math.log2(d)

    t_opt = t_of(optimal_plan(tb, sizes, ts, tc), tb, sizes, ts, tc)
    for plan in [(L,), (1,) * L, threshold_plan(sizes), omgs_plan(tb, sizes, ts, tc, alpha)]:
        assert t_opt <= t_of(plan, tb, sizes, ts, tc) * (1 + 1e-12)
    assert t_opt == pytest.approx(0.5208886250312909, rel=1e-9)


# --- omgs_plan (Algorithm 1) -----------------------------------------------------------------

@settings(max_examples=150)
@given(seed=st.integers(0, 2**32 - 1), dense=st.booleans())
def test_omgs_plan_is_a_plan_never_better_than_brute_force(seed, dense):
    tb, sizes, ts, tc, alpha, tf = model(seed, dense)
    plan = omgs_plan(tb, sizes, ts, tc, alpha)
    assert sum(plan) == len(tb) and min(plan) >= 1
    assert t_of(plan, tb, sizes, ts, tc, tf) >= brute(tb, sizes, ts, tc, tf) * (1 - 1e-12)


def test_omgs_plan_misses_the_optimum_counterexample():
    """Algorithm 1 is greedy: merging layer L into L-1 saves alpha locally but
    delays the next communication; it then merges again and ends with one
    group (TopK-SGD), while (1, 2) is 16% faster."""
    tb, sizes = [0.0, 0.0, 0.0], [1, 1, 1]
    ts, tc = (lambda d: d * math.log2(d)), (lambda d: 3.0 + d)
    assert omgs_plan(tb, sizes, ts, tc, 3.0) == (3,)
    assert t_of((3,), tb, sizes, ts, tc) == pytest.approx(4 + 3 * math.log2(3) + 2)
    assert optimal_plan(tb, sizes, ts, tc) == (1, 2)
    assert t_of((1, 2), tb, sizes, ts, tc) == 9.0 == brute(tb, sizes, ts, tc)


def test_omgs_plan_merges_cheap_neighbours_and_keeps_pipelining():
    # a startup far above the backward time: everything merged
    assert omgs_plan([1e-3] * 4, [100] * 4, zero, lambda d: 1.0 + 1e-6 * d, 1.0) == (4,)
    # communication free of startup and shorter than the backward: no merge
    assert omgs_plan([1.0] * 4, [100] * 4, zero, lambda d: 1e-3 * d, 0.0) == (1, 1, 1, 1)


# --- mgwfbp_plan ---------------------------------------------------------------------------

@settings(max_examples=150)
@given(seed=st.integers(0, 2**32 - 1))
def test_mgwfbp_plan_is_omgs_with_zero_sparsification(seed):
    tb, sizes, _, tc, alpha, tf = model(seed, dense=True)
    plan = mgwfbp_plan(tb, sizes, tc, alpha)
    assert plan == omgs_plan(tb, sizes, zero, tc, alpha)
    assert t_of(plan, tb, sizes, zero, tc, tf) >= brute(tb, sizes, zero, tc, tf) * (1 - 1e-12)


def test_mgwfbp_plan_two_tensors_is_optimal():
    """With L = 2 the merge decision is the only one, and the rule makes it right."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        tb, sizes, _, tc, alpha, tf = model(int(rng.integers(2**32)), dense=True, L=2)
        plan = mgwfbp_plan(tb, sizes, tc, alpha)
        assert t_of(plan, tb, sizes, zero, tc, tf) == pytest.approx(brute(tb, sizes, zero, tc, tf), rel=1e-12)


def test_mgwfbp_plan_misses_the_optimum_counterexample():
    """Merging tensor 0 into 1 (wait 1 < alpha = 2) blocks the better merge of
    1 and 2: MG-WFBP gives (2, 1) in 9, the optimum is (1, 2) in 8."""
    tb, sizes = [0.0, 1.0, 2.0], [1, 2, 1]
    tc = lambda d: 2.0 + d  # noqa: E731
    assert mgwfbp_plan(tb, sizes, tc, 2.0) == (2, 1)
    assert t_of((2, 1), tb, sizes, zero, tc) == 9.0
    assert optimal_plan(tb, sizes, zero, tc) == (1, 2)
    assert t_of((1, 2), tb, sizes, zero, tc) == 8.0 == brute(tb, sizes, zero, tc)
