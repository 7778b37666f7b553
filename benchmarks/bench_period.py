"""The median of the measured iterations against the mean over a period (time_s), simulated.

    python benchmarks/bench_period.py [--P 16] [--n 1048576] [--density 0.01] [--network piz_daint_aries]
        [--compute p100] [--iterations 3] [--warmup 1] [--algorithms oktopk gaussiank deft] [--no-cycle]

Per algorithm, one point as ``simsparse run`` simulates it (warm-up and
measured iterations, plus one iteration of each kind of the algorithm's
periodic work they miss; :mod:`simsparse.period`):
``time_median_s`` (what rows reported before) and ``time_s`` (the mean over
a period), with the iterations run and the wall time. Then the same point
with every iteration of a whole cycle measured (``iterations`` = the period,
at least P, so that DEFT's decision worker visits every rank): its plain mean
and median, and the wall time that costs. Gradients drift slowly (drift 0.1,
as in configs/), so Ok-Topk's reused thresholds hold.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from simsparse.experiments.config.schema import load_config
from simsparse.period import Cycle
from simsparse.experiments.run.runner import simulate_point
from simsparse.experiments.analysis.table import fmt_time

CONFIG = """
name: bench_period
network: {network}
compute: {compute}
workload: {{n: {n}, density: {density}, seed: 0, drift: 0.1}}
algorithms: [{algorithms}]
P: [{P}]
iterations: {iterations}
warmup: {warmup}
"""


def points(args):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench_period.yaml"
        path.write_text(CONFIG.format(**{**vars(args), "algorithms": ", ".join(args.algorithms)}))
        return load_config(path).points


def timed(point):
    t0 = time.perf_counter()
    row = simulate_point(point).row
    return row, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=16)
    ap.add_argument("--n", type=int, default=1048576)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--network", default="piz_daint_aries")
    ap.add_argument("--compute", default="p100")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--algorithms", nargs="+", default=["oktopk", "gaussiank", "deft"])
    ap.add_argument("--no-cycle", action="store_true", help="skip simulating every iteration of a whole cycle")
    args = ap.parse_args(argv)
    print(f"P = {args.P}, n = {args.n}, density {args.density}, {args.network}, {args.compute}; "
          f"warm-up {args.warmup}, iterations {args.iterations}")
    head = ["algorithm", "period", "run", "time_median_s", "time_s", "mean/median", "wall"]
    if not args.no_cycle:
        head += ["|", "cycle: run", "mean", "median", "time_s/mean", "wall"]
    lines = [head]
    for point in points(args):
        cycle = Cycle.of(point)
        row, wall = timed(point)
        run = len(cycle.counters(point.warmup, point.iterations))
        cells = [point.algorithm, str(row["period"]), str(run), fmt_time(row["time_median_s"]), fmt_time(row["time_s"]),
                 f"{row['time_s'] / row['time_median_s']:.3f}", f"{wall:.1f} s"]
        if not args.no_cycle:
            whole = dataclasses.replace(point, iterations=max(cycle.length, point.P))
            full, full_wall = timed(whole)
            cells += ["|", str(whole.warmup + whole.iterations), fmt_time(full["time_s"]), fmt_time(full["time_median_s"]),
                      f"{row['time_s'] / full['time_s']:.3f}", f"{full_wall:.1f} s"]
        lines.append(cells)
        print("  done:", point.algorithm, flush=True)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    for r in lines:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
