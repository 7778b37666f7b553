"""Simulator throughput: events per second and wall time for ring allreduce.

    python benchmarks/bench_sim_events.py [n_elements]

Simulates one ring allreduce of n float32 (default 65536) at P = 256 and 1024
on the alpha-beta network with ideal compute and prints, per P: simulated
time, SimPy events, messages, wall time, events/s and messages/s. Payloads
carry real data, so the wall time includes the numpy work on the blocks.
"""
import sys
import time

from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
    print(f"ring allreduce, n = {n} float32, alpha-beta (1.18 us, 9.96 GB/s), ideal compute")
    print(f"{'P':>6} {'sim time [s]':>13} {'events':>10} {'messages':>10} {'wall [s]':>9} {'events/s':>10} {'msgs/s':>10}")
    for P in (256, 1024):
        pt = Point(algorithm="ring", P=P, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
                   network={"model": "alphabeta", "alpha_s": 1.18e-6, "bandwidth_Bps": 9.96e9},
                   iterations=1, warmup=0, check=False)
        t0 = time.perf_counter()
        row = simulate_point(pt).row
        wall = time.perf_counter() - t0
        ev, msgs = row["sim_events"], row["msgs_total"]
        print(f"{P:>6} {row['time_s']:>13.6g} {ev:>10} {msgs:>10} {wall:>9.2f} {ev / wall:>10.0f} {msgs / wall:>10.0f}")


if __name__ == "__main__":
    main()
