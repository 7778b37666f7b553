"""The real backend's own overhead: dense ``ring`` and ``rabenseifner``
against mpi4py's ``Allreduce`` on the same ranks and sizes.

    python benchmarks/bench_mpi_overhead.py [--P 2 3 4] [--sizes 16384 65536 1048576 4194304]
        [--iters 10] [--warmup 3] [--save FILE.json] [--compare BEFORE.json] [--no-breakdown]

One ``mpiexec -n P`` launch per P runs this file with ``--worker``; P larger
than the number of cores oversubscribes them (the table says so). Every
figure is the median over ``--iters`` iterations after ``--warmup``; each
iteration starts after a barrier and its time is the maximum over ranks.
Columns, float32 vectors of n entries:

* ``Allreduce``: ``comm.Allreduce`` on numpy buffers; ``torch``: the same
  on torch CPU tensors' numpy views;
* ``floor``: 2(P-1) blocking ``Sendrecv`` of n/P entries in pure Python (a
  ring's messages, no arithmetic); ``py-ring``: a pure mpi4py + torch ring
  allreduce (copy, Sendrecv into a preallocated buffer, ``add_``/``copy_``),
  the floor of any Python-level ring;
* ``ring``, ``rabenseifner``: the project's real backend, run exactly as
  ``simsparse measure`` runs a point (``MPIBackend`` + ``run_point``, check
  off), and the ratio to ``Allreduce``.

The breakdown (P = 2 only, rank 0, the ``ring``) times the driver's parts
with wrapped functions, each charged its own (exclusive) time: packing,
unpacking, matching, polling/testing, the device (kernels), idle waits, and
the rest (generator stepping, posting, bookkeeping).
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

ROOT = Path(__file__).resolve().parents[1]
NET = {"model": "alphabeta", "alpha_s": 1e-6, "bandwidth_Bps": 1e10, "eager_threshold_B": 65536}


# -- worker side (one process per rank) ------------------------------------------------
def _median_max(comm, fn, iters, warmup) -> float:
    from mpi4py import MPI

    ts = []
    for i in range(warmup + iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= warmup:
            ts.append(dt)
    return float(np.median(ts))


def _references(comm, n, iters, warmup) -> dict:
    import torch
    from mpi4py import MPI

    P, r = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(r)
    a = rng.standard_normal(n, dtype=np.float32)
    out = np.empty_like(a)
    ta, tout = torch.from_numpy(a.copy()), torch.empty(n)
    res = {"allreduce": _median_max(comm, lambda: comm.Allreduce(a, out, op=MPI.SUM), iters, warmup),
           "allreduce_torch": _median_max(comm, lambda: comm.Allreduce(ta.numpy(), tout.numpy(), op=MPI.SUM),
                                          iters, warmup)}
    b = [n * i // P for i in range(P + 1)]
    right, left = (r + 1) % P, (r - 1) % P
    rbuf = torch.empty(max(b[i + 1] - b[i] for i in range(P)))

    def seg(t, i):
        return t[b[i]:b[i + 1]]

    def floor():
        for s in range(P - 1):  # reduce-scatter's messages, then the allgather's
            i, j = (r - s) % P, (r - s - 1) % P
            comm.Sendrecv(seg(a, i), right, 0, rbuf.numpy()[:b[j + 1] - b[j]], left, 0)
        for s in range(P - 1):
            i, j = (r + 1 - s) % P, (r - s) % P
            comm.Sendrecv(seg(a, i), right, 0, rbuf.numpy()[:b[j + 1] - b[j]], left, 0)

    def py_ring():
        buf = ta.clone()
        for s in range(P - 1):
            i, j = (r - s) % P, (r - s - 1) % P
            got = rbuf[:b[j + 1] - b[j]]
            comm.Sendrecv(seg(buf, i).numpy(), right, 0, got.numpy(), left, 0)
            seg(buf, j).add_(got)
        for s in range(P - 1):
            i, j = (r + 1 - s) % P, (r - s) % P
            got = rbuf[:b[j + 1] - b[j]]
            comm.Sendrecv(seg(buf, i).numpy(), right, 0, got.numpy(), left, 0)
            seg(buf, j).copy_(got)
        return buf

    res["floor"] = _median_max(comm, floor, iters, warmup)
    res["py_ring"] = _median_max(comm, py_ring, iters, warmup)
    expect = comm.allreduce(a.astype(np.float64), op=MPI.SUM)
    assert np.allclose(py_ring().numpy(), expect, atol=1e-3), "py-ring gives a wrong sum"
    return res


def _point(alg, P, n, iters, warmup):
    from simsparse.experiments.config.point import Point

    return Point(algorithm=alg, P=P, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
                 network=NET, iterations=iters, warmup=warmup, check=False)


def _real(alg, P, n, iters, warmup) -> float | None:
    from simsparse.experiments.run.loop import run_point
    from simsparse.experiments.run.worker import MPIBackend

    point = _point(alg, P, n, iters, warmup)
    out = run_point(point, MPIBackend(point, "cpu"))
    return None if out is None else out.row["time_s"]


#: (label, owner, attribute): the driver's parts, each wrapped to charge its
#: exclusive time (names of this version and of the one before it; missing ones are skipped)
_D, _B = "simsparse.backends.real.mpi:MPIDriver", "simsparse.backends.real.wire:Mailbox"
PARTS = [("pack", "simsparse.backends.real.wire", "pack"), ("unpack", "simsparse.backends.real.wire", "unpack"),
         ("match (Improbe, receive)", _D, "_match"), ("match (Improbe, receive)", _B, "_match"),
         ("match (Improbe, receive)", _B, "_take"),
         ("test, wake", _D, "_poll"), ("test, wake", _D, "_progress"),
         ("device (kernels)", _D, "_device"),
         ("idle (wait in MPI / yield)", _D, "_idle"), ("idle (wait in MPI / yield)", "os", "sched_yield")]


def _breakdown(comm, n, iters, warmup) -> dict:
    """Exclusive time per part of the driver, per iteration (rank 0's)."""
    import importlib

    from simsparse.experiments.run.loop import AlgorithmJob
    from simsparse.experiments.run.worker import MPIBackend

    totals: dict[str, float] = {}
    stack: list[list] = []  # [label, start, time of children]

    def wrap(label, fn):
        def timed(*a, **kw):
            stack.append([label, time.perf_counter(), 0.0])
            try:
                return fn(*a, **kw)
            finally:
                lab, t0, inner = stack.pop()
                dt = time.perf_counter() - t0
                totals[lab] = totals.get(lab, 0.0) + dt - inner
                if stack:
                    stack[-1][2] += dt
        return timed

    saved = []
    for label, owner, attr in PARTS + [("run", _D, "run")]:
        mod, _, cls = owner.partition(":")
        obj = importlib.import_module(mod)
        obj = getattr(obj, cls, None) if cls else obj
        if obj is not None and attr in vars(obj):
            saved.append((obj, attr, vars(obj)[attr]))
            setattr(obj, attr, wrap(label, getattr(obj, attr)))
    try:
        point = _point("ring", comm.Get_size(), n, iters, warmup)
        backend = MPIBackend(point, "cpu")
        jobs = {backend.rank: AlgorithmJob(point, backend.rank)}
        for it in range(warmup + iters):
            if it == warmup:
                totals.clear()
            backend.iteration(jobs, it)
    finally:
        for obj, attr, fn in saved:
            setattr(obj, attr, fn)
    run = totals.pop("run", 0.0)
    out = {k: v / iters for k, v in totals.items()}
    out["rest (stepping, posting)"] = run / iters
    out["total"] = sum(out.values())
    return out


def worker(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    rows, parts = [], {}
    for n in args.sizes:
        row = {"P": P, "n": n, **_references(comm, n, args.iters, args.warmup)}
        for alg in ("ring", "rabenseifner"):
            row[alg] = _real(alg, P, n, args.iters, args.warmup)
        rows.append(row)
        if P == 2 and args.breakdown:
            parts[n] = _breakdown(comm, n, args.iters, args.warmup)
    if comm.Get_rank() == 0:
        Path(args.out).write_text(json.dumps({"rows": rows, "breakdown": parts}))


# -- launcher side -----------------------------------------------------------------------
def _ms(x):
    return "-" if x is None else f"{x * 1e3:8.3f}"


def _ratio(x, ref):
    return "-" if x is None or not ref else f"{x / ref:6.2f}x"


def table(rows, cores, title):
    print(f"\n{title} (ms, median; ratio = real / Allreduce)")
    print(f"{'P':>2} {'n':>8} | {'Allreduce':>9} {'torch':>8} {'floor':>8} {'py-ring':>8} | "
          f"{'ring':>8} {'ratio':>7} | {'rabens.':>8} {'ratio':>7}")
    for r in rows:
        over = " oversubscribed" if r["P"] > cores else ""
        print(f"{r['P']:>2} {r['n']:>8} | {_ms(r['allreduce']):>9} {_ms(r['allreduce_torch'])} {_ms(r['floor'])} "
              f"{_ms(r['py_ring'])} | {_ms(r['ring'])} {_ratio(r['ring'], r['allreduce']):>7} | "
              f"{_ms(r['rabenseifner'])} {_ratio(r['rabenseifner'], r['allreduce']):>7}{over}")


def compare(before, after):
    print("\nbefore -> after (ms; ratio to Allreduce)")
    old = {(r["P"], r["n"]): r for r in before["rows"]}
    for r in after["rows"]:
        b = old.get((r["P"], r["n"]))
        if b is None:
            continue
        cells = [f"{a}: {_ms(b[a]).strip()} -> {_ms(r[a]).strip()} ({_ratio(b[a], b['allreduce']).strip()} -> "
                 f"{_ratio(r[a], r['allreduce']).strip()})" for a in ("ring", "rabenseifner")]
        print(f"P={r['P']} n={r['n']:>8}  " + "   ".join(cells))


def breakdown_table(parts):
    if not parts:
        return
    print("\nwhere the driver's time goes: P = 2, rank 0, ring, ms per iteration (exclusive; instrumented)")
    labels = sorted({k for p in parts.values() for k in p} - {"total"})
    print(f"{'part':>26} " + " ".join(f"{int(n):>10}" for n in parts))
    for lab in labels + ["total"]:
        print(f"{lab:>26} " + " ".join(f"{p.get(lab, 0.0) * 1e3:10.3f}" for p in parts.values()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16384, 65536, 1048576, 4194304])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    ap.add_argument("--save", help="write the results as JSON")
    ap.add_argument("--compare", help="a JSON file from --save to print side by side")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT))
    from simsparse.experiments.run.measure import find_mpiexec

    cores = os.cpu_count() or 1
    result = {"rows": [], "breakdown": {}, "load": [os.getloadavg()[0]]}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # as simsparse measure
    with tempfile.TemporaryDirectory() as td:
        for P in args.P:
            out = os.path.join(td, f"P{P}.json")
            cmd = [find_mpiexec(), "-n", str(P), sys.executable, __file__, "--worker", "--out", out,
                   "--iters", str(args.iters), "--warmup", str(args.warmup), "--sizes", *map(str, args.sizes)]
            if not args.breakdown:
                cmd.append("--no-breakdown")
            subprocess.run(cmd, check=True, env=env, cwd=ROOT)
            got = json.loads(Path(out).read_text())
            result["rows"] += got["rows"]
            result["breakdown"].update(got["breakdown"])
    result["load"].append(os.getloadavg()[0])
    table(result["rows"], cores, f"dense allreduce of n float32, {cores} cores, load average "
          f"{result['load'][0]:.2f} before and {result['load'][1]:.2f} after")
    breakdown_table(result["breakdown"])
    if args.compare:
        compare(json.loads(Path(args.compare).read_text()), result)
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
