"""The scheduler's time slice on this host (``core_slice_s``,
:class:`simsparse.compute.cores.SlicedCores`).

``tasks`` processes bound to one core spin for ``seconds``, each reading the
clock in a loop; a gap of more than ``GAP_S`` between two reads is a time
the process did not run. Not every gap is another task's turn: interrupts,
the network's softirq, kernel threads and the hypervisor (steal) stop a
task too, and counting each of those as the end of a slice split the
slices (medians of 1.2 to 3.9 ms on one host, p90 3.9 ms throughout). So
the runs of all tasks are laid on the core's one clock, and a task's slice
ends only where another probe task ran: the slice is the time the task ran
between two such switches (its runs summed, the interruptions left out).
Their median is the slice.
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
    runs, now = [], time.perf_counter   # CLOCK_MONOTONIC: one clock for every process
    last = begin = now()
    end = start + seconds
    while last < end:
        t = now()
        if t - last > GAP_S:
            runs.append((begin, last))
            begin = t
        last = t
    runs.append((begin, last))
    conn.send(runs)
    conn.close()


def slices(runs_of: list) -> list[float]:
    """Per task ``runs_of[i]`` (its (begin, end) runs on the shared clock):
    the CPU time of each of its turns, a turn being its runs between two runs
    of other tasks. A task's first and last turns are left out (cut by the
    common start and the end)."""
    events = sorted((b, e, i) for i, runs in enumerate(runs_of) for b, e in runs)
    turns: list[list] = [[] for _ in runs_of]
    owner = None
    for b, e, i in events:
        if i != owner:
            turns[i].append(0.0)
            owner = i
        turns[i][-1] += e - b
    return [t for ts in turns for t in ts[1:-1]]


def time_slice(tasks: int = 4, seconds: float = 0.6) -> dict | None:
    """Median, p10 and p90 of the turns (:func:`slices`) ``tasks`` spinning
    processes get on one core, and how many; None where they hardly took
    turns (a core each) or processes cannot be bound (not Linux); RuntimeError
    where a task does not report within 30 s of its spin's end."""
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
    try:   # every task reports within its spin and start; one that does not has hung (never wait forever)
        if not all(a.poll(seconds + 30.0) for a in pipes):
            raise RuntimeError(f"time_slice: a spinning task did not report within {seconds + 30:g} s")
        runs = slices([a.recv() for a in pipes])
    finally:
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join()
    if len(runs) < 8:
        return None
    r = np.asarray(runs)
    return {"median_s": float(np.median(r)), "p10_s": float(np.percentile(r, 10)),
            "p90_s": float(np.percentile(r, 90)), "runs": len(runs), "tasks": tasks}
