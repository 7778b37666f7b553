"""The host's speed at one moment: a fixed set of kernel calls, timed on
every rank at once.

Why: a profile's kernels are timed once, at calibration. On a shared
virtual machine the physical host's other tenants take caches and memory
bandwidth, and the suite's kernels later ran 0.89x to 1.14x their calibrated
time from one session to the next (docs/history/validation-journal.md, 2026-11-27), which
moves every compute-bound point by as much. This probe is a microbenchmark of
that state, not a fit to any run: the calibration runs it between its
algorithms (its reference, ``compute.speed_probe_s``), the real backend runs
it before every measured point (``host_probe_cpu_s`` / ``host_probe_wall_s``
and each call's ``host_probe_cpu_topk_s`` ... in the row), and ``validate``
predicts each point a second time with the kernels scaled by
:func:`slowdown` (``DeviceProfile.slowdown``) and the ranks' CPU by
:func:`cpu_slowdown`, beside the prediction as calibrated.

The calls are the suite's most frequent memory-bound kernels, through their
own torch implementations (:data:`CALLS`): a top-k of 1e6, an add and a copy
of 2e6 and a sparse sum of 4 blocks of 1e4 into 1e6 (a round takes about
16 ms of wall time on this host's two cores, 27 ms of CPU). Each is timed
:data:`REPS` times on the process's CPU clock and on the wall clock; a probe
is each call's median and their sum. The ranks start together after a barrier,
as in a run, so they share the cores and the memory bus as a run's ranks do.
"""
from __future__ import annotations

import functools
import time

import numpy as np

#: (kernel, elements): what one round of the probe calls
CALLS = (("topk", 1_000_000), ("add", 2_000_000), ("copy", 2_000_000), ("scatter_add", 1_000_000))
#: rounds per probe; the median of each call over them counts
REPS = 3
#: sparse blocks of the scatter_add call, and their entries each
BLOCKS, BLOCK_NNZ = 4, 10_000


@functools.lru_cache(maxsize=2)   # made once per launch: a measured point pays the calls alone
def _inputs(device):
    import torch

    from ..ops import COO

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2 * max(m for _, m in CALLS), generator=gen).to(device)
    n = dict(CALLS)["scatter_add"]
    parts = []
    for _ in range(BLOCKS):
        idx = torch.sort(torch.randperm(n, generator=gen)[:BLOCK_NNZ]).values.to(torch.int32).to(device)
        parts.append(COO(idx, torch.randn(BLOCK_NNZ, generator=gen).to(device), n))
    return {"topk": lambda m: ((x[:m], m // 100), {}),
            "add": lambda m: ((x[:m], x[m:2 * m]), {}),
            "copy": lambda m: ((x[:m],), {}),
            "scatter_add": lambda m: ((parts, m, x), {})}


def probe(device, sync=lambda: None, reps: int = REPS) -> dict[str, float]:
    """One rank's probe: ``{"cpu_s", "wall_s"}``, each the sum over :data:`CALLS` of the median call."""
    from .kernels import KERNELS

    args = _inputs(device)
    cpu, wall = {c: [] for c in CALLS}, {c: [] for c in CALLS}
    for _ in range(reps):
        for call in CALLS:
            name, m = call
            a, kw = args[name](m)
            fn = KERNELS[name].torch_fn
            sync()
            c0, w0 = time.process_time(), time.perf_counter()
            fn(*a, **kw)
            sync()
            cpu[call].append(time.process_time() - c0)
            wall[call].append(time.perf_counter() - w0)
    out = {}
    for clock, got in (("cpu", cpu), ("wall", wall)):
        med = {name: float(np.median(v)) for (name, _), v in got.items()}
        out[f"{clock}_s"] = float(sum(med.values()))
        out.update({call_key(clock, name): t for name, t in med.items()})
    return out


def call_key(clock: str, name: str) -> str:
    """A probe's field for call ``name`` on ``clock`` (a row holds it as ``host_probe_`` + this)."""
    return f"{clock}_{name}_s"


def calls_of(probe: dict, clock: str) -> dict[str, float]:
    """Each call's median in ``probe`` on ``clock``; {} for a probe made before they were kept."""
    keys = {name: call_key(clock, name) for name, _ in CALLS}
    return {name: probe[k] for name, k in keys.items()} if all(k in probe for k in keys.values()) else {}


def across_ranks(comm, device, sync=lambda: None) -> dict[str, float]:
    """Every rank probes at once (after a barrier); every rank gets the median over ranks of each clock,
    the sum (``cpu_s``, ``wall_s``) and each call (``cpu_topk_s`` ...)."""
    comm.Barrier()
    got = comm.allgather(probe(device, sync))
    return {k: float(np.median([g[k] for g in got])) for k in got[0]}


def slowdown(row: dict, compute: dict) -> float | None:
    """The measured row's probe over the profile's (in the clock the profile's kernels were timed with):
    how much slower the host ran the probe just before this point than at calibration. Where both hold
    each call's median (``speed_probe_calls_s``, ``host_probe_{clock}_{kernel}_s``), the geometric mean of
    the calls' ratios, each call counting once: the sum of their times is nine tenths the top-k's, the
    call that moves least with the host's memory (4-rank launches a few seconds apart: top-k of 1e6
    within 5 %, a copy and an add of 3e6 within 11 %, count_above of 3e6 within 16 %, together). Else the
    sums' ratio. None where either is missing (a profile or a measurement made before the probe). It
    scales the kernels and layers; :func:`cpu_slowdown` the ranks' and the stack's CPU."""
    ref, clock = compute.get("speed_probe_s"), compute.get("speed_probe_clock")
    if not clock:
        return None
    calls = compute.get("speed_probe_calls_s") or {}
    ratios = [_ratio(row.get("host_probe_" + call_key(clock, name)), t) for name, t in calls.items()]
    if calls and all(r is not None for r in ratios):
        return float(np.exp(np.mean(np.log(ratios))))
    return _ratio(row.get(f"host_probe_{clock}_s"), ref)


def cpu_slowdown(row: dict, compute: dict) -> float | None:
    """The slowdown of the ranks' own CPU work and the network stack's (syscalls, small working sets): the
    top-k call's ratio where both sides hold it, the compute-bound call of the probe; else :func:`slowdown`."""
    clock = compute.get("speed_probe_clock")
    ref = (compute.get("speed_probe_calls_s") or {}).get("topk")
    got = _ratio(row.get("host_probe_" + call_key(clock, "topk")), ref) if clock and ref else None
    return got if got is not None else slowdown(row, compute)


def _ratio(now, ref) -> float | None:
    try:
        ref, now = float(ref), float(now)
    except (TypeError, ValueError):
        return None
    return now / ref if ref > 0 and now > 0 and np.isfinite(now) else None
