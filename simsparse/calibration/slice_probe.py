"""The scheduler's time slice on this host (``core_slice_s``,
:class:`simsparse.compute.cores.SlicedCores`).

``tasks`` processes bound to one core spin for ``seconds``, each reading the
clock in a loop; a gap of more than ``GAP_S`` between two reads is a time
the process did not run (another had the core). The lengths of the runs
between gaps are the slices the scheduler gave; their median is the slice.
Linux's EEVDF gives 0.75 ms x (1 + log2 CPUs) by default and ends a slice
at the tick, so the median sits between that and the next tick. This is
what a rank of the testbed gets when it computes while others on its core
also compute.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np

#: a gap this long between two clock reads means the process did not run (a loop step takes < 1 us)
GAP_S = 50e-6


def _spin(core: int, seconds: float, start: float, conn) -> None:
    os.sched_setaffinity(0, {core})
    while time.perf_counter() < start:   # every task spins from one instant
        pass
    runs, now = [], time.perf_counter
    last = begin = now()
    end = start + seconds
    while last < end:
        t = now()
        if t - last > GAP_S:
            runs.append(last - begin)
            begin = t
        last = t
    conn.send(runs[1:])   # the first run began at the common start, not at a slice
    conn.close()


def time_slice(tasks: int = 4, seconds: float = 0.6) -> dict | None:
    """Median, p10 and p90 of the runs ``tasks`` spinning processes get on
    one core, and how many; None where no run was interrupted (a core each)
    or processes cannot be bound (not Linux)."""
    if not hasattr(os, "sched_setaffinity") or tasks < 2:
        return None
    core = min(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    start = time.perf_counter() + 0.2
    pipes, procs = [], []
    for _ in range(tasks):
        a, b = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_spin, args=(core, seconds, start, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    runs = [r for a in pipes for r in a.recv()]
    for p in procs:
        p.join()
    if len(runs) < 8:
        return None
    r = np.asarray(runs)
    return {"median_s": float(np.median(r)), "p10_s": float(np.percentile(r, 10)),
            "p90_s": float(np.percentile(r, 90)), "runs": len(runs), "tasks": tasks}
