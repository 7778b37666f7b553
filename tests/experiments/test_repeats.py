"""Iterations that repeat (experiments/run/resolve.py, ``repeats``): with size-only values, a
network that starts each run from the same state and no kernel noise, each kind of iteration is
simulated once and the others take its times. The rows are the same as when every iteration runs
(the events, which carry every value, run them all)."""
import dataclasses

import pytest

from simsparse.experiments.run.resolve import resolve
from simsparse.experiments.run.runner import simulate_point

from tests.backends.harness import NOISE, P100
from tests.helpers import make_point, net, schedule_point

SAME = ("time_s", "time_median_s", "time_min_s", "time_max_s", "t_comm_s", "t_compute_s", "bytes_total",
        "bytes_sent_max", "msgs_total")


def rows(point):
    fast = simulate_point(dataclasses.replace(point, evaluation="fast")).row
    events = simulate_point(dataclasses.replace(point, evaluation="events")).row
    return fast, events


@pytest.mark.parametrize("point", [
    schedule_point("dense_ovlp", "rabenseifner", P=5, iterations=3, warmup=1),
    schedule_point("wfbp", "ring", P=4, iterations=2, warmup=1, network=net("ib_fdr_fattree")),
    make_point("recursive_doubling", 6, n=5000, iterations=3, warmup=2),
], ids=["dense_ovlp", "wfbp-fattree", "rd"])
def test_a_repeating_point_simulates_one_iteration_and_gives_the_same_row(point):
    fast, events = rows(point)
    runs = point.iterations + point.warmup
    assert fast["values"] == "sizes" and fast["iterations_run"] == 1
    assert events["values"] == "full" and events["iterations_run"] == runs
    for col in SAME:
        assert fast[col] == events[col], col


def test_what_differs_between_iterations_keeps_every_iteration():
    """Shaped links carry their buckets into the next run, kernel noise draws per call, a trace
    records each iteration: each runs."""
    ring = make_point("ring", 4, n=5000, iterations=2, warmup=1, evaluation="fast")
    shaped = dataclasses.replace(ring, network=net("testbed_star"))
    noisy = dataclasses.replace(ring, compute={**P100, "kernel_noise": NOISE})
    assert resolve(ring).repeats
    assert not resolve(shaped).repeats and "repeatable" not in shaped.network_spec().build().capabilities(4)
    assert not resolve(noisy).repeats and not resolve(ring, trace=True).repeats
    for p in (shaped, noisy):
        assert simulate_point(p).row["iterations_run"] == 3
