"""Lockstep rounds (simsparse.backends.fast.rounds): their own checks (the
differential harness, test_evaluators.py, compares their rows with the
events); the ring's rounds are its generator's messages."""
import dataclasses

import numpy as np
import pytest

from simsparse.algorithms.steps import RING, rounds
from simsparse.backends.fast.rounds import run_rounds
from simsparse.backends.events.sim import Simulator
from simsparse.compute.devices import load_profile
from simsparse.experiments.run.runner import simulate_point
from simsparse.network.alphabeta import AlphaBetaNetwork

from tests.helpers import make_point, net

COLUMNS = ("time_s", "time_min_s", "time_max_s", "bytes_sent_max", "bytes_total", "msgs_total", "sim_events",
           "t_comm_s", "t_compute_s")


def rows_of(point):
    """The rows of the fast evaluation (rounds where they apply) and of the
    events on SimPy's engine, and whether the rounds timed it."""
    fast = simulate_point(dataclasses.replace(point, evaluation="fast")).row
    events = simulate_point(dataclasses.replace(point, evaluation="events_simpy")).row
    return fast, events, fast["evaluator"] == "rounds"


def assert_same(a, b):
    for col in COLUMNS:
        assert a[col] == b[col], (col, a[col], b[col])


DENSE = ["ring", "recursive_doubling", "rabenseifner"]


P100 = load_profile("p100").model_dump()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["comet_fdr_4gpu", "ethernet_100g_leafspine"])
def test_conflicts_fall_back_to_events(preset):
    """Ranks placed at random: ring neighbours' flows cross the tree and meet
    on its links, the bulk path declines and the events give the row."""
    p = make_point("ring", 64, n=50000)
    p = dataclasses.replace(p, network={**net(preset), "placement": "random", "placement_seed": 3})
    fast, events, took = rows_of(p)
    assert_same(fast, events)
    assert not took and fast["evaluator"] == "events"


@pytest.mark.parametrize("P,n", [(1, 10), (2, 1), (5, 3), (8, 1000), (7, 1001)])
def test_ring_rounds_are_the_generators_messages(P, n):
    """Every round sends to r + 1; over the reduce-scatter rank r sends every
    block but r + 1, over the allgather every block but r + 2."""
    steps = list(rounds(RING, P, n))
    assert len(steps) == 2 * (P - 1)
    for dst, count, kernel in steps:
        assert kernel in ("add_into", "copy_into")
        assert np.array_equal(dst, (np.arange(P) + 1) % P)
        assert count.sum() == n   # the ranks of one round send P distinct blocks: the whole vector
    if P > 1:
        size = np.diff([(i * n) // P for i in range(P + 1)])
        r = np.arange(P)
        expect = (n - size[(r + 1) % P]) + (n - size[(r + 2) % P])
        assert np.array_equal(sum(c for _, c, _ in steps), expect)


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
    fast, events, took = rows_of(make_point("ring", 1, n=100, compute=P100))
    assert_same(fast, events)
    assert took and fast["msgs_total"] == 0 and fast["time_s"] > 0

    class Plain(AlphaBetaNetwork):
        def capabilities(self, P):
            return frozenset()

    assert run_rounds(Simulator(Plain(1e-6, 1e9)), 4, iter(()), "float32") is None


def test_the_budget_lets_bulk_rounds_run_and_stops_them_if_they_decline():
    """The budget estimates a point by the evaluators the table will choose:
    a ring at P = 64 fits a small limit as lockstep rounds, not as events;
    where its rounds decline at run time (ranks placed at random on a fat
    tree: ring neighbours' flows meet) and the events are estimated past the
    limit, it stops with a budget error naming the point."""
    from simsparse.experiments.run.budget import Budget, BudgetError, check

    small = Budget(max_seconds=0.1)
    bulk = make_point("ring", 64, n=4096, evaluation="fast")
    assert check([bulk], small).seconds < 0.1
    assert simulate_point(bulk, max_seconds=small.max_seconds).row["evaluator"] == "rounds"
    with pytest.raises(BudgetError, match="P = 64, ring.*would take about.*evaluation: fast"):
        check([make_point("ring", 64, n=4096, evaluation="events")], small)
    clash = dataclasses.replace(bulk, network={**net("comet_fdr_4gpu"), "placement": "random", "placement_seed": 3})
    check([clash], small)
    with pytest.raises(BudgetError, match="P = 64, ring: the lockstep rounds declined.*--force"):
        simulate_point(clash, max_seconds=small.max_seconds)
    assert simulate_point(clash).row["evaluator"] == "events"
