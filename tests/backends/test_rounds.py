"""Lockstep rounds (simsparse.backends.fast.rounds) give exactly the event
simulation's rows and event counts, or decline; the ring's rounds are its
generator's messages."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, strategies as st

from simsparse.algorithms.dense import ring_rounds
from simsparse.backends.fast.rounds import run_rounds
from simsparse.backends.events.sim import Simulator
from simsparse.compute.devices import load_profile
from simsparse.experiments.run import simulate as runner
from simsparse.experiments.run.runner import simulate_point
from simsparse.network.alphabeta import AlphaBetaNetwork

from tests.helpers import make_point, net

COLUMNS = ("time_s", "time_min_s", "time_max_s", "bytes_sent_max", "bytes_total", "msgs_total", "sim_events",
           "t_comm_s", "t_compute_s")


def rows_of(point):
    """The rows of the lean engine (rounds where they apply) and of SimPy (the
    events), and which path the lean engine took."""
    took = []

    def spy(*a, **kw):
        out = run_rounds(*a, **kw)
        took.append(out is not None)
        return out

    saved = runner.run_rounds
    runner.run_rounds = spy
    try:
        fast = simulate_point(dataclasses.replace(point, engine="lean")).row
    finally:
        runner.run_rounds = saved
    events = simulate_point(dataclasses.replace(point, engine="simpy")).row
    return fast, events, took


def assert_same(a, b):
    for col in COLUMNS:
        assert a[col] == b[col], (col, a[col], b[col])


DENSE = ["ring", "recursive_doubling", "rabenseifner"]


P100 = load_profile("p100").model_dump()


@pytest.mark.parametrize("compute", [None, P100], ids=["ideal", "p100"])
@pytest.mark.parametrize("algorithm", DENSE)
@pytest.mark.parametrize("preset,P,expect_rounds", [
    ("aries_alphabeta", 2, True), ("aries_alphabeta", 13, True), ("aries_alphabeta", 64, True),
    ("ib_fdr_fattree", 7, True), ("ib_fdr_fattree", 64, True), ("ib_edr_fattree", 40, True),
    ("ethernet_1g", 9, True),
    ("piz_daint_aries", 16, False),   # adaptive routing: no bulk path
])
def test_rounds_equal_events(algorithm, preset, P, expect_rounds, compute):
    p = make_point(algorithm, P, n=5120, values="auto", iterations=2, warmup=1, compute=compute)
    p = dataclasses.replace(p, network=net(preset))
    fast, events, took = rows_of(p)
    assert_same(fast, events)
    # The ring never finds a port or link busy. The others do when folding
    # puts ranks out of step, or their partners' flows share links: the
    # event simulation then queues or shares, and the rounds decline.
    if algorithm == "ring":
        assert took and all(took) == expect_rounds
    elif preset == "aries_alphabeta" and P & (P - 1) == 0:
        assert took and all(took)


@pytest.mark.parametrize("preset", ["comet_fdr_4gpu", "ethernet_100g_leafspine"])
def test_conflicts_fall_back_to_events(preset):
    """Ranks placed at random: ring neighbours' flows cross the tree and meet
    on its links, the bulk path declines and the events give the row."""
    p = make_point("ring", 64, n=50000, values="auto")
    p = dataclasses.replace(p, network={**net(preset), "placement": "random", "placement_seed": 3})
    fast, events, took = rows_of(p)
    assert_same(fast, events)
    assert took == [False]


@given(P=st.integers(2, 24), n=st.integers(1, 3000), eager=st.sampled_from([0, 64, 8192, 10**9]),
       rtt=st.sampled_from([0.0, 3e-6]), scale=st.sampled_from([1.0, 0.37]),
       alpha=st.sampled_from([0.0, 1e-6]), flow=st.booleans(), algorithm=st.sampled_from(DENSE),
       compute=st.sampled_from([None, P100]))
def test_rounds_equal_events_random(P, n, eager, rtt, scale, alpha, flow, algorithm, compute):
    """Any size (empty blocks included), eager or rendezvous, any data scale,
    alpha-beta or flow level."""
    p = make_point(algorithm, P, n=max(n, P) if scale < 1 else n, values="auto", eager=eager, alpha=alpha,
                   rendezvous_rtt_s=rtt, compute=compute)
    if flow:
        p = dataclasses.replace(p, network={**net("ib_fdr_fattree"), "eager_threshold_B": eager,
                                            "rendezvous_rtt_s": rtt})
    p = dataclasses.replace(p, data_scale=scale)
    fast, events, took = rows_of(p)
    assert_same(fast, events)
    if algorithm == "ring":   # linear placement: no port or link is ever busy when the ring posts
        assert took == [True]


@pytest.mark.parametrize("P,n", [(1, 10), (2, 1), (5, 3), (8, 1000), (7, 1001)])
def test_ring_rounds_are_the_generators_messages(P, n):
    """Every round sends to r + 1; over the reduce-scatter rank r sends every
    block but r + 1, over the allgather every block but r + 2."""
    rounds = list(ring_rounds(P, n))
    assert len(rounds) == 2 * (P - 1)
    for dst, count, kernel in rounds:
        assert kernel in ("add_into", "copy_into")
        assert np.array_equal(dst, (np.arange(P) + 1) % P)
        assert count.sum() == n   # the ranks of one round send P distinct blocks: the whole vector
    if P > 1:
        size = np.diff([(i * n) // P for i in range(P + 1)])
        r = np.arange(P)
        expect = (n - size[(r + 1) % P]) + (n - size[(r + 2) % P])
        assert np.array_equal(sum(c for _, c, _ in rounds), expect)


def test_alphabeta_bulk_wave_declines_a_busy_receive_port():
    ab = AlphaBetaNetwork(1e-6, 1e9)
    ab.reset(None, 3)
    ab.bulk_start(3)
    one, firm = np.zeros(1, dtype=np.intp), np.ones(1, dtype=bool)
    first, exact = ab.bulk_wave(np.array([0.0]), np.array([0]), np.array([1]), np.array([1000]), one, firm)
    assert first[0] == pytest.approx(2e-6) and exact
    # rank 2 sends to 1 while the first message still holds 1's receive port: not a wave of free ports
    late, exact = ab.bulk_wave(np.array([1e-6]), np.array([2]), np.array([1]), np.array([1000]), one, firm)
    assert late is None and not exact


def test_two_receives_in_one_round_is_an_error():
    sim = Simulator(AlphaBetaNetwork(1e-6, 1e9))
    rounds = [(np.array([1, -1, 1]), np.array([4, 0, 4]), None)]
    with pytest.raises(ValueError, match="one receive per rank"):
        run_rounds(sim, 3, rounds, "float32")


def test_one_rank_and_a_network_without_bulk_path():
    """P = 1 has only the copy; a network model without a bulk path runs events."""
    fast, events, took = rows_of(make_point("ring", 1, n=100, values="auto", compute=P100))
    assert_same(fast, events)
    assert took == [True] and fast["msgs_total"] == 0 and fast["time_s"] > 0

    class Plain(AlphaBetaNetwork):
        def bulk_capable(self):
            return False

    assert run_rounds(Simulator(Plain(1e-6, 1e9)), 4, iter(()), "float32") is None


def test_the_budget_lets_bulk_rounds_run_and_stops_them_if_they_decline():
    """A point past the event budget runs when it is tried as bulk rounds (a
    dense collective on sizes), and stops with a budget error naming the
    point if its rounds decline and its events are past the limit."""
    from simsparse.experiments.run.budget import Budget, BudgetError, check

    small = Budget(max_events=1e3)
    bulk = make_point("ring", 64, n=4096, values="auto")
    assert check([bulk], small).events == 0.0
    assert simulate_point(bulk, max_events=small.max_events).row["sim_events"] > small.max_events
    with pytest.raises(BudgetError, match="P = 64, ring.*needs about.*with 'values: auto'"):
        check([make_point("ring", 64, n=4096, values="full")], small)
    with pytest.raises(BudgetError) as refused:
        check([make_point("oktopk", 64, n=4096)], small)
    assert "values: auto" not in str(refused.value)
    # ranks placed at random on a fat tree: ring neighbours' flows meet, the rounds decline
    clash = dataclasses.replace(bulk, network={**net("comet_fdr_4gpu"), "placement": "random", "placement_seed": 3})
    check([clash], small)
    with pytest.raises(BudgetError, match="P = 64, ring: the bulk lockstep rounds declined.*--force"):
        simulate_point(clash, max_events=small.max_events)
    assert simulate_point(clash).row["sim_events"] > small.max_events
