"""The real backend's side of the experiment loop, one process per rank.

Run as ``mpiexec -n P python -m simsparse.experiments.run.worker POINTS.json OUT.json``
(``simsparse measure`` does this). Every point runs through the same
:func:`~.loop.run_point` as in the simulator; rank 0 writes the rows.
An iteration starts after a barrier (waited without spinning where the
wait mode allows, :func:`~simsparse.backends.real.wire.wait_mode`), or with
``SIMSPARSE_START=common`` at one instant of a common clock
(:class:`~simsparse.backends.real.start.CommonStart`); its time is the maximum
over ranks of the time the rank's main program took from its start; the reported time is the mean over
whole periods of the algorithm's periodic work, from the same iterations as
in the simulator (:mod:`.period`: the algorithm's counters skip ahead to the
kinds of iteration the measured ones miss; batches and gradients follow the
loop's position).

A training point (a schedule) runs the project's real torch model: the same
initial weights on every rank (seeded), a different synthetic batch per rank
and iteration, a real forward and backward; no optimizer step is taken (the
weights, and so the work, stay the same across iterations).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from .loop import run_point
from .measure import point_file
from ...backends.real.rank_env import reserve_heap
from ..config.point import Point


_START = None


class MPIBackend:
    name = "mpi"
    values = "full"   # real tensors, always checked
    repeats = False   # every iteration runs

    def __init__(self, point: Point, device_kind: str = "auto", trace: bool = False):
        from mpi4py import MPI
        import torch

        from ...backends.real.mpi import MPIDriver, pick_device
        from ...backends.real.start import make_start

        self.comm = comm = MPI.COMM_WORLD
        self.rank, P = comm.Get_rank(), comm.Get_size()
        if P != point.P:
            raise SystemExit(f"point wants P={point.P} ranks but mpiexec started {P}")
        self.device = device = pick_device(device_kind)
        if device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // P))
        self.point, self.trace = point, trace
        self.local_ranks, self.root = [self.rank], self.rank == 0
        self.trainer = _trainer(point, self.rank, device) if point.schedule else None
        self.driver = MPIDriver(comm, device, trace, self.trainer)
        global _START   # one per launch: what it learnt of the ranks' wake-ups carries over to the next point
        self.start = _START = make_start(comm, self.driver.rs.box, _START)
        self.workload = None if point.schedule else point.workload_obj()
        self.ranks_here = int(os.environ.get("MPI_LOCALNRANKS", P))   # Hydra's count of this host's ranks

    def gather(self, values):
        (v,) = values
        return self.comm.gather(v, root=0)

    def iteration(self, jobs, it):
        (job,) = jobs.values()
        if self.trainer is not None:
            self.trainer.batch_for(it)
            prog = job.program()
        else:
            prog = job.program(self.driver.rs.from_host(self.workload.grad(self.rank, it).copy()))
        if it == self.point.warmup and self.device.type == "cpu":   # before the first measured iteration's start
            reserve_heap(self.ranks_here)
        stats = self.driver.run(prog, self.start.wait())   # waiting ranks leave the cores to the others
        self.driver.rs.box.quiet_wait(self.comm.Ibarrier())   # (likewise before the gathers of the loop)
        self.last = (job, stats.results[0])
        return stats

    def device_label(self) -> str:
        import torch

        d = self.device
        return f"{d.type}:{torch.cuda.get_device_name(d) if d.type == 'cuda' else 'cpu'}"


def _trainer(point: Point, rank: int, device):
    import torch

    from ... import models
    from ...backends.real.mpi import Trainer

    name, bs, seed = point.model, point.batch_size, point.workload["seed"]
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = models.build(name).to(device)
    trainer = Trainer(model, lambda: models.loss(name, model, trainer.batch))

    def batch_for(it):
        gen = torch.Generator().manual_seed(hash((seed, rank, it)) & 0x7FFFFFFF)
        trainer.batch = models.example_batch(name, bs, generator=gen, device=device)

    trainer.batch_for = batch_for
    return trainer


def measure(point: Point, device_kind="auto", trace=False, dump=None, speed_probe=False) -> dict | None:
    """Run one point on COMM_WORLD; rank 0 returns {row, trace}, others None. With ``speed_probe`` the
    ranks first time the host's speed (:mod:`simsparse.compute.speed_probe`; ``host_probe_*_s``)."""
    backend = MPIBackend(point, device_kind, trace)
    probe = {}
    if speed_probe:
        from ...compute.speed_probe import across_ranks

        probe = across_ranks(backend.comm, backend.device, backend.driver.rs.sync)
    out = run_point(point, backend)
    common = backend.start.late_s is not None   # the same on every rank (SIMSPARSE_START)
    late = backend.comm.gather(backend.start.late_s, root=0) if common else None
    if dump:
        job, result = backend.last
        finals = backend.gather([job.result_dense(result)])
        if finals is not None:
            np.savez(dump, *finals)
    if out is None:
        return None
    out.row["compute"] = backend.device_label()
    out.row.update({f"host_probe_{k}": v for k, v in probe.items()})
    if common:
        out.row["start_late_s"] = max(late)   # the worst common start a rank missed (0: all began on time)
    return {"row": out.row, "trace": out.trace}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m simsparse.experiments.run.worker")
    ap.add_argument("points", help="JSON file with a list of points (all with the same P)")
    ap.add_argument("out", help="rank 0 writes point i's result as JSON to OUT.i (point_file) as it finishes")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--speed-probe", action="store_true", help="time the host's speed before each point")
    ap.add_argument("--dump-results", default=None,
                    help="folder for every rank's final result, one <point_id>.npz per point")
    args = ap.parse_args(argv)
    with open(args.points) as f:
        points = [Point.from_dict(d) for d in json.load(f)]
    for i, point in enumerate(points):  # one launch for many points amortises start-up (torch import, MPI init)
        dump = os.path.join(args.dump_results, point.point_id("mpi") + ".npz") if args.dump_results else None
        try:
            got = measure(point, args.device, args.trace, dump, args.speed_probe)
        except Exception as e:  # a failing rank ends the launch at once instead of leaving the others waiting
            _abort(f"point {i + 1} of {len(points)} ({point.algorithm}, P={point.P})", e)
        if got is not None:  # rank 0: this point's result in a file of its own, written once
            tmp = point_file(args.out, i) + ".tmp"
            with open(tmp, "w") as f:
                json.dump(got, f, default=_json_default)
            os.replace(tmp, point_file(args.out, i))


def _abort(what: str, e: Exception) -> None:
    """One line on stderr naming the rank, the point and where it failed; then MPI_Abort."""
    import traceback

    from mpi4py import MPI

    frame = traceback.extract_tb(e.__traceback__)[-1]
    print(f"rank {MPI.COMM_WORLD.Get_rank()}: {what}: {type(e).__name__}: {e} ({os.path.basename(frame.filename)}:"
          f"{frame.lineno})", file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Abort(1)


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
