"""The compiled bulk replay against the Python one, on a grid of points.

    python benchmarks/bench_replay.py                 # every algorithm, P = 3, 8, 13, 24
    python benchmarks/bench_replay.py --P 5 31 --algorithms oktopk topkdsa

Every point runs twice on the alpha-beta network (``evaluation: replay_py``:
the Python replay of ``backends/fast/timing.py``; ``replay``: the compiled
one, ``backends/fast/replay_ab.py``),
with ideal and P100 compute, and three protocols: eager; rendezvous past
256 B with a 3 us handshake; rendezvous with an unexpected window of 1000 B
and reduced data. It prints every point whose rows differ (time, path,
bytes, messages), the count of compiled replays, and the wall time of each
path.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    from simsparse.algorithms import ALGORITHMS
    from simsparse.backends.fast import replay_ab
    from simsparse.compute.devices import load_profile
    from simsparse.experiments.run.runner import simulate_point
    from simsparse.backends.evaluators import EvaluationError
    from tests.helpers import make_point

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, nargs="+", default=[3, 8, 13, 24])
    ap.add_argument("--algorithms", nargs="+", default=sorted(ALGORITHMS))
    a = ap.parse_args()
    if replay_ab.numba is None:
        sys.exit("numba is not installed: nothing to compare")
    p100 = load_profile("p100").model_dump()
    wall = {"replay_py": 0.0, "replay": 0.0}
    compiled = 0
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
                    for evaluation in wall:
                        t = time.perf_counter()
                        try:
                            r = simulate_point(dataclasses.replace(p, evaluation=evaluation)).row
                        except EvaluationError:   # (no collective it can time)
                            break
                        wall[evaluation] += time.perf_counter() - t
                        compiled += evaluation == "replay" and "replay" in r["evaluator"].split("+")
                        rows.append((r["time_s"], r["error_bound"], r["bytes_total"], r["msgs_total"]))
                    cases += 1
                    if rows[0] != rows[1]:
                        differ += 1
                        print("DIFFERS", alg, P, "P100" if compute else "ideal", proto, rows)
    print(f"{cases} points, {differ} differ; {compiled} timed by the compiled replay; "
          f"wall: Python replay {wall['replay_py']:.1f} s, compiled {wall['replay']:.1f} s (whole simulations)")


if __name__ == "__main__":
    main()
