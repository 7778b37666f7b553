"""The sparse kernels timed with every rank looping at once, against one rank at a time.

    mpiexec -n 4 python benchmarks/bench_sparse_grid_sharing.py [--n 3000000] [--densities 0.004 0.05 0.2]
        [--kernels scatter_add gather_at] [--reps 5]

Each rank is bound as ``calibrate`` binds it (rank r to core floor(2r / P) of
two), builds the kernel's inputs as ``calibrate``'s sparse grid does
(``worker._sparse_inputs``) and times the real backend's torch
implementation, by the wall clock and by the process's CPU clock:

* ``together``: every rank calls at once (the sparse grid before 79a79da);
* ``alone``: one rank at a time while the others sleep (``worker.in_turn``,
  the sparse grid now).

It prints, per kernel and density, the median over ranks of each rank's
median call, and each way's ratio to the first density: the grid's
``select_scale``. With more ranks than cores the long calls ``together`` are
time-sliced with their core's other rank, so their wall time, and the ratio,
count a sharing the simulator then models again.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--densities", type=float, nargs="+", default=[0.004, 0.05, 0.2])
    ap.add_argument("--kernels", nargs="+", default=["scatter_add", "gather_at"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import torch
    from mpi4py import MPI

    import simsparse.algorithms  # noqa: F401  (registers the algorithms' kernels)
    from simsparse.calibration.worker import _sparse_inputs, in_turn
    from simsparse.compute.kernels import get_kernel

    comm = MPI.COMM_WORLD
    rank, P = comm.Get_rank(), comm.Get_size()
    os.sched_setaffinity(0, {min((2 * rank) // P, os.cpu_count() - 1)})
    torch.set_num_threads(1)
    x = torch.randn(args.n, generator=torch.Generator().manual_seed(4321 + rank))
    if rank == 0:
        print(f"P = {P}, n = {args.n:,}; load average {os.getloadavg()[0]:.2f}")
    for name in args.kernels:
        k = get_kernel(name)
        firsts = {}
        for d in args.densities:
            inputs = _sparse_inputs(name, x, d, P)
            got = {}

            def timed(way, k=k, inputs=inputs, got=got):
                k.torch_fn(*inputs)
                wall, cpu = [], []
                for _ in range(args.reps):
                    w0, c0 = time.perf_counter(), time.process_time()
                    k.torch_fn(*inputs)
                    wall.append(time.perf_counter() - w0)
                    cpu.append(time.process_time() - c0)
                got[way] = (statistics.median(wall), statistics.median(cpu))

            comm.Barrier()
            timed("together")
            in_turn(comm, lambda: timed("alone"))
            every = comm.gather(got, root=0)
            if rank == 0:
                for way in ("together", "alone"):
                    wall = statistics.median(g[way][0] for g in every)
                    cpu = statistics.median(g[way][1] for g in every)
                    firsts.setdefault(way, wall)
                    print(f"{name:12s} d = {d:<6g} {way:8s} wall {wall * 1e3:7.2f} ms  cpu {cpu * 1e3:7.2f} ms  "
                          f"ratio to d = {args.densities[0]:g}: {wall / firsts[way]:5.1f}x")
    if rank == 0:
        print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
