"""``evaluation: waves_flow`` against the event path on the flow-level networks
(issue 23).

    python benchmarks/bench_flow_waves.py
    python benchmarks/bench_flow_waves.py --networks piz_daint_aries --algorithms oktopk --P 64 256 --bert

Each point (a gradient of ``--n`` float32 at 1 %, or BERT-base's at
``data_scale`` 0.01 with the P100's compute with ``--bert``; full values;
one iteration as ``bench_scale.py`` runs it) is simulated twice in this
process: with ``evaluation: events`` (every message an event of the flow
model: the reference) and ``evaluation: waves_flow`` (the helper
collectives gathered, timed wave after wave: :mod:`simsparse.backends.fast.waves_flow`).
The events carry full values; a forced evaluator carries what ``fast``
would (sampled where full values take over five seconds to draw: then the
error includes one draw's spread).
With ``--seeds S`` each runs with the network's ``routing_seed`` 0 .. S - 1:
adaptive routing and ECMP choices depend on it, and so does the event
path's own time (by up to 31 % on small bare collectives on Piz Daint).
It prints the event path's median time and its spread over the seeds
(max - min over the median), the waves' median and spread, the error of the medians,
the error at seed 0 and the wall times; then the median and the largest
|error| of the medians.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def simulate(cfg: dict) -> tuple[float, float, str]:
    """(simulated seconds, wall seconds, the row's evaluator) of the config's one point."""
    import bench_scale
    from simsparse.experiments.run.runner import simulate_point

    (point,) = bench_scale.points_of(cfg)
    t0 = time.perf_counter()
    row = simulate_point(point).row
    return row["time_s"], time.perf_counter() - t0, row["evaluator"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", nargs="+", default=["piz_daint_aries", "ib_fdr_fattree"])
    ap.add_argument("--algorithms", nargs="+", default=["oktopk", "topka", "gaussiank", "gtopk"])
    ap.add_argument("--P", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--bert", action="store_true", help="BERT-base at data_scale 0.01 with the P100's compute")
    a = ap.parse_args()
    print(f"bench_flow_waves: load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, routing seeds 0..{a.seeds - 1}")
    print(f"{'network':<16} {'algorithm':<10} {'P':>5} {'events s':>11} {'spread':>7} {'waves s':>11} {'spread':>7} "
          f"{'error':>8} {'seed 0':>8} {'wall events':>11} {'wall waves':>10} path")
    errs = []
    for net in a.networks:
        for alg in a.algorithms:
            for P in a.P:
                base = dict(name="flow_waves", algorithms=[alg], P=P, iterations=1, warmup=0, check=False)
                if a.bert:
                    base.update(compute="p100", data_scale=0.01, workload={"model": "bert_base", "density": 0.01,
                                                                           "seed": 0})
                else:
                    base.update(workload={"n": a.n, "density": 0.01, "dtype": "float32", "seed": 0})
                te, tw, we, ww = [], [], 0.0, 0.0
                for seed in range(a.seeds):
                    cfg = {**base, "network": {"preset": net, "routing_seed": seed}}
                    t, w, _ = simulate({**cfg, "evaluation": "events"})
                    te.append(t)
                    we += w
                    t, w, path = simulate({**cfg, "evaluation": "waves_flow"})
                    tw.append(t)
                    ww += w
                me, mw = float(np.median(te)), float(np.median(tw))
                err = mw / me - 1.0
                errs.append(abs(err))
                print(f"{net:<16} {alg:<10} {P:>5} {me:11.5g} {100 * (max(te) - min(te)) / me:6.1f}% {mw:11.5g} "
                      f"{100 * (max(tw) - min(tw)) / mw:6.1f}% {100 * err:+7.2f}% {100 * (tw[0] / te[0] - 1):+7.2f}% "
                      f"{we:10.1f}s {ww:9.1f}s {path}", flush=True)
    print(f"|error of the medians|: median {100 * np.median(errs):.2f} %, max {100 * max(errs):.2f} % over "
          f"{len(errs)} points; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
