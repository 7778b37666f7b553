"""What a fresh buffer costs on this host: the first touch of a page, and the
repeated faults of glibc's default heap against the real backend's caching heap.

    python benchmarks/bench_page_faults.py [--n 10000000] [--reps 9]

* **first touch**: a new anonymous 64 MiB mapping is written once per 4 KiB
  page, then again; the difference over the page count is one minor fault
  (the kernel's trap, a zeroed page, the page-table update);
* **fresh outputs**: ``np.add(a, b)`` into a new array of ``--n`` float32,
  ``--reps`` times, in a child interpreter started with glibc's defaults and
  in one started with :data:`simsparse.backends.real.rank_env.RANK_ENV` (what every
  rank of ``simsparse measure`` / ``calibrate`` gets). Prints the median time
  per call and the minor faults per call (``getrusage``).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import subprocess
import sys
import time

import numpy as np

CHILD = """
import json, resource, sys, time, numpy as np
n, reps = int(sys.argv[1]), int(sys.argv[2])
a, b = np.ones(n, np.float32), np.ones(n, np.float32)
ts, fs = [], []
for _ in range(reps + 1):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter(); c = np.add(a, b); ts.append(time.perf_counter() - t)
    fs.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    del c
print(json.dumps({"t": float(np.median(ts[1:])), "faults": float(np.median(fs[1:]))}))
"""


def first_touch(reps: int, size: int = 64 << 20) -> list[float]:
    """Seconds per minor fault: first write of every page less a second write."""
    out = []
    for _ in range(reps):
        m = mmap.mmap(-1, size)
        a = np.frombuffer(m, np.uint8)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter(); a[::mmap.PAGESIZE] = 1; t = time.perf_counter() - t
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        t2 = time.perf_counter(); a[::mmap.PAGESIZE] = 2; t2 = time.perf_counter() - t2
        del a
        m.close()
        out.append((t - t2) / max(faults, 1))
    return out


def fresh_outputs(n: int, reps: int, env: dict) -> dict:
    got = subprocess.run([sys.executable, "-c", CHILD, str(n), str(reps)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(got.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    from simsparse.backends.real.rank_env import RANK_ENV, rank_env

    print(f"load average before: {os.getloadavg()[0]:.2f}")
    ft = np.array(first_touch(args.reps)) * 1e6
    print(f"first touch of a 4 KiB page: median {np.median(ft):.2f} us (min {ft.min():.2f}, max {ft.max():.2f}, "
          f"{args.reps} mappings of 64 MiB)")
    plain = {k: v for k, v in os.environ.items() if k not in RANK_ENV or k == "OMP_NUM_THREADS"}
    for label, env in (("glibc defaults", plain), ("caching heap (RANK_ENV)", rank_env(plain))):
        r = fresh_outputs(args.n, args.reps, env)
        print(f"np.add into a fresh array of {args.n} float32, {label}: {r['t'] * 1e3:.2f} ms per call, "
              f"{r['faults']:.0f} minor faults per call")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
