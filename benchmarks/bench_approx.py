"""The wave-after-wave approximation against the exact replay, on the
collectives it is meant for (issue 23).

    python benchmarks/bench_approx.py --algorithms oktopk topkdsa --P 16 48 100 256 1024

The simulator times a bulk collective of at least 2^20 messages that waits
for ports wave after wave (:mod:`simsparse.backends.fast.waves_ab`, ``bulk~``)
instead of replaying it in event order; that happens from P = 1025 for an
alltoall. Each point here (1M float32, 1 %, ``aries_alphabeta``, sampled
values, one iteration as ``bench_scale.py`` runs it) runs twice in this
process: with every collective exact (the replay, which equals the event
path), and with the threshold lowered to P (P - 1) / 2, so that the
alltoalls of the split and reduce, and only they, are approximated. It
prints both simulated times, the error and the wall times.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def simulate(alg: str, P: int, approx_from: int) -> tuple[float, float]:
    """(simulated seconds, wall seconds) of the point with that threshold."""
    import bench_scale
    import simsparse.backends.events.sim as sim_mod
    from simsparse.experiments.run.runner import simulate_point

    sim_mod.APPROX_FROM = approx_from
    (point,) = bench_scale.points_of({**bench_scale.config("ab_oktopk", P, "fast"), "algorithms": [alg]})
    t0 = time.perf_counter()
    row = simulate_point(point).row
    return row["time_s"], time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithms", nargs="+", default=["oktopk", "topkdsa"])
    ap.add_argument("--P", type=int, nargs="+", default=[16, 48, 100, 256])
    a = ap.parse_args()
    import os
    print(f"bench_approx: load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'algorithm':<10} {'P':>5} {'exact s':>14} {'approx s':>14} {'error':>9} {'wall exact':>10} {'wall approx':>11}")
    errs = []
    for alg in a.algorithms:
        for P in a.P:
            te, we = simulate(alg, P, 1 << 62)
            ta, wa = simulate(alg, P, max(1, P * (P - 1) // 2))
            err = (ta - te) / te
            errs.append(abs(err))
            print(f"{alg:<10} {P:>5} {te:>14.9g} {ta:>14.9g} {err:>+9.3%} {we:>10.1f} {wa:>11.1f}", flush=True)
    print(f"max |error| {max(errs):.3%} over {len(errs)} points; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
