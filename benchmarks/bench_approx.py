"""The wave-after-wave approximation against the exact replay, on the
collectives it is meant for (issue 23).

    python benchmarks/bench_approx.py --algorithms oktopk topkdsa --P 16 48 100 256 1024

``evaluation: fast`` times a gathered collective of at least 2^20 messages
wave after wave (``waves_ab``, :mod:`simsparse.backends.fast.waves_ab`),
where the table declares it within 1 %; that happens from P = 1025 for an
alltoall. Each point here (1M float32, 1 %, ``aries_alphabeta``, one
iteration as ``bench_scale.py`` runs it, the values ``fast`` gives it) runs
twice in this process: ``evaluation: replay`` (every collective replayed
exactly, the event path's times) and ``evaluation: waves_ab`` (every
collective wave after wave, the small allgathers too). It prints both
simulated times, the error and the wall times.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def simulate(alg: str, P: int, evaluation: str) -> tuple[float, float]:
    """(simulated seconds, wall seconds) of the point under ``evaluation``."""
    import bench_scale
    from simsparse.experiments.run.runner import simulate_point

    (point,) = bench_scale.points_of({**bench_scale.config("ab_oktopk", P, evaluation), "algorithms": [alg]})
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
            te, we = simulate(alg, P, "replay")
            ta, wa = simulate(alg, P, "waves_ab")
            err = (ta - te) / te
            errs.append(abs(err))
            print(f"{alg:<10} {P:>5} {te:>14.9g} {ta:>14.9g} {err:>+9.3%} {we:>10.1f} {wa:>11.1f}", flush=True)
    print(f"max |error| {max(errs):.3%} over {len(errs)} points; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
