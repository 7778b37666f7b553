"""How the order of a density grid's calls moves its factors: blocks or rounds.

    python benchmarks/bench_grid_order.py [--kernel topk] [--n 3000000] [--runs 8] [--reps 5]

``calibrate``'s sparse grid (``calibration.worker.sparse_grid``) gives each
sparse kernel a factor per density: its median time there over its time at
the reference density (``select_scale``). Timed in *blocks* (every call at
one density, then the next density), the factor compares two windows of
time, and the host's memory speed moves over seconds (four-rank launches
seconds apart: copy and add 11 % apart, ``count_above`` 16 %). Timed in
*rounds* (each round calls every density once), every density sees the same
windows. This times the kernel both ways, ``--runs`` times each, alternating,
in one process with the ranks' heap settings (``backends.real.rank_env``),
and prints each way's factor at every density (median over the runs) and
its spread over the runs, (max - min) / median. Run it with nothing else
running; the load average is printed before and after.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

DENSITIES = (0.0007, 0.0015, 0.004, 0.02, 0.05)
REFERENCE = 0.004


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="topk")
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    from simsparse.backends.real.rank_env import as_a_rank

    as_a_rank()

    import torch

    import simsparse.algorithms  # noqa: F401  (registers the algorithms' kernels)
    from simsparse.calibration.worker import _sparse_inputs
    from simsparse.compute.kernels import get_kernel

    torch.set_num_threads(1)
    k = get_kernel(args.kernel)
    x = torch.randn(args.n, generator=torch.Generator().manual_seed(4321))
    inputs = {d: _sparse_inputs(args.kernel, x, d, 4) for d in DENSITIES}

    def call(d):
        t0 = time.perf_counter()
        k.torch_fn(*inputs[d])
        return time.perf_counter() - t0

    def blocks():
        t = {}
        for d in DENSITIES:
            k.torch_fn(*inputs[d])   # (its warm-up)
            t[d] = np.median([call(d) for _ in range(args.reps)])
        return t

    def rounds():
        for d in DENSITIES:
            k.torch_fn(*inputs[d])
        ts = {d: [] for d in DENSITIES}
        for _ in range(args.reps):
            for d in DENSITIES:
                ts[d].append(call(d))
        return {d: np.median(v) for d, v in ts.items()}

    print(f"load average before: {os.getloadavg()}")
    got = {"blocks": [], "rounds": []}
    for _ in range(args.runs):
        for way, fn in (("blocks", blocks), ("rounds", rounds)):
            t = fn()
            got[way].append({d: t[d] / t[REFERENCE] for d in DENSITIES})
    print(f"{args.kernel} of {args.n:,}: factor over density {REFERENCE}, median over {args.runs} runs "
          f"[spread (max - min) / median]")
    print("way     " + "".join(f"{d:>18}" for d in DENSITIES if d != REFERENCE))
    for way, runs in got.items():
        cells = []
        for d in DENSITIES:
            if d == REFERENCE:
                continue
            f = np.array([r[d] for r in runs])
            med = float(np.median(f))
            cells.append(f"{med:8.3f} [{(f.max() - f.min()) / med:5.1%}]")
        print(f"{way:8}" + "".join(f"{c:>18}" for c in cells))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
