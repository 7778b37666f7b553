"""How long error feedback's residual takes to settle in the Ok-Topk paper's
BERT config: Ok-Topk's selections (local and global, in units of k) and the
reported iteration time with more warm-up iterations.

    python benchmarks/bench_ef_transient.py --P 32 --warmup 1 4 16 48

The residual starts at zero, so the first iterations' accumulated vector is
narrower than a long run's and the thresholds Ok-Topk reuses select several
times k until it settles (docs/history/performance-journal.md, thirtieth session). Full
values, data_scale 0.01, on the config's own network (piz_daint_aries since the papers count moved BERT there).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale  # noqa: E402

from simsparse.algorithms import get_algorithm  # noqa: E402
from simsparse.experiments.run.runner import simulate_point  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=32)
    ap.add_argument("--warmup", type=int, nargs="+", default=[1, 4, 16, 48])
    a = ap.parse_args()
    cls = get_algorithm("oktopk")
    run, log = cls.iteration, []

    def logged(self, ctx, grad):   # rank 0's selections, in units of k, after each iteration
        res = yield from run(self, ctx, grad)
        if self.setup.rank == 0:
            k = self.setup.k
            log.append((self.iteration_no - 1, self.used["local_nnz"] / k, self.used["global_nnz"] / k))
        return res

    cls.iteration = logged
    print(f"bench_ef_transient: P = {a.P}, load {os.getloadavg()[0]:.2f}")
    for warm in a.warmup:
        pts = bench_scale.points_of(bench_scale.config("bert_paper", a.P, "fast"))
        p = dataclasses.replace([p for p in pts if p.algorithm == "oktopk"][0], warmup=warm)
        log.clear()
        t0 = time.perf_counter()
        row = simulate_point(p).row
        measured = ", ".join(f"counter {c}: {lo:.2f} k local, {gl:.2f} k global" for c, lo, gl in log[warm:])
        print(f"warm-up {warm:3d}: time_s {row['time_s']:.5f}; {measured} ({time.perf_counter() - t0:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
