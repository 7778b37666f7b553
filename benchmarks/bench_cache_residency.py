"""Streaming kernels with their operands in cache and out of it, and after the rank slept.

    python benchmarks/bench_cache_residency.py [--sizes 75000 250000 750000 2500000] [--reps 30]
        [--evict-mb 64] [--idle-ms 1 2 10 50] [--stack-mb 1.5 12]
    python benchmarks/bench_cache_residency.py --sparse [--sizes 393216 3145728]
        [--densities 0.001 0.004 0.0157 0.05]
    python benchmarks/bench_cache_residency.py --aged [--sizes 393216] [--ages-s 0 0.05 0.3 1 3]

The streaming kernels, in place (``add_into``, ``copy_into``) and into a
fresh vector (``copy``, ``add``, ``concat``: what ``calibrate``'s idle grid
times), are timed by the real backend's own functions on float32 blocks of n entries,
each call by this process's CPU clock (as ``calibrate`` times kernels with
more ranks than cores):

* ``warm``: the same operands called back to back (what a kernel meets
  inside a small algorithm run, where nothing else touches memory between
  its steps);
* ``cold``: a write over ``--evict-mb`` MB of another array before each call,
  so the operands come from DRAM (what a step meets after tens of
  milliseconds of other ranks' work and the TCP stack's copies);
* ``idle D ms``: the process sleeps D ms before each call, in slices of
  at most 2 ms (``wire.SocketSleep.MAX_S``: how a rank of the real backend
  waits on the testbed's sockets), the core idle meanwhile;
* ``woken``: as ``idle`` at the longest D, with the same kernel run on a
  4 KB block first, untimed, as ``calibrate``'s ``idle_grid`` times it
  (the wake-up's own cost left out: woken less warm is what the profile's
  ``idle_excess`` holds);
* ``stack X MB`` (``--stack-mb``): X MB pass through a loopback TCP
  connection of this process before each call (a thread receives them), as
  the kernel's network stack copies a rank's messages while it waits: what
  the stack's own copies evict, which neither ``cold`` (a write by the
  rank) nor ``idle`` (nothing runs) shows.

With ``--sparse``, the kernels that read or write entries at random places
of a dense vector (``worker.COLD_KERNELS``: scatter-add, scatter of values,
gather) are timed instead, by their torch implementations on ``calibrate``'s
inputs at each of ``--densities``, warm and cold (written over by
``calibrate``'s own ``worker.evictor``, twice the last-level cache): what its
sparse grid now times them as (cold), against what it timed before (warm).

With ``--aged``, ``copy_into`` writes a block of a 100 MB pool last
written ``--ages-s`` seconds before, the caches swept by ``--evict-mb`` in
between either way: what the age of its pages alone adds to a kernel that
meets buffers one long iteration later (no page fault is counted: the
memory stays mapped; a virtual machine's host may still have work to do on
the first touch of a page left alone).

The process runs with the ranks' allocator settings (``RANK_ENV``: glibc
reads them at start, so it starts itself again with them where they are
missing). Each figure is the median over ``--reps`` calls, with the bandwidth the
kernel's work declares (``Work.bytes``) over it, and cold over warm. Timed
by the wall clock as well where the process slept (its CPU clock does not
count a wake-up's stalls any differently, but a sleeping rank's wall is
what a measured step shows).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from simsparse.calibration.worker import WAKE_N, _idle_inputs, idle
from simsparse.compute.kernels import KERNELS


def _calls(name: str, m: int):
    """The kernel's arguments on blocks of m entries, as ``calibrate``'s idle grid passes them
    (``worker._idle_inputs``, four ranks' blocks for ``concat``)."""
    return _idle_inputs(name, np.random.default_rng(m).random(2 * m, dtype=np.float32), 4)


def loopback():
    """A function that passes its argument's MB through a loopback TCP connection of this process
    (sent here, received by a thread): the stack's copies on both ends, as a waiting rank's messages."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    tx = socket.create_connection(srv.getsockname())
    rx, _ = srv.accept()
    srv.close()

    def carry(mb: float) -> None:
        n = int(mb * 1e6)
        into = memoryview(bytearray(n))

        def receive():
            got = 0
            while got < n:
                got += rx.recv_into(into[got:], n - got)
        t = threading.Thread(target=receive)
        t.start()
        tx.sendall(bytes(n))
        t.join()
    return carry


def _median_us(fn, args, reps: int, evict=None, idle_s: float = 0.0, wake=None) -> float:
    times = []
    for _ in range(reps):
        if evict is not None:
            evict()
        if idle_s:
            idle(idle_s)
        if wake is not None:
            fn(*wake)
        t0 = time.process_time_ns()
        fn(*args)
        times.append(time.process_time_ns() - t0)
    return float(np.median(times)) / 1e3


def sparse(args) -> None:
    """--sparse: each of ``COLD_KERNELS`` warm and cold at each size and density."""
    import torch

    import simsparse.algorithms  # noqa: F401  (registers scatter_values)
    from simsparse.calibration.worker import COLD_KERNELS, _sparse_inputs, evictor
    from simsparse.compute.kernels import get_kernel

    torch.set_num_threads(1)
    evict = evictor(torch.device("cpu"))
    print(f"{'kernel':<15} {'n':>10} {'density':>8} {'warm us':>9} {'cold us':>9} {'cold - warm':>11}")
    for name in COLD_KERNELS:
        k = get_kernel(name)
        for m in args.sizes:
            x = torch.randn(m, generator=torch.Generator().manual_seed(m))
            for d in args.densities:
                a = _sparse_inputs(name, x, d, 4)
                k.torch_fn(*a)
                warm, cold = _median_us(k.torch_fn, a, args.reps), _median_us(k.torch_fn, a, args.reps, evict)
                print(f"{name:<15} {m:>10} {d:>8g} {warm:>9.1f} {cold:>9.1f} {cold - warm:>11.1f}")


def aged(args) -> None:
    """--aged: ``copy_into`` of n entries into a block last written ``age`` seconds before (then swept)."""
    import resource

    k = KERNELS["copy_into"]
    big = np.ones(args.evict_mb * (1 << 20) // 4, dtype=np.float32)
    print(f"{'n':>10} {'age s':>6} {'us':>8} {'us a page':>9} {'faults':>6}")
    for m in args.sizes:
        src = np.random.default_rng(m).random(m, dtype=np.float32)
        pool = np.ones((max(2, (100 << 20) // (4 * m)), m), dtype=np.float32)
        for age in args.ages_s:
            times, faults = [], 0
            for i in range(max(3, args.reps // 10)):
                block = pool[i % len(pool)]
                block.fill(1.0)
                time.sleep(age)
                np.add(big, 1.0, out=big)
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0 = time.perf_counter_ns()
                k.numpy(block, src)
                times.append(time.perf_counter_ns() - t0)
                faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            us = float(np.median(times)) / 1e3
            print(f"{m:>10} {age:>6g} {us:>8.1f} {us / (4 * m / 4096):>9.3f} {faults:>6}")


def main(argv=None) -> None:
    from simsparse.backends.real.rank_env import as_a_rank

    if argv is None:
        as_a_rank()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=None)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--evict-mb", type=int, default=64)
    ap.add_argument("--idle-ms", type=float, nargs="*", default=[1.0, 2.0, 10.0, 50.0])
    ap.add_argument("--stack-mb", type=float, nargs="*", default=[1.5, 12.0],
                    help="MB through a loopback TCP connection before each call (a column each)")
    ap.add_argument("--sparse", action="store_true", help="the random-access sparse kernels, warm and cold")
    ap.add_argument("--aged", action="store_true", help="copy_into a block by the age of its last write")
    ap.add_argument("--ages-s", type=float, nargs="+", default=[0.0, 0.05, 0.3, 1.0, 3.0])
    ap.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.004, 0.0157, 0.05])
    args = ap.parse_args(argv)
    if args.sparse:
        args.sizes = args.sizes or [393_216, 3_145_728]
        return sparse(args)
    if args.aged:
        args.sizes = args.sizes or [393_216]
        return aged(args)
    big = np.ones(args.evict_mb * (1 << 20) // 4, dtype=np.float32)

    def evict():
        np.add(big, 1.0, out=big)
    args.sizes = args.sizes or [75_000, 250_000, 750_000, 2_500_000]
    idle = "".join(f" {f'idle {d:g} ms':>11}" for d in args.idle_ms)
    stack = "".join(f" {f'stack {x:g} MB':>13}" for x in args.stack_mb)
    carry = loopback()
    print(f"{'kernel':<10} {'n':>10} {'warm us':>9} {'GB/s':>6} {'cold us':>9} {'GB/s':>6} {'cold/warm':>9}{idle}"
          f" {'woken':>11}{stack}")
    for name in ("add_into", "copy_into", "copy", "add", "concat"):
        k = KERNELS[name]
        for m in args.sizes:
            a = _calls(name, m)
            nbytes = k.work(k.numpy(*a), *a).bytes
            warm = _median_us(k.numpy, a, args.reps)
            cold = _median_us(k.numpy, a, args.reps, evict)
            slept = "".join(f" {_median_us(k.numpy, a, args.reps, idle_s=d / 1e3):>8.1f} us" for d in args.idle_ms)
            woken = _median_us(k.numpy, a, args.reps, idle_s=max(args.idle_ms, default=10.0) / 1e3,
                               wake=_calls(name, WAKE_N))
            carried = "".join(f" {_median_us(k.numpy, a, args.reps, evict=lambda x=x: carry(x)):>10.1f} us"
                              for x in args.stack_mb)
            print(f"{name:<10} {m:>10} {warm:>9.1f} {nbytes / warm / 1e3:>6.1f} {cold:>9.1f} "
                  f"{nbytes / cold / 1e3:>6.1f} {cold / warm:>9.2f}{slept} {woken:>8.1f} us{carried}")


if __name__ == "__main__":
    main()
