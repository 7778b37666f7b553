"""CPU use of ranks that wait for the network, and whether a bandwidth-bound
collective on an emulated cluster takes the time its links allow.

    python benchmarks/bench_wait.py [--P 4 8] [--modes yield spin poll] [--n 4000000] [--rate 12.5e6]
        [--iters 3] [--testbed SPEC.yaml]

Needs root (the testbed) and the [mpi] extra. For each P and each wait mode
(``SIMSPARSE_WAIT``: ``spin`` waits inside MPI, ``yield`` polls and gives the
core away, as the real backend did with more ranks than cores; ``poll``
sleeps in ``select`` on the rank's sockets, what ``measure --testbed`` uses),
one ``mpiexec -n P`` launch on a star testbed (jumbo frames, every host link
at ``--rate`` bytes/s) runs, as ``simsparse measure`` does:

* **waiting**: rank 0 sends 4 MB to rank 1; ranks 2..P-1 wait for a 4-byte
  message rank 0 sends after it. The CPU use of a waiting rank is its CPU
  seconds (``getrusage``) over the wall time; that of the receiving rank 1
  (waiting too, while its message arrives) is printed beside it;
* **ring**: the project's ``ring`` allreduce of ``--n`` float32 (the real
  backend, ``run_point``), median of ``--iters`` iterations after one warm-up,
  against the link bound ``bytes_sent_max / goodput`` (goodput: the line
  rate times (mtu-52)/(mtu+38)), and the mean CPU use per rank.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(n: int, iters: int, out: str) -> None:
    import numpy as np
    from mpi4py import MPI

    sys.path.insert(0, str(ROOT / "tests"))
    from simsparse.experiments.run.loop import run_point
    from simsparse.experiments.config.point import Point
    from simsparse.experiments.run.worker import MPIBackend

    comm = MPI.COMM_WORLD
    rank, P = comm.Get_rank(), comm.Get_size()
    point = Point(algorithm="ring", P=P, params={}, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
                  network={"model": "alphabeta"}, compute=None, iterations=iters, warmup=1, check=False)
    backend = MPIBackend(point, "cpu")
    box = backend.driver.rs.box
    # waiting ranks: 2..P-1 wait for rank 0's small message, sent after 4 MB to rank 1
    big, small = np.zeros(4 << 20, np.uint8), np.zeros(4, np.uint8)
    box.quiet_wait(comm.Ibarrier())
    t0, c0 = time.perf_counter(), _cpu()
    if rank == 0:
        box.quiet_wait(comm.Isend(big, 1))
        for r in range(2, P):
            comm.Send(small, r)
    elif rank == 1:
        box.quiet_wait(comm.Irecv(big, 0))
    else:
        box.quiet_wait(comm.Irecv(small, 0))
    wait = (time.perf_counter() - t0, _cpu() - c0)
    box.quiet_wait(comm.Ibarrier())
    t0, c0 = time.perf_counter(), _cpu()
    outcome = run_point(point, backend)
    ring = (time.perf_counter() - t0, _cpu() - c0)
    got = comm.gather({"wait": wait, "ring": ring}, root=0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"ranks": got, "row": outcome.row}, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--P", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--modes", nargs="+", default=["yield", "spin", "poll"])
    ap.add_argument("--n", type=int, default=4_000_000)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--rate", type=float, default=12.5e6, help="host link line rate, bytes/s")
    ap.add_argument("--worker", nargs=3, metavar=("N", "ITERS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(int(args.worker[0]), int(args.worker[1]), args.worker[2])
        return
    from simsparse.experiments.run.measure import find_mpiexec
    from simsparse.network.spec import EthernetSpec
    from simsparse.testbed import Testbed

    spec = EthernetSpec(name="bench-wait", topology="star", link_bw_Bps=args.rate, framing="tcp", mtu_B=9000)
    goodput = spec.payload_rate()
    print(f"load average before: {open('/proc/loadavg').read().split()[:3]}; {os.cpu_count()} cores; "
          f"star, {args.rate * 8 / 1e6:g} Mb/s links, goodput {goodput / 1e6:.2f} MB/s; ring of n = {args.n:.3g}")
    print(f"{'P':>3} {'mode':>6} {'waiting rank CPU':>17} {'receiver CPU':>13} {'ring time':>10} {'link bound':>10} "
          f"{'ratio':>6} {'ring CPU/rank':>13}")
    for P in args.P:
        for mode in args.modes:
            with Testbed(spec, P) as tb, tempfile.TemporaryDirectory() as td:
                out = os.path.join(td, "out.json")
                cmd = [find_mpiexec(), "-n", str(P)] + tb.wrap([sys.executable, __file__, "--worker", str(args.n),
                                                               str(args.iters), out])
                env = {**os.environ, **tb.env, "SIMSPARSE_WAIT": mode, "OMP_NUM_THREADS": "1"}
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                if proc.returncode != 0:
                    print(f"{P:>3} {mode:>6} failed: {proc.stderr.strip()[-300:]}")
                    continue
                res = json.load(open(out))
            ranks, row = res["ranks"], res["row"]
            waiting = [r["wait"][1] / r["wait"][0] for r in ranks[2:]] or [float("nan")]
            ring_cpu = sum(r["ring"][1] / r["ring"][0] for r in ranks) / P
            bound = row["bytes_sent_max"] / goodput
            recv = ranks[1]["wait"][1] / ranks[1]["wait"][0]
            print(f"{P:>3} {mode:>6} {sum(waiting) / len(waiting):>16.0%} {recv:>13.0%} {row['time_s']:>9.3f}s "
                  f"{bound:>9.3f}s {row['time_s'] / bound:>6.2f} {ring_cpu:>13.0%}", flush=True)
    print(f"load average after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
