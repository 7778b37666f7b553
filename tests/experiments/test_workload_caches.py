"""The workload's caches: AR(1) noise states kept across a sweep of every rank
(simsparse.lru.LRU with sweeps, Workload.hold_states), and the full
collection after a point that carried much (experiments/run/simulate.py)."""
import gc

import numpy as np
import pytest

import simsparse.workload as wlmod
from simsparse.lru import LRU
from simsparse.workload import Workload

from tests.helpers import make_point


@pytest.fixture
def fresh_states(monkeypatch):
    monkeypatch.setattr(wlmod, "_STATE", LRU(max_bytes=1 << 30, sweeps=True))
    return wlmod._STATE


def _draws(monkeypatch):
    calls = []
    real = wlmod._normal

    def counted(*a, **kw):
        calls.append(a[:3])
        return real(*a, **kw)

    monkeypatch.setattr(wlmod, "_normal", counted)
    return calls


def test_a_sweep_larger_than_the_cache_keeps_the_ranks_it_holds(monkeypatch, fresh_states):
    P, n = 8, 1000
    w = Workload(n=n, seed=1, drift=0.2)
    fresh_states.resize(5 * n * 4)                  # room for 5 of the 8 ranks' states
    calls = _draws(monkeypatch)
    for t in range(4):
        w.grads(P, t)
    # the 5 held ranks draw once per iteration; the 3 others every iteration from 0: 1 + 2 + 3 + 4
    assert len(calls) == 5 * 4 + 3 * 10
    plain = LRU(max_bytes=5 * n * 4)               # an LRU drops what the sweep reads next: all miss
    monkeypatch.setattr(wlmod, "_STATE", plain)
    wlmod._CACHE.items.clear(), setattr(wlmod._CACHE, "size", 0)
    calls.clear()
    for t in range(4):
        w.grads(P, t)
    assert len(calls) == 8 * 10


def test_hold_states_makes_room_for_every_rank_and_drops_other_streams_first(monkeypatch, fresh_states):
    monkeypatch.setattr(wlmod, "STATE_MIN_B", 1000)
    other = Workload(n=500, seed=9, drift=0.5)
    other.grad(0, 1)
    assert fresh_states.size == 500 * 4
    P, n = 6, 1000
    w = Workload(n=n, seed=1, drift=0.2)
    ref = [[Workload(n=n, seed=1, drift=0.2).grad(r, t) for r in range(P)] for t in range(3)]
    fresh_states.items.clear(), setattr(fresh_states, "size", 0)
    other.grad(0, 1)
    w.hold_states(P)
    assert fresh_states.max_bytes == P * n * 4
    calls = _draws(monkeypatch)
    got = [[w.grad(r, t) for r in range(P)] for t in range(3)]
    assert len(calls) == P * 3                                               # one draw per rank and iteration
    assert fresh_states.size == P * n * 4 and all(k[0] == n for k in fresh_states.items)   # the other went
    for a, b in zip(got, ref):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)                              # the same values as drawn afresh
    Workload(n=n, seed=1, drift=1.0).hold_states(P)                          # independent iterations: no states
    assert fresh_states.max_bytes == 1000


def test_a_point_that_carries_much_is_collected_after_it(monkeypatch):
    import simsparse.experiments.run.simulate as sm

    collected = []
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(a) or 0)
    p = make_point("topka", 4, n=1000, density=0.01, iterations=1, warmup=0, seed=1)
    sm.simulate(p)
    assert collected == []                          # a small point: no 0.2 s collection after it
    monkeypatch.setattr(sm, "GC_AFTER_B", -1)
    sm.simulate(p)
    assert collected == [()]


def test_drawn_once_keeps_no_gradient_set(monkeypatch):
    """A schedule's plan microbenchmarks draw each size once: inside
    ``drawn_once`` the set is the same values but not kept for later points."""
    monkeypatch.setattr(wlmod, "_CACHE", LRU(max_bytes=1 << 30))
    w = Workload(n=3000, density=0.01, seed=5)
    with wlmod.drawn_once():
        once = w.grads(3, 2)
    assert wlmod._CACHE.size == 0
    kept = w.grads(3, 2)
    assert kept is not once and all(np.array_equal(a, b) for a, b in zip(once, kept))
    assert wlmod._CACHE.size == 3 * 3000 * 4 and w.grads(3, 2) is kept
