"""time_s is the mean over whole periods of an algorithm's periodic work
(simsparse.period): against brute force over a cycle, rows
without periodic work unchanged, the same statistic in the real backend."""
import dataclasses
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from simsparse.algorithms import get_algorithm
from simsparse.experiments.run.loop import make_job
from simsparse.period import Cycle
from simsparse.experiments.run.runner import simulate_point

from simsparse.experiments.results.store import ResultsStore
from simsparse.experiments.analysis.table import results_table

from tests import real_batch
from tests.helpers import make_point, requires_mpi, sim_backend

OKTOPK = {"tau": 4, "tau_prime": 8}   # a cycle of 8: {thresholds, boundaries}, {thresholds}, and 6 reuse iterations


def _point(algorithm="oktopk", P=4, n=4096, params=OKTOPK, drift=1.0, **kw):
    p = make_point(algorithm, P, n=n, density=0.01, params=params, evaluation="events", **kw)
    return dataclasses.replace(p, workload={**p.workload, "drift": drift})


def _brute_force(point, count):
    """(time, bytes sent by all ranks) of iterations 0 .. count-1, every one
    run in order by the simulator backend (no skipping)."""
    backend = sim_backend(point)
    jobs = {r: make_job(backend.point, r) for r in backend.local_ranks}
    out = []
    for it in range(count):
        s = backend.iteration(jobs, it)
        out.append((max(s.finish_s), sum(s.bytes_sent)))
    return out


def test_cycle_of_oktopk_kinds_counters_and_weights():
    c = Cycle.of(_point(params={}))    # the defaults: tau = 32, tau' = 64
    assert c.length == 64
    assert c.count == {frozenset({"exact_thresholds", "boundaries"}): 1, frozenset({"exact_thresholds"}): 1,
                       frozenset(): 62}
    assert c.counters(1, 2) == [0, 1, 2, 32, 64]      # the two kinds the measured 1, 2 miss, at their next counter
    assert c.counters(0, 1) == [0, 1, 32]
    assert c.weights([1, 2, 32, 64]) == [31 / 64, 31 / 64, 1 / 64, 1 / 64]
    assert c.mean([1, 2, 32, 64], [1.0, 3.0, 10.0, 20.0]) == Fraction(62 * 2 + 10 + 20, 64)
    with pytest.raises(ValueError, match="miss kinds"):
        c.mean([1, 2], [1.0, 1.0])
    # threshold reuse off: exact every iteration, only the boundaries are periodic
    assert Cycle.of(_point(params={"threshold_reuse": False})).count == {
        frozenset({"exact_thresholds", "boundaries"}): 1, frozenset({"exact_thresholds"}): 63}


def test_identical_iterations_give_exactly_their_time():
    c = Cycle({})
    assert c.length == 1 and c.counters(1, 3) == [0, 1, 2, 3]
    assert float(c.mean([1, 2, 3], [0.1, 0.1, 0.1])) == 0.1     # (0.1 + 0.1 + 0.1) / 3 in floats is not


@pytest.mark.parametrize("name", ["ring", "topka", "gaussiank", "gtopk", "deft", "cltk", "ssar_split_allgather",
                                  "fft_allgather"])
def test_no_periodic_work_by_default(name):
    """A role that moves every iteration (DEFT's decision worker, CLT-k's
    leader) is the same work each iteration: no periodic work."""
    assert get_algorithm(name).periodic_work(get_algorithm(name).Params()) == {}
    assert get_algorithm("fft_allgather").periodic_work(get_algorithm("fft_allgather").Params(retune_every=5)) \
        == {"retune": 5}


def test_iterations_run_follow_the_declaration():
    """Exact thresholds (torch.topk) in iterations 0, 4, 8; boundaries in 0
    and 8: the loop runs counters 0 (warm-up), 1, 2, 3, then 4 and 8."""
    out = simulate_point(_point(iterations=3, warmup=1), trace=True)
    tr = pd.DataFrame(out.trace)
    topk = set(tr[tr.op == "compute:topk"].iteration)
    bounds = set(tr[tr.phase.str.startswith("boundaries")].iteration)
    assert sorted(tr.iteration.unique()) == [0, 1, 2, 3, 4, 5]
    assert (topk, bounds) == ({0, 4, 5}, {0, 5})
    w = tr.groupby("iteration")["weight"].first()
    assert list(w) == [0.0, 0.25, 0.25, 0.25, 0.125, 0.125]
    assert out.row["period"] == 8 and out.row["correct"] is True


def test_mean_over_a_period_equals_brute_force_over_a_cycle():
    """The same gradient every iteration (drift 0), so iterations of one kind
    cost the same: 3 + 2 measured iterations give the mean of simulating all
    8 iterations of a cycle after the warm-up."""
    point = _point(drift=0.0, iterations=3, warmup=1)
    row = simulate_point(point).row
    every = _brute_force(point, 1 + 8)[1:]
    times = [t for t, _ in every]
    assert row["time_s"] == pytest.approx(np.mean(times), rel=1e-12)
    assert row["bytes_total"] == pytest.approx(np.mean([b for _, b in every]), rel=1e-12)
    # the periodic work is what the median left out
    assert row["time_median_s"] == pytest.approx(np.median(times), rel=1e-12)
    assert row["time_s"] > 1.2 * row["time_median_s"]
    assert row["time_max_s"] == pytest.approx(max(times), rel=1e-12)


def test_whole_cycles_measured_give_their_plain_mean():
    """With changing gradients and iterations = a whole cycle: no iteration
    added, and time_s is the plain mean of the measured iterations."""
    point = _point(iterations=8, warmup=1)
    out = simulate_point(point, trace=True)
    assert sorted(pd.DataFrame(out.trace).iteration.unique()) == list(range(9))
    times = [t for t, _ in _brute_force(point, 9)[1:]]
    assert out.row["time_s"] == pytest.approx(np.mean(times), rel=1e-12)


@pytest.mark.parametrize("name", ["ring", "rabenseifner", "topka"])
def test_rows_without_periodic_work_are_unchanged(name):
    """Identical iterations: time_s is their time, exactly (what the median
    gave before); nothing is added to warm-up + iterations."""
    point = _point(name, params={}, drift=0.0, iterations=3, warmup=1)
    out = simulate_point(point, trace=True)
    t = [t for t, _ in _brute_force(point, 4)[1:]]
    assert t[0] == t[1] == t[2] and out.row["period"] == 1
    assert out.row["time_s"] == out.row["time_median_s"] == out.row["time_max_s"] == t[0]
    assert sorted(pd.DataFrame(out.trace).iteration.unique()) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["gaussiank", "deft"])
def test_changing_iterations_without_periodic_work_give_the_mean(name):
    """Gaussiank's retries follow the data; DEFT's decision worker (a broadcast
    root) moves every iteration: the mean of the measured iterations."""
    point = _point(name, params={}, iterations=4, warmup=1)
    row = simulate_point(point).row
    times = [t for t, _ in _brute_force(point, 5)[1:]]
    assert len(set(times)) > 1
    assert row["time_s"] == pytest.approx(np.mean(times), rel=1e-12)
    assert row["time_median_s"] == pytest.approx(np.median(times), rel=1e-12)


def test_schedules_inherit_the_bucket_algorithms_periodic_work():
    point = dataclasses.replace(_point(), schedule="topk_sgd", plan=(1, 1),
                                workload={"n": 96, "layers": [32, 64], "density": 0.1, "dtype": "float32", "seed": 0})
    sched = point.schedule_for(0)
    assert sched.periodic_work() == {"exact_thresholds": 4, "boundaries": 8}
    sched.skip_to(8)
    assert [a.iteration_no for a in sched.algs] == [8, 8]
    with pytest.raises(ValueError, match="cannot go back"):
        sched.skip_to(3)


def test_table_names_the_statistic_and_old_rows_run_again(tmp_path):
    rows = [simulate_point(_point(name, params=prm, iterations=1, warmup=1)).row
            for name, prm in (("oktopk", OKTOPK), ("topka", {}))]
    table, _ = results_table(pd.DataFrame(rows))
    assert ("time: mean of an iteration over a period of its periodic work "
            "(oktopk {\"tau\": 4, \"tau_prime\": 8}: 8 iterations), otherwise over the measured iterations") in table
    store = ResultsStore(tmp_path)
    old = {k: v for k, v in rows[1].items() if k != "time_median_s"}   # a row written before the period mean
    store.add(rows[0])
    store.add(old)
    again = ResultsStore(tmp_path)
    assert again.has(rows[0]["point_id"]) and not again.has(old["point_id"])


MEASURED = real_batch.register("period_mean", [_point(P=2, iterations=3, warmup=1)])


@requires_mpi
@pytest.mark.mpi
def test_real_backend_reports_the_same_statistic(tmp_path_factory, worker_id):
    """mpiexec -n 2 runs the same counters (the trace's kinds and weights) and
    reports the period mean: its bytes, which differ between kinds, equal the
    simulator's mean over the period."""
    point = MEASURED[0]
    row, trace = real_batch.measured(point, tmp_path_factory, worker_id)
    s = simulate_point(point, trace=True)
    assert row["correct"] is True and row["period"] == s.row["period"] == 8
    for col in ("bytes_total", "bytes_sent_max", "msgs_total"):
        assert row[col] == s.row[col], col
    for tr in (pd.DataFrame(trace), pd.DataFrame(s.trace)):
        assert set(tr[tr.op == "compute:topk"].iteration) == {0, 4, 5}
        w = tr.groupby("iteration")["weight"].first()
        assert list(w) == [0.0, 0.25, 0.25, 0.25, 0.125, 0.125]
        sent = tr[tr.op == "send"].groupby("iteration")["bytes"].sum()
        assert sent[4] > sent[1] and sent[5] > sent[4]     # exact thresholds, and boundaries, cost messages
        assert row["bytes_total"] == pytest.approx((sent * w).sum(), rel=1e-12)
    assert row["time_min_s"] <= row["time_median_s"] <= row["time_max_s"]
    assert row["time_min_s"] <= row["time_s"] <= row["time_max_s"]
