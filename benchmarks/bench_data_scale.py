"""The error and the speed-up of the simulator's ``data_scale``.

    python benchmarks/bench_data_scale.py [n] [P]
    python benchmarks/bench_data_scale.py --bert [P]

``--bert``: the Ok-Topk paper's BERT figure (``configs/papers/oktopk_bert.yaml``:
seven schemes on the flow-level Piz Daint, default P = 32) at data_scale
0.01, 0.1 and 1, every point on sampled values (``evaluation: sampled``);
prints each scheme's simulated iteration time at each scale, its difference
from data_scale 1, and the wall time of each scale. The aim: within 1 %.

For every registered algorithm (default params, P100 compute model, Aries
alpha-beta network, 1% density, 2 measured iterations after 1 warm-up,
i.i.d. gradients), simulates n elements (default 2^18) at P ranks (default
16) in full and at data_scale 1/4, 1/16 and 1/64, and prints the relative
error of bytes_total and time_s against the full-size run, with the wall
times. Dense schedules are exact; sparse ones fluctuate where the selected
count depends on the data (threshold reuse: about 1/sqrt(k * data_scale)).
"""
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

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


BERT_SCALES = (0.01, 0.1, 1.0)


def bert(P: int = 32) -> None:
    from simsparse.experiments.config.schema import load_config

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/papers/oktopk_bert.yaml").read_text())
    times, walls = {}, {}
    for s in BERT_SCALES:
        cfg = dict(raw, P=[P], data_scale=s, evaluation="sampled", name=f"bert_ds{s}")
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "bert.yaml"
            path.write_text(yaml.safe_dump(cfg))
            points = load_config(path).points
        t = time.perf_counter()
        for pt in points:
            row = simulate_point(pt).row
            times[(pt.schedule, pt.algorithm, s)] = row["t_iter_s"]
        walls[s] = time.perf_counter() - t
    print(f"Ok-Topk paper's BERT figure, P = {P}, piz_daint_aries, sampled values; t_iter_s and its difference "
          f"from data_scale 1")
    print(f"{'scheme':28s}" + "".join(f" | ds {s:<5g} t_iter_s   diff" for s in BERT_SCALES))
    for (sched, alg) in dict.fromkeys((k[0], k[1]) for k in times):
        full = times[(sched, alg, 1.0)]
        print(f"{sched + ' / ' + alg:28s}" + "".join(f" | {times[(sched, alg, s)]:17.6f} {times[(sched, alg, s)] / full - 1:+6.2%}"
                                                    for s in BERT_SCALES))
    print("wall: " + ", ".join(f"ds {s:g} {w:.1f} s" for s, w in walls.items()))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bert":
        bert(int(sys.argv[2]) if len(sys.argv) > 2 else 32)
    else:
        main()
