"""Streaming kernels run by several processes at once: the host's memory bandwidth they share.

    python benchmarks/bench_memory_sharing.py [--sizes 393216 3145728] [--procs 1 2 4] [--reps 100]
        [--kernels add add_into copy]

Each of ``--procs`` processes (ranks of one host, started together, every
one running with the real backend's caching heap: ``rank_env``) calls the
kernel's own implementation (``KERNELS[name].numpy``) on float32 blocks of n
entries back to back, and times each call by its CPU clock, as
``calibrate`` times kernels where ranks outnumber cores. The simulator's
shared cores (``compute/cores.py``) split a host's cores among its ranks
but charge every kernel the CPU seconds of its line, whatever else the
host runs at that moment (the line is fitted over the calibration's
algorithm runs, so it holds their average overlap). A kernel whose
operands outgrow the caches streams them from DRAM, and DRAM is one per
host: where two such kernels run on two cores at once, each one's CPU
seconds grow. Two effects show across sizes: the last-level cache is one
per host too, so operands that fit it alone stop fitting once several
processes' operands share it (the ratio jumps where their sum passes it),
and past it one core's streaming already takes most of the DRAM
bandwidth (the ratio stays near the number of processes).

With ``--beside`` it runs a controlled pair instead: the real backend's torch
kernel (a sparse one at each ``--densities``, with ``calibrate``'s inputs) on
one core, alone and then beside a process that loops a streaming kernel of
``--beside-sizes`` entries on the other core (the testbed binds 2 ranks a
core). Where a kernel is slower beside a large co-runner at one density and
not at another, the co-runner, not the density, moves it.

    python benchmarks/bench_memory_sharing.py --beside add_into --kernels scatter_add topk
        --sizes 3145728 --densities 0.001 0.05 --beside-sizes 393216 3145728

It prints, per kernel, size and number of processes, every process's median
call (microseconds), the bytes the processes' calls touch together (operands
and fresh results) over the host's last-level cache, and the slowest over the one-process median.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import time

import numpy as np


def _args(name: str, n: int):
    rng = np.random.default_rng(n)
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    return (a,) if name == "copy" else (a, b)


def _timed(fn, args, reps: int, start) -> float:
    """Median CPU microseconds of ``reps`` calls ``fn(*args)``, after one warm-up and the barrier ``start``
    (every process starts its loop at once)."""
    fn(*args)
    start.wait()
    times = []
    for _ in range(reps):
        t0 = time.process_time_ns()
        fn(*args)
        times.append(time.process_time_ns() - t0)
    return float(np.median(times)) / 1e3


def _rank(name: str, n: int, reps: int, start, out) -> None:
    from simsparse.compute.kernels import KERNELS

    out.put(_timed(KERNELS[name].numpy, _args(name, n), reps, start))


def _measured(name: str, n: int, d: float, reps: int, core: int, go, out) -> None:
    """The torch kernel ``name`` on n entries at density d (``calibrate``'s inputs), bound to ``core``,
    once ``go`` is set: the median CPU time of ``reps`` calls."""
    import torch

    import simsparse.algorithms  # noqa: F401  (registers the algorithms' own kernels, scatter_values among them)
    from simsparse.calibration.worker import _idle_inputs, _sparse_inputs
    from simsparse.compute.kernels import get_kernel

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    x = torch.randn(2 * n, generator=torch.Generator().manual_seed(n))
    args = _sparse_inputs(name, x[:n], d, 4) if d else _idle_inputs(name, x, 4)
    out.put(_timed(get_kernel(name).torch_fn, args, reps, go))


def _co_runner(name: str, n: int, core: int, go, stop) -> None:
    """Streaming kernel ``name`` on n entries, bound to ``core``, in a loop from ``go`` until ``stop``."""
    from simsparse.compute.kernels import KERNELS

    os.sched_setaffinity(0, {core})
    fn, args = KERNELS[name].numpy, _args(name, n)
    fn(*args)
    go.wait()
    while not stop.is_set():
        fn(*args)


def beside(name: str, n: int, d: float, co: str | None, co_n: int, reps: int) -> float:
    """Median us per call of kernel ``name`` on core 0, alone (``co`` None) or beside ``co`` on core 1."""
    go, stop, out = mp.Barrier(2 if co else 1), mp.Event(), mp.Queue()
    ps = [mp.Process(target=_measured, args=(name, n, d, reps, 0, go, out))]
    if co:
        ps.append(mp.Process(target=_co_runner, args=(co, co_n, 1, go, stop)))
    for p in ps:
        p.start()
    try:
        while True:   # (a measured process that died reports nothing: never wait for it)
            try:
                return out.get(timeout=1.0)
            except queue.Empty:
                if not ps[0].is_alive():
                    raise RuntimeError(f"the process timing {name} died (exit {ps[0].exitcode})") from None
    finally:
        stop.set()
        for p in ps:
            p.join(5.0)
            if p.is_alive():
                p.kill()


def _footprint(name: str, n: int) -> int:
    """Bytes one call touches: its operands, and its result where that is a new array."""
    from simsparse.compute.kernels import KERNELS

    args = _args(name, n)
    out = KERNELS[name].numpy(*args)
    fresh = isinstance(out, np.ndarray) and not any(np.shares_memory(out, a) for a in args)
    return sum(a.nbytes for a in args) + (out.nbytes if fresh else 0)


def run(name: str, n: int, procs: int, reps: int) -> list[float]:
    start, out = mp.Barrier(procs), mp.Queue()
    ps = [mp.Process(target=_rank, args=(name, n, reps, start, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    got = sorted(out.get() for _ in ps)
    for p in ps:
        p.join()
    return got


def main(argv=None) -> None:
    from simsparse.backends.real.rank_env import RANK_ENV
    from simsparse.calibration.worker import llc_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[393_216, 1_048_576, 1_572_864, 3_145_728, 6_291_456])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--kernels", nargs="+", default=["add", "add_into", "copy"])
    ap.add_argument("--beside", default=None, help="the controlled pair: this streaming kernel as the co-runner")
    ap.add_argument("--beside-sizes", type=int, nargs="+", default=[393_216, 3_145_728])
    ap.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.05],
                    help="with --beside: the sparse kernels' densities (0: a streaming kernel)")
    args = ap.parse_args(argv)
    for k, v in RANK_ENV.items():   # (the children inherit it, and glibc reads it as they start)
        os.environ.setdefault(k, v)
    mp.set_start_method("spawn", force=True)
    llc = llc_bytes()
    if args.beside:
        print(f"kernel on core 0 beside {args.beside} on core 1; load {os.getloadavg()[0]:.2f}")
        print(f"{'kernel':<16} {'n':>9} {'density':>8} {'alone us':>9}  " +
              "  ".join(f"{f'beside {c:,}':>17}" for c in args.beside_sizes))
        for name in args.kernels:
            for n in args.sizes:
                for d in args.densities:
                    alone = beside(name, n, d, None, 0, args.reps)
                    cols = [beside(name, n, d, args.beside, c, args.reps) for c in args.beside_sizes]
                    print(f"{name:<16} {n:>9} {d:>8g} {alone:>9.0f}  " +
                          "  ".join(f"{t:>9.0f} ({t / alone:4.2f}x)" for t in cols))
        print(f"load {os.getloadavg()[0]:.2f}")
        return
    print(f"cores {os.cpu_count()}, last-level cache {llc / 2**20 if llc else float('nan'):.0f} MiB, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'kernel':<10} {'n':>9} {'procs':>5}  {'median us per call, each process':<40} {'touched / LLC':>14} "
          f"{'slowest / alone':>15}")
    for name in args.kernels:
        for n in args.sizes:
            alone = None
            for procs in args.procs:
                got = run(name, n, procs, args.reps)
                alone = alone or got[0]
                share = procs * _footprint(name, n) / llc if llc else float("nan")
                print(f"{name:<10} {n:>9} {procs:>5}  {' '.join(f'{x:.0f}' for x in got):<40} {share:>14.2f} "
                      f"{got[-1] / alone:>15.2f}")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
