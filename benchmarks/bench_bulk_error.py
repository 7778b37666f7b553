"""The bulk path's error against the event path on random cases (issue 23).

    python benchmarks/bench_bulk_error.py --cases 400 --seed 11

Each case draws an algorithm, P (1 to 64, non-powers of two included), a
network (alpha-beta, flow-level fat trees, Ethernet, multi-GPU nodes, random
placements), n, density, compute (ideal or P100) and data scale, and runs
the point twice: ``evaluation: events`` (the reference) and ``--evaluation``
(default ``fast``; ``waves_ab`` or any evaluator's name forces it). It
reports how many rows each set of evaluators timed, every row that says it
is exact (``error_bound`` 0) but differs from the events (there should be
none), any difference in bytes or messages (none), every row past its own
bound (none), and the error of the rows that declare a bound.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NETWORKS = ["alphabeta", "ib_fdr_fattree", "ethernet_1g", "comet_fdr_4gpu", "ib_edr_fattree", "aries_alphabeta",
            "ethernet_100g_leafspine"]


def main():
    from tests.helpers import make_point, net

    from simsparse.algorithms import ALGORITHMS
    from simsparse.backends.evaluators import EvaluationError
    from simsparse.compute.devices import load_profile
    from simsparse.experiments.run.runner import simulate_point

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evaluation", default="fast", help="the knob to compare with the events")
    ap.add_argument("--algorithms", nargs="+", help="draw only these algorithms")
    a = ap.parse_args()
    p100 = load_profile("p100").model_dump()
    rng = random.Random(a.seed)
    counts, errs, bad = {}, [], 0
    t0 = time.time()
    for case in range(a.cases):
        alg = rng.choice(sorted(a.algorithms or ALGORITHMS))
        P = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 31, 32, 33, 48, 64])
        name = rng.choice(NETWORKS)
        n, density = rng.choice([500, 4000, 20000, 100000]), rng.choice([0.01, 0.05])
        compute, scale = rng.choice([None, p100]), rng.choice([1.0, 1.0, 0.3])
        p = make_point(alg, P, n=n, density=density, iterations=2, warmup=1, compute=compute, seed=case)
        if name != "alphabeta":
            network = net(name)
            if ("fattree" in name or "4gpu" in name or "leaf" in name) and rng.random() < 0.5:
                network = {**network, "placement": "random", "placement_seed": case}
            p = dataclasses.replace(p, network=network)
        if scale < 1:
            p = dataclasses.replace(p, data_scale=scale)
        ev = simulate_point(dataclasses.replace(p, evaluation="events")).row
        try:
            bk = simulate_point(dataclasses.replace(p, evaluation=a.evaluation)).row
        except EvaluationError:   # (a forced evaluator this point's network does not allow)
            counts["declined"] = counts.get("declined", 0) + 1
            continue
        counts[bk["evaluator"]] = counts.get(bk["evaluator"], 0) + 1
        if (ev["bytes_total"], ev["msgs_total"]) != (bk["bytes_total"], bk["msgs_total"]):
            bad += 1
            print(f"bytes differ: {alg} P={P} {name}")
        err = abs(bk["time_s"] - ev["time_s"]) / ev["time_s"] if ev["time_s"] else 0.0
        bound = float(bk["error_bound"])
        if err > bound:
            bad += 1
            print(f"past its bound ({bound:g}): {alg} P={P} {name} n={n} {ev['time_s']!r} {bk['time_s']!r}")
        if bound:
            errs.append(err)
            if err > 0.01:
                print(f"error {err:.2%} (bound {bound:g}): {alg} P={P} {name} n={n} density={density} "
                      f"compute={'p100' if compute else 'ideal'} data_scale={scale} {bk['evaluator']}")
    e = np.array(errs or [0.0])
    print(f"{a.cases} cases in {time.time() - t0:.0f} s: {counts}; rows past their bound or byte counts off: {bad}; "
          f"error of the rows with a bound: median {np.median(e):.2e}, p90 {np.percentile(e, 90):.2e}, max {e.max():.2%}")


if __name__ == "__main__":
    main()
