"""The fast paths of issue 11 change no result: the lean engine's queue of
zero-delay calls keeps SimPy's order, the simulator frees its matching
queues, and pinned results (computed before the fast paths existed) stay
exactly the same."""
import dataclasses
import random

import numpy as np
import pytest

from simsparse.engine import HeapEngine, SimPyEngine
from simsparse.experiments.run.loop import make_job, run_point
from simsparse.experiments.run.plan import with_plan

from tests.helpers import make_point, net, schedule_point, sim_backend


def _random_calls(eng, seed):
    """A random cascade of calls (zero and positive delays, three priorities,
    calls scheduling calls); returns the log of (label, time)."""
    rng = random.Random(seed)
    log = []
    budget = [400]

    def call(label):
        log.append((label, eng.now))
        for j in range(rng.randint(0, 3)):
            if budget[0] <= 0:
                return
            budget[0] -= 1
            delay = rng.choice([0.0, 0.0, 0.0, 1e-6, 2e-6, rng.random() * 1e-5])
            eng.at(delay, call, f"{label}.{j}", rng.choice([0, 1, 1, 1, 2]))

    for i in range(5):
        eng.at(rng.choice([0.0, 1e-6]), call, str(i), rng.choice([1, 2]))
    eng.run()
    return log


@pytest.mark.parametrize("seed", range(20))
def test_zero_delay_queue_keeps_simpys_order(seed):
    assert _random_calls(HeapEngine(), seed) == _random_calls(SimPyEngine(), seed)


def test_run_until_leaves_later_calls():
    for eng in (HeapEngine(), SimPyEngine()):
        seen = []
        eng.at(1.0, lambda _: eng.at(0.0, seen.append, "zero-delay at 1"))
        eng.at(0.5, seen.append, "early")
        eng.run(until=1.0)
        assert seen == ["early"] and eng.now == 1.0
        eng.run()
        assert seen == ["early", "zero-delay at 1"]


def test_matching_queues_are_freed():
    """Unmatched sends and receives are kept per (src, dst, tag) only while
    some wait: after an all-to-all style run nothing is left per pair."""
    p = make_point("oktopk", 16, n=20000, density=0.01, evaluation="events")
    be = sim_backend(p)
    run_point(p, be, False)
    assert be.sim.pending == {}


# results of these points before the issue-11 fast paths (engine FIFO,
# simulator waits, compacted solves), to the last bit
PINNED = [
    (lambda: dataclasses.replace(make_point("oktopk", 12, n=20000, density=0.01), network=net("piz_daint_aries")),
     9.551430248882336e-05, 53872, 484),
    (lambda: dataclasses.replace(make_point("ring", 12, n=20000, density=0.01), network=net("ib_fdr_fattree")),
     4.4175413333333316e-05, 1760000, 264),
    (lambda: dataclasses.replace(make_point("dsar_split_allgather", 12, n=20000, density=0.01),
                                 network=net("aries_alphabeta")),
     4.3599357429718866e-05, 897568, 164),
    # the merge plan the planner chose then (its Ok-Topk cost fit now averages over a period)
    (lambda: dataclasses.replace(schedule_point("omgs_sgd", "oktopk", P=4, network=net("piz_daint_aries"),
                                                data_scale=0.1),
                                 plan=(1, 3, 3, 3, 3, 2, 1, 3, 3, 3, 3, 3, 2, 1, 3, 6, 6, 6, 4)),
     0.0023647125508142516, 128592, 532),
]


def _measured(point):
    """Median time, mean bytes and messages of the measured iterations,
    iterations 0 .. warmup + iterations - 1 run in order: what a row reported
    when the pins were taken (a row of Ok-Topk now adds iterations of its
    periodic work)."""
    point = with_plan(point) if point.schedule else point
    backend = sim_backend(point)
    jobs = {r: make_job(backend.point, r) for r in backend.local_ranks}
    its = [backend.iteration(jobs, it) for it in range(point.warmup + point.iterations)][point.warmup:]
    return (float(np.median([max(s.finish_s) for s in its])), np.mean([sum(s.bytes_sent) for s in its]),
            np.mean([sum(s.msgs_sent) for s in its]))


@pytest.mark.parametrize("case", range(len(PINNED)))
@pytest.mark.parametrize("evaluation", ["events", "events_simpy"])
def test_pinned_results(case, evaluation):
    make, time_s, nbytes, msgs = PINNED[case]
    t, b, m = _measured(dataclasses.replace(make(), evaluation=evaluation))
    assert t == pytest.approx(time_s, rel=1e-12)
    assert (b, m) == (nbytes, msgs)
