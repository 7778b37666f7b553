"""The error and the speed-up of the simulator's ``data_scale``.

    python benchmarks/bench_data_scale.py [n] [P]

For every registered algorithm (default params, P100 compute model, Aries
alpha-beta network, 1% density, 2 measured iterations after 1 warm-up,
i.i.d. gradients), simulates n elements (default 2^18) at P ranks (default
16) in full and at data_scale 1/4, 1/16 and 1/64, and prints the relative
error of bytes_total and time_s against the full-size run, with the wall
times. Dense schedules are exact; sparse ones fluctuate where the selected
count depends on the data (threshold reuse: about 1/sqrt(k * data_scale)).
"""
import sys
import time
from dataclasses import replace

from simsparse.algorithms import ALGORITHMS
from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point

SCALES = (1 / 4, 1 / 16, 1 / 64)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 18
    P = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    print(f"n = {n}, P = {P}, density 1%, p100, aries_alphabeta; error = scaled / full - 1")
    head = "".join(f" | 1/{round(1 / s):<3d} bytes   time" for s in SCALES)
    print(f"{'algorithm':22s} {'full wall':>9s}{head} | wall at 1/{round(1 / SCALES[-1])}")
    for name in sorted(ALGORITHMS):
        base = Point(algorithm=name, P=P, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
                     network={"model": "alphabeta", "alpha_s": 1.18e-6, "bandwidth_Bps": 9.96e9,
                              "eager_threshold_B": 8192},
                     compute={"name": "p100", "launch_s": 5e-6, "mem_bandwidth_Bps": 7.32e11,
                              "kernels": {"topk": {"complexity": "nlogn", "per_elem_s": 6.1e-10}}},
                     iterations=2, warmup=1, check=False)
        t = time.perf_counter()
        full = simulate_point(base).row
        wall_full = time.perf_counter() - t
        cells = []
        for s in SCALES:
            t = time.perf_counter()
            row = simulate_point(replace(base, data_scale=s)).row
            wall = time.perf_counter() - t
            cells.append(f" | {row['bytes_total'] / full['bytes_total'] - 1:+7.3f} {row['time_s'] / full['time_s'] - 1:+7.3f}")
        print(f"{name:22s} {wall_full:8.2f}s{''.join(cells)} | {wall:.2f}s")


if __name__ == "__main__":
    main()
