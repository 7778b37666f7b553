"""The real backend: the same rank programs under ``mpiexec`` with mpi4py + torch.

Run as ``mpiexec -n P python -m simsparse.backends.mpi POINT.json OUT.json``
(``simsparse measure`` does this). Each process is one rank:

* gradient data are torch tensors (CUDA when a GPU is present and
  ``--device`` allows it, else CPU);
* ``isend`` copies the payload to one host buffer (:mod:`.wire`) and posts
  ``MPI_Isend`` on it, as the Ok-Topk code does (``.cpu().numpy()`` then
  mpi4py); ``irecv`` matches the next message of (source, tag) with
  ``MPI_Improbe`` in posting order -- sparse sizes are not known in advance --
  and receives it with ``MPI_Imrecv``;
* ``compute`` runs the kernel's torch implementation and times it,
  synchronising the device around it on a GPU;
* an iteration starts after a barrier; its time is the maximum over ranks;
  the reported time is the median over the measured iterations after warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ..compute.kernels import get_kernel
from ..ops import Compute, ContextBase, Handle, Waitall, Waitany
from . import wire


class _MPIHandle(Handle):
    __slots__ = ("req", "buf")

    def __init__(self, *a):
        super().__init__(*a)
        self.req = None
        self.buf = None


class MPIContext(ContextBase):
    def __init__(self, comm, device, trace: bool):
        from mpi4py import MPI
        import torch

        super().__init__(comm.Get_rank(), comm.Get_size())
        self.MPI, self.torch, self.comm = MPI, torch, comm
        self.device = device
        self.cuda = device.type == "cuda"
        self.trace_on = trace
        self.reset()

    def reset(self):
        self.t0 = time.perf_counter()
        self.unmatched: list[_MPIHandle] = []
        self.bytes_sent = 0
        self.msgs_sent = 0
        self.trace = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- conversions -------------------------------------------------------
    def to_host(self, t):
        return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)

    def from_host(self, a):
        t = self.torch.from_numpy(a)
        return t.to(self.device, non_blocking=False) if self.cuda else t

    # -- point-to-point ------------------------------------------------------
    def isend(self, dst, payload, tag=0):
        self._check_peer(dst)
        nb = payload.nbytes
        h = _MPIHandle("send", dst, tag, nb, self.now(), self._phase)
        h.buf = wire.pack(payload, self.to_host)
        h.req = self.comm.Isend([h.buf, self.MPI.BYTE], dst, tag)
        self.bytes_sent += nb
        self.msgs_sent += 1
        return h

    def irecv(self, src, tag=0):
        self._check_peer(src)
        h = _MPIHandle("recv", src, tag, 0, self.now(), self._phase)
        self.unmatched.append(h)
        return h

    def _match(self) -> bool:
        """Match posted receives with arrived messages, in posting order."""
        MPI, progressed, still = self.MPI, False, []
        status = MPI.Status()
        for h in self.unmatched:
            msg = self.comm.Improbe(h.peer, h.tag, status)
            if msg is None:
                still.append(h)
                continue
            h.buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            h.req = msg.Irecv([h.buf, MPI.BYTE])
            progressed = True
        self.unmatched = still
        return progressed

    def _finish(self, h: _MPIHandle):
        h.done = True
        if h.kind == "recv":
            h.value = wire.unpack(h.buf, self.from_host)
            h.nbytes = h.value.nbytes
        h.buf = None
        if self.trace_on:
            self.trace.append((self.rank, h.phase, h.kind, h.peer, h.nbytes, h.post_s, self.now()))

    def _test(self, handles) -> int:
        """Complete what has completed; return how many of ``handles`` are done."""
        self._match()
        done = 0
        for h in handles:
            if not h.done and h.req is not None and h.req.Test():
                self._finish(h)
            done += h.done
        return done

    def wait(self, handles, need: int):
        while self._test(handles) < need:
            os.sched_yield()

    # -- compute -------------------------------------------------------------
    def run_kernel(self, req: Compute):
        k = get_kernel(req.kernel)
        if self.cuda:
            self.torch.cuda.synchronize()
        start = self.now()
        out = k.torch_fn(*req.args, **req.kwargs)
        if self.cuda:
            self.torch.cuda.synchronize()
        if self.trace_on:
            self.trace.append((self.rank, self._phase, "compute:" + req.kernel, -1, 0, start, self.now()))
        return out


def drive(ctx: MPIContext, gen):
    """Run one rank program to completion; returns its result."""
    value = None
    while True:
        try:
            req = gen.send(value)
        except StopIteration as stop:
            return stop.value
        t = type(req)
        if t is Waitall:
            ctx.wait(req.handles, len(req.handles))
            value = [h.value for h in req.handles]
        elif t is Compute:
            value = ctx.run_kernel(req)
        elif t is Waitany:
            if not any(h.done for h in req.handles):
                ctx.wait(req.handles, 1)
            i = next(i for i, h in enumerate(req.handles) if h.done)
            value = (i, req.handles[i].value)
        else:
            raise TypeError(f"rank {ctx.rank} yielded {req!r}; expected ctx.waitall/waitany/compute")


def pick_device(which: str):
    import torch

    if which == "cuda" or (which == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda asked for, but torch sees no CUDA device")
        local = int(os.environ.get("MPI_LOCALRANKID", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def measure(point, device_kind="auto", trace=False, dump=None) -> dict | None:
    """Run one point on COMM_WORLD; rank 0 returns {row, trace}, others None."""
    from mpi4py import MPI
    import torch

    from ..experiments.metrics import IterationRecord, summarize
    from ..experiments.point import check_results, to_dense
    from ..experiments.runner import TRACE_COLUMNS

    comm = MPI.COMM_WORLD
    rank, P = comm.Get_rank(), comm.Get_size()
    if P != point.P:
        raise SystemExit(f"point wants P={point.P} ranks but mpiexec started {P}")
    device = pick_device(device_kind)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // P))
    ctx = MPIContext(comm, device, trace)
    alg = point.algorithm_cls(point.setup(rank), point.params_model())
    workload = point.workload_obj()
    pid = point.point_id("mpi")
    t_start = time.perf_counter()
    records, trace_rows = [], []
    correct, worst = (True if point.check else None), 0.0
    result = None
    for it in range(point.warmup + point.iterations):
        grad = ctx.from_host(workload.grad(rank, it).copy())
        comm.Barrier()
        ctx.reset()
        result = drive(ctx, alg.iteration(ctx, grad))
        if ctx.cuda:
            torch.cuda.synchronize()
        elapsed = ctx.now()
        times = comm.gather(elapsed, root=0)
        sent = comm.gather((ctx.bytes_sent, ctx.msgs_sent), root=0)
        if point.check:
            n = point.workload["n"]
            results = comm.gather(to_dense(result, n), root=0)
            inputs = comm.gather(to_dense(alg.last_input, n), root=0)
            states = comm.gather(alg.check_state(), root=0)
            if rank == 0:
                ok, err = check_results(point, inputs, results, states)
                correct, worst = correct and ok, max(worst, err)
        if trace:
            tr = comm.gather(ctx.trace, root=0)
            if rank == 0:
                trace_rows.extend(dict(zip(TRACE_COLUMNS, (pid, it, *t))) for rows in tr for t in rows)
        if rank == 0 and it >= point.warmup:
            records.append(IterationRecord(max(times), [s[0] for s in sent], [s[1] for s in sent]))
    if dump:
        finals = comm.gather(to_dense(result, point.workload["n"]), root=0)
        if rank == 0:
            np.savez(dump, *finals)
    if rank != 0:
        return None
    row = summarize(point, "mpi", records, correct, worst, time.perf_counter() - t_start)
    row["compute"] = f"{device.type}:{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
    return {"row": row, "trace": trace_rows}


def main(argv=None):
    from ..experiments.point import Point

    ap = argparse.ArgumentParser(prog="python -m simsparse.backends.mpi")
    ap.add_argument("points", help="JSON file with a list of points (all with the same P)")
    ap.add_argument("out", help="where rank 0 writes the list of results as JSON")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--dump-results", default=None,
                    help="folder for every rank's final result, one <point_id>.npz per point")
    args = ap.parse_args(argv)
    with open(args.points) as f:
        points = [Point.from_dict(d) for d in json.load(f)]
    outs = []
    for point in points:  # one launch for many points amortises start-up (torch import, MPI init)
        dump = os.path.join(args.dump_results, point.point_id("mpi") + ".npz") if args.dump_results else None
        outs.append(measure(point, args.device, args.trace, dump))
        if outs[-1] is not None:  # rank 0: save progress after every point
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(outs, f, default=_json_default)
            os.replace(tmp, args.out)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(type(o))


if __name__ == "__main__":
    sys.exit(main())
