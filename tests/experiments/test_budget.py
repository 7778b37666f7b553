"""The budget's memory estimate is an upper bound of what a point uses."""
import dataclasses
import json
import subprocess
import sys

import pytest

from simsparse.experiments.run.budget import memory_B

from tests.helpers import make_point

CHILD = """
import json, resource, sys
from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point
point = Point(**json.loads(sys.argv[1]))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
simulate_point(point)
print(json.dumps([base * 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))
"""


@pytest.mark.parametrize("algorithm,P,iterations,check", [
    ("oktopk", 48, 1, False), ("oktopk", 48, 3, True), ("gtopk", 48, 3, False), ("ring", 48, 1, False),
    ("qsgd_allgather", 16, 3, True),   # every rank dequantizes P messages of n: P^2 n work (41 s at P = 48 in CI, 20 s at 24)
])
@pytest.mark.slow
def test_the_memory_estimate_bounds_the_peak(algorithm, P, iterations, check):
    """Peak RSS above the interpreter's start, in a fresh process, stays below
    the estimate's part for the point (the base of 200 MB left out)."""
    point = dataclasses.replace(make_point(algorithm, P, n=1 << 19, density=0.01, iterations=iterations), check=check)
    spec = {k: getattr(point, k) for k in ("algorithm", "P", "params", "workload", "network", "compute",
                                           "iterations", "warmup", "check", "evaluation")}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, check=True)
    base, peak = json.loads(out.stdout.strip().splitlines()[-1])
    estimate = memory_B(point) - 200e6
    assert peak - base < estimate, (peak - base, estimate)


def test_the_memory_estimate_grows_with_what_a_point_keeps():
    one = dataclasses.replace(make_point("oktopk", 64, n=1 << 20, iterations=1), check=False)
    more = dataclasses.replace(one, iterations=3)
    checked = dataclasses.replace(more, check=True)
    assert memory_B(one) < memory_B(more) < memory_B(checked)
    sizes = make_point("ring", 64, n=1 << 20, evaluation="fast")
    assert memory_B(sizes) == 200e6


@pytest.mark.parametrize("algorithm", ["cltk", "topka", "ring"])
def test_one_rank_sends_nothing_and_is_estimated_at_its_calls_alone(algorithm):
    from simsparse.experiments.run.budget import point_estimate

    est = point_estimate(make_point(algorithm, 1, n=1, density=1.0, iterations=1))
    assert 0.0 <= est.seconds < 1.0


def test_a_points_peak_memory_is_its_own():
    """``peak_of`` starts the high-water mark afresh, so a worker's
    earlier, larger point does not become the next point's peak."""
    import numpy as np

    from simsparse.experiments.run import budget

    big, before = budget.peak_of(lambda: np.ones(200 << 20, dtype=np.uint8))   # 200 MiB touched
    del big
    _, after = budget.peak_of(lambda: None)
    assert before - after > 150 << 20
