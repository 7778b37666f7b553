"""Kernels whose output lands on memory written long ago, against memory just written, inside a measured run.

    python benchmarks/bench_fresh_outputs.py [--P 2] [--algorithms ring topka] [--sizes 393216 3145728]
        [--density 0.001] [--iters 10] [--warmup 2]

One ``mpiexec -n P`` launch runs each algorithm exactly as ``simsparse
measure`` runs a point (``MPIBackend`` + ``run_point``, on this host, the
ranks' allocator settings: ``rank_env.RANK_ENV``), with every kernel's torch
implementation wrapped to record, on rank 0, its wall time and the address
of the tensor it returns. A returned tensor that starts where an earlier
call's output started is placed by its *reuse distance*: the bytes of
outputs written since then. ``near``: under this core's L2 (its lines may
still be cached); ``far``: more than that, or an address no output used
before (the heap's caching keeps it mapped, so no page faults: the lines
come from far away). The table gives per kernel and size the median wall
time of each class and far over near: what a kernel's calibration, timed
back to back where outputs come and go at one address, leaves out when a
run's buffers cycle through more memory than the cache holds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def l2_bytes() -> int:
    """This core's L2 in bytes (sysfs), 1 MiB where it does not say."""
    try:
        s = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
        return int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]] if s[-1] in "KM" else int(s)
    except (OSError, ValueError, KeyError):
        return 1 << 20


def worker(args) -> None:
    from mpi4py import MPI

    from simsparse.compute.kernels import KERNELS
    from simsparse.experiments.config.point import Point
    from simsparse.experiments.run.loop import run_point
    from simsparse.experiments.run.worker import MPIBackend

    calls, on = [], [False]

    def wrap(name, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            dt = time.perf_counter() - t0
            if on[0] and hasattr(out, "data_ptr"):
                calls.append((name, dt, out.data_ptr(), out.numel() * out.element_size()))
            return out
        return timed

    for name, k in KERNELS.items():
        k.torch_fn = wrap(name, k.torch_fn)
    rows = []
    for alg in args.algorithms:
        for n in args.sizes:
            pt = Point(algorithm=alg, P=MPI.COMM_WORLD.Get_size(), params={}, network={"model": "alphabeta"},
                       compute=None, workload={"n": n, "density": args.density, "dtype": "float32", "seed": 11,
                                               "drift": 0.35},
                       iterations=args.iters, warmup=args.warmup, check=False)
            calls.clear()
            on[0] = True
            run_point(pt, MPIBackend(pt, "cpu"))
            on[0] = False
            written, last = 0, {}   # bytes of outputs so far; an address -> the bytes written when it was last
            for name, dt, ptr, nbytes in calls:
                dist = written - last[ptr] if ptr in last else None
                last[ptr] = written = written + nbytes
                if nbytes >= 1 << 16:
                    rows.append((alg, n, name, nbytes, dt, dist))
    if MPI.COMM_WORLD.Get_rank() == 0:
        Path(args.out).write_text(json.dumps(rows))


def table(rows, l2: int) -> None:
    print(f"{'algorithm':<10} {'n':>9} {'kernel':<18} {'out MB':>7} {'near':>5} {'us':>7} {'far':>5} {'us':>7} "
          f"{'far/near':>8}")
    groups: dict = {}
    for alg, n, name, nbytes, dt, dist in rows:
        g = groups.setdefault((alg, n, name, round(nbytes / 1e6, 2)), ([], []))
        g[0 if dist is not None and dist < l2 else 1].append(dt * 1e6)
    for (alg, n, name, mb), (near, far) in groups.items():
        a = np.median(near) if near else float("nan")
        b = np.median(far) if far else float("nan")
        print(f"{alg:<10} {n:>9} {name:<18} {mb:>7.2f} {len(near):>5} {a:>7.0f} {len(far):>5} {b:>7.0f} "
              f"{b / a:>8.2f}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, default=2)
    ap.add_argument("--algorithms", nargs="+", default=["ring", "topka"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[393_216, 3_145_728])
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT))
    from simsparse.backends.real.rank_env import RANK_ENV
    from simsparse.experiments.run.measure import find_mpiexec

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "rows.json")
        cmd = [find_mpiexec(), "-n", str(args.P), sys.executable, __file__, "--worker", "--out", out,
               "--iters", str(args.iters), "--warmup", str(args.warmup), "--density", str(args.density),
               "--algorithms", *args.algorithms, "--sizes", *map(str, args.sizes)]
        subprocess.run(cmd, check=True, env={**os.environ, **RANK_ENV}, cwd=ROOT)
        rows = json.loads(Path(out).read_text())
    l2 = l2_bytes()
    print(f"P = {args.P} on {os.cpu_count()} cores, rank 0's kernels of outputs of 64 KiB or more, wall time; "
          f"near: reuse distance under the L2 ({l2 / 2**20:.0f} MiB); load average {load:.2f} before and "
          f"{os.getloadavg()[0]:.2f} after")
    table(rows, l2)


if __name__ == "__main__":
    sys.exit(main())
