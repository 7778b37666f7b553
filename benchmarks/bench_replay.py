"""The compiled bulk replay against the Python one, on a grid of points.

    python benchmarks/bench_replay.py                 # every algorithm, P = 3, 8, 13, 24
    python benchmarks/bench_replay.py --P 5 31 --algorithms oktopk topkdsa

Every point runs twice on the alpha-beta network (``SIMSPARSE_NUMBA=0``:
the Python replay of ``backends/fast/timing.py``; ``1``: ``backends/fast/replay_ab.py``),
with ideal and P100 compute, and three protocols: eager; rendezvous past
256 B with a 3 us handshake; rendezvous with an unexpected window of 1000 B
and reduced data. It prints every point whose rows differ (time, path,
bytes, messages), the count of compiled replays, and the wall time of each
path.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    from simsparse.algorithms import ALGORITHMS
    from simsparse.backends.fast import replay_ab, replay_arrays
    from simsparse.compute.devices import load_profile
    from simsparse.experiments.run.runner import simulate_point
    from tests.helpers import make_point

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, nargs="+", default=[3, 8, 13, 24])
    ap.add_argument("--algorithms", nargs="+", default=sorted(ALGORITHMS))
    a = ap.parse_args()
    if replay_ab.compiled() is None:
        sys.exit("numba is not installed (or SIMSPARSE_NUMBA=0): nothing to compare")
    calls = [0]
    real = replay_arrays.replay_run

    def counted(run):
        calls[0] += 1
        return real(run)

    replay_arrays.replay_run = counted
    replay_ab.COMPILE_FROM = 0   # the grid's replays are small
    p100 = load_profile("p100").model_dump()
    wall = {"0": 0.0, "1": 0.0}
    cases = differ = 0
    for alg in a.algorithms:
        for P in a.P:
            for compute in (None, p100):
                for proto in range(3):
                    kw = dict(n=4000, density=0.02, iterations=2, warmup=1, seed=P)
                    if compute:
                        kw["compute"] = compute
                    if proto:
                        kw.update(eager=256, rendezvous_rtt_s=3e-6 if proto == 1 else 0.0)
                    p = make_point(alg, P, **kw)
                    if proto == 2:
                        p = dataclasses.replace(p, network={**p.network, "unexpected_window_B": 1000}, data_scale=0.3)
                    rows = []
                    for flag in ("0", "1"):
                        os.environ["SIMSPARSE_NUMBA"] = flag
                        t = time.perf_counter()
                        r = simulate_point(p).row
                        wall[flag] += time.perf_counter() - t
                        rows.append((r["time_s"], r["collectives"], r["bytes_total"], r["msgs_total"]))
                    cases += 1
                    if rows[0] != rows[1]:
                        differ += 1
                        print("DIFFERS", alg, P, "P100" if compute else "ideal", proto, rows)
    print(f"{cases} points, {differ} differ; {calls[0]} compiled replays; "
          f"wall: Python replay {wall['0']:.1f} s, compiled {wall['1']:.1f} s (whole simulations)")


if __name__ == "__main__":
    main()
