"""How what a rank ran before moves the host speed probe.

    mpiexec -n 2 python benchmarks/bench_probe_history.py [--cycles 8] [--algorithm ring]

``validate`` predicts a second time at the host's speed when each point was
measured: the speed probe (``compute.speed_probe``) before the point over the
profile's. The two sides take the probe in different states: ``calibrate``
before each algorithm, right after the previous one's runs up to 1.2e7
elements and ``release_heap``; ``measure`` before each point of a launch,
after the point before it, whatever its size. This takes the probe after
runs of the algorithm at 1e4, 3e6 and 1.2e7 elements (the last also with
``release_heap``, the calibration's state) and once on a fresh launch, in
alternating order over ``--cycles`` cycles, and prints each state's median
probe (the sum and each call, milliseconds) and its ratio to the state after
1e4. Run it with nothing else running; the load average is printed before
and after.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

STATES = {"after 1e4": (10_000, False), "after 3e6": (3_000_000, False), "after 1.2e7": (12_000_000, False),
          "after 1.2e7 + release_heap": (12_000_000, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--algorithm", default="ring")
    args = ap.parse_args()

    from simsparse.backends.real.rank_env import as_a_rank

    as_a_rank()
    from mpi4py import MPI

    from simsparse.backends.real.rank_env import release_heap
    from simsparse.compute import speed_probe
    from simsparse.experiments.config.point import Point
    from simsparse.experiments.run.loop import run_point
    from simsparse.experiments.run.worker import MPIBackend

    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    if comm.rank == 0:
        print(f"load average before: {os.getloadavg()[0]:.2f}; P = {P}, {args.cycles} cycles")

    def point(name: str, n: int) -> Point:
        return Point(algorithm=name, P=P, params={}, network={"model": "alphabeta"}, compute=None,
                     workload={"n": n, "density": 0.004, "dtype": "float32", "seed": 1234, "drift": 0.2},
                     iterations=2, warmup=3, check=False)

    def probe() -> dict:
        b = MPIBackend(point(args.algorithm, 10_000), "cpu")   # (as before a point: its backend made first)
        return speed_probe.across_ranks(comm, b.device, b.driver.rs.sync)

    got = {"fresh launch": [probe()]}
    order = list(STATES)
    for cycle in range(args.cycles):
        for state in order if cycle % 2 == 0 else order[::-1]:
            n, release = STATES[state]
            pt = point(args.algorithm, n)
            run_point(pt, MPIBackend(pt, "cpu"))
            if release:
                release_heap()
            got.setdefault(state, []).append(probe())
    if comm.rank == 0:
        keys = ["wall_s"] + [speed_probe.call_key("wall", name) for name, _ in speed_probe.CALLS]
        ref = {k: np.median([g[k] for g in got["after 1e4"]]) for k in keys}
        print(f"{'state':>28} {'probes':>6} " + " ".join(f"{k[5:-2] or 'sum':>12}" for k in keys) + "  ratio (sum)")
        for state, probes in got.items():
            med = {k: np.median([g[k] for g in probes]) for k in keys}
            print(f"{state:>28} {len(probes):>6} " + " ".join(f"{1e3 * med[k]:>9.2f} ms" for k in keys)
                  + f"  {med['wall_s'] / ref['wall_s']:.3f}")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
