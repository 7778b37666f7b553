"""SparCML's sparse allreduces and TopkDSA against dense Rabenseifner and TopkA.

    python benchmarks/bench_sparcml.py [n] [density] [network.yaml]

Simulates one allreduce of n float32 (default 2^20) at the given density
(default 0.01) for P = 4..64 on a network preset (default the Aries
alpha-beta model, topologies/aries_alphabeta.yaml) with ideal compute, and
prints per algorithm and P: simulated time, bytes sent by the busiest rank,
and the measured fill-in of the result against SparCML's expected
n (1 - (1 - k/n)^P).
"""
import sys
from pathlib import Path

import numpy as np
import yaml

from simsparse.algorithms.sparcml import expected_nnz
from simsparse.experiments.config.point import Point, to_dense
from simsparse.experiments.run.runner import simulate_point

ROOT = Path(__file__).resolve().parent.parent
ALGOS = [
    ("rabenseifner", {}),
    ("topka", {}),
    ("ssar_recursive_double", {}),
    ("ssar_split_allgather", {}),
    ("ssar_split_allgather", {"rotation": True}),
    ("dsar_split_allgather", {}),
    ("dsar_split_allgather", {"quantize_bits": 4}),
    ("topkdsa", {}),
    ("topkdsa", {"count_exchange": False}),
]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2**20
    density = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
    net_file = Path(sys.argv[3]) if len(sys.argv) > 3 else ROOT / "topologies" / "aries_alphabeta.yaml"
    network = yaml.safe_load(net_file.read_text())
    print(f"n = {n} float32, density {density}, network {net_file.name}, ideal compute")
    print(f"{'algorithm':<44} {'P':>3} {'time [us]':>10} {'max bytes/rank':>15} {'nnz/E[K]':>9}")
    for name, params in ALGOS:
        label = name + (" " + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
        for P in (4, 8, 16, 32, 64):
            pt = Point(algorithm=name, P=P, params=params,
                       workload={"n": n, "density": density, "dtype": "float32", "seed": 0},
                       network=network, iterations=1, warmup=0, check=True)
            out = simulate_point(pt, keep_results=True)
            row = out.row
            fill = np.count_nonzero(to_dense(out.results[0], n)) / expected_nnz(n, row["k"], P) \
                if pt.algorithm_cls.family == "sparse" else float("nan")
            ok = "" if row["correct"] else "  WRONG"
            print(f"{label:<44} {P:>3} {row['time_s'] * 1e6:>10.1f} {row['bytes_sent_max']:>15} {fill:>9.4f}{ok}")


if __name__ == "__main__":
    main()
