"""The microbenchmarks of ``simsparse calibrate``, one process per rank under
``mpiexec`` (``python -m simsparse.calibration.worker SPEC.json OUT.json``).

Everything goes through the real backend's own paths, so the profile
describes what ``simsparse measure`` pays:

* **point-to-point**, rank programs driven by :class:`~simsparse.backends.real.mpi.MPIDriver`
  (payload packing, ``Isend``, ``Improbe`` matching, unpacking): ping-pong
  half round trips across sizes (latency, bandwidth, the eager/rendezvous
  switch); a window of small messages (LogGP g, and o at the sender: the
  time ``isend`` takes; o at the receiver: completing already-arrived
  messages); under concurrent traffic, every rank streaming to a partner at
  once and all ranks sending to rank 0 (incast);
* **kernels**: every kernel that the algorithms and schedules call, timed as
  the real backend runs them, by running each registered algorithm (and the
  schedules' packing) on this backend at calibration sizes with a timing
  wrapper around every kernel's torch implementation; each call is recorded
  with its work (elements, bytes); and the sparse kernels on their own
  over a grid of sizes and densities (:func:`sparse_grid`), since their
  time at one size moves with the entries they select or scatter; and the
  dense collectives' streaming kernels right after their rank slept
  (:func:`idle_grid`), as a rank that waited on the network runs them;
* **layers**: the torch models' forward pass and the time at which each
  parameter's gradient is ready in the backward pass, on every rank at once
  (as in a measured run).

Rank 0 writes the raw timings as JSON; :mod:`simsparse.calibration` fits them.
Sizes, densities and seeds differ from the validation suites': a profile is
never fitted to the runs it predicts.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from ..backends.real.rank_env import host_cores, release_heap
from ..backends.real.wire import SocketSleep
from ..compute import speed_probe
from . import patterns, stack_probe
from .patterns import EXCHANGE_STEPS, STEADY_MAX_B, STEADY_STEPS
from .probes import KernelProbe, PathProbe, StepProbe


def _median(xs):
    return float(np.median(xs))


#: sweeps over the exchange sizes (three timings per size in each; the median is over all of them)
EXCHANGE_ROUNDS = 3


def p2p(driver, comm, sizes, reps, quick, exchange_sizes=(), concurrency_sizes=(1 << 16, 1 << 20),
        late_sizes=(), path_calls: bool = True, stack: bool = False) -> dict:
    from mpi4py import MPI

    from ..backends.real.start import make_start
    from ..ops import Dense

    rs = driver.rs
    torch = rs.torch

    def maker(nbytes):
        t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=rs.device)
        return lambda: Dense(t)

    def run(prog, repeat=5):
        """The program's own result on this rank, per repetition."""
        vals = []
        for _ in range(repeat):
            rs.box.quiet_wait(comm.Ibarrier())
            vals.append(driver.run(prog).results[0])
        return vals

    start = make_start(comm, rs.box)

    def span(prog, repeat=5):
        """Per repetition, the time from the start (as the suite's iterations start: a barrier, or a
        common instant) until the last rank finished."""
        vals = []
        for _ in range(repeat):
            fin = driver.run(prog, start.wait()).finish_s[0]
            rs.box.quiet_wait(comm.Ibarrier())
            vals.append(comm.allreduce(fin, op=MPI.MAX))
        return vals

    out = {"pingpong": [], "exchange": [], "window": [], "pairs": [], "crossing": [], "incast": []}
    path = PathProbe(calls=path_calls)   # the path of these back-to-back messages: what alpha leaves out
    path.active = True
    for m in sizes:
        mk = maker(m)
        n = max(3, reps if m <= 1 << 16 else reps // 4)
        t = run(lambda c, mk=mk, n=n: patterns.pingpong(c, mk, n))
        out["pingpong"].append((4 * max(1, m // 4), _median(t) if rs.rank == 0 else None))
    if exchange_sizes:   # libfabric connects to a peer on its first message: not inside a timed exchange
        span(lambda c, mk=maker(4): patterns.exchange(c, mk, 1), repeat=1)
    # the sizes in EXCHANGE_ROUNDS sweeps, alternately up and down, so a slow stretch of this
    # machine (minutes long here) lands on every size a little rather than on a few entirely
    def steps(mk, n, pattern=patterns.exchange):
        """Three timings of an n-step exchange (or ``pattern``), per step."""
        return [v / n for v in span(lambda c: pattern(c, mk, n), repeat=3)]

    got: dict = {m: [] for m in exchange_sizes}
    steady: dict = {m: [] for m in exchange_sizes if m <= STEADY_MAX_B}
    a2a: dict = {m: [] for m in steady} if comm.Get_size() > 2 else {}
    for k in range(EXCHANGE_ROUNDS if exchange_sizes else 0):
        for m in (exchange_sizes if k % 2 == 0 else exchange_sizes[::-1]):
            mk = maker(m)
            got[m] += steps(mk, EXCHANGE_STEPS if m <= 1 << 20 else 1)
            if m in steady:   # not in the path: its steps are the hot ones that the pingpong's are not
                path.active = False
                steady[m] += steps(mk, STEADY_STEPS)
                if m in a2a:
                    a2a[m] += steps(mk, STEADY_STEPS, patterns.alltoall)
                path.active = True
    out["exchange"] = [(4 * max(1, m // 4), _median(v)) for m, v in got.items()]
    out["exchange_steady"] = [(4 * max(1, m // 4), _median(v)) for m, v in steady.items()]
    out["alltoall_steady"] = [(4 * max(1, m // 4), _median(v)) for m, v in a2a.items()]
    path.active = False
    out["path"] = path.gathered(comm)
    path.close()
    for m in (4, 64, 1024):
        mk, count = maker(m), 64 if quick else 256
        vals = run(lambda c, mk=mk, count=count: patterns.window(c, mk, count))
        recv = comm.bcast(_median(vals) if rs.rank == 1 else None, root=1)
        out["window"].append((m, recv, _median(vals) if rs.rank == 0 else None))
    for m in concurrency_sizes:
        mk, count = maker(m), 4
        out["pairs"].append((m, _median(span(lambda c, mk=mk, count=count: patterns.pairs(c, mk, count))) / count))
        out["crossing"].append((m, _median(span(lambda c, mk=mk, count=count: patterns.crossing(c, mk, count)))
                                / count))
        out["incast"].append((m, _median(span(lambda c, mk=mk: patterns.incast(c, mk)))))
    if late_sizes:
        out["late"] = late_receiver(comm, rs.box, late_sizes)
    if stack:   # a TCP fabric: what the host's network stack costs beside the ranks (calibration.stack_probe)
        out["stack"] = stack_probe.stream(comm, rs.box)
    return out


def late_receiver(comm, box, sizes, reps: int = 2) -> list:
    """How much of a message crosses before its receive is posted: rank 0
    sends m bytes, rank 1 posts the receive ``late_s`` later (past m / B at
    the description's payload rate), without calling MPI meanwhile, and
    times the receive from its post. A transport that waits for the receive
    (rendezvous) takes m / B after it; one whose receiver buffers (TCP's
    receive window) takes only a copy. The last of ``reps`` counts: the
    first may find the socket's buffer not yet grown. Raw MPI, not a rank
    program: the point is the transport, with nobody progressing it.
    Every rank returns rank 1's ``(m, late_s, receive_s)`` per size."""
    out = []
    for m, late_s in sizes:
        buf = np.ones(max(1, m // 4), np.float32)
        t = None
        for rep in range(reps):
            box.quiet_wait(comm.Ibarrier())
            if comm.rank == 0:
                req = comm.Isend(buf, 1, tag=7000 + rep)
                box.quiet_wait(req)
            elif comm.rank == 1:
                time.sleep(late_s)
                t0 = time.perf_counter()
                box.quiet_wait(comm.Irecv(buf, 0, tag=7000 + rep))
                t = time.perf_counter() - t0
        out.append((4 * max(1, m // 4), late_s, t))
    box.quiet_wait(comm.Ibarrier())
    return [tuple(r) for r in comm.bcast(out if comm.rank == 1 else None, root=1)]


# -- kernels -------------------------------------------------------------------------

def clock(kind: str):
    """The clock a kernel or layer is timed with: ``wall`` (``perf_counter``) or ``cpu``, this process's CPU
    time (user + system: what a call costs its rank in core-seconds while other ranks share the cores)."""
    return time.process_time if kind == "cpu" else time.perf_counter


#: iterations each algorithm runs before its kernels count as steady: the rank's heap grows over the
#: first ones (a kernel that allocates 2 x 96 MB at 1.2e7 elements faulted in every one of three calls,
#: 140 ms each against 68 ms once the heap stopped growing); the calls are all recorded, and the fit
#: keeps the clean ones (:func:`simsparse.calibration.steady_calls`)
WARMUP = 3


#: the density of the algorithm runs of :func:`kernels` (their workload): a point of the sparse grid, and
#: none of the validation suites' (tests/backends/test_calibration.py holds it to that)
RUN_DENSITY = 0.004
#: the densities (Work.select / Work.elems) at which :func:`sparse_grid` times the sparse kernels: a
#: grid on both sides of torch's CPU top-k switch from a heap of k (k <= n / 64) to an in-place
#: selection, up to what a scatter-add of P selections reaches (P d / (1 + P d): 0.29 at P = 8 and
#: d = 0.05), holding none of the validation suites' densities (0.001, 0.01, 0.05)
SELECT_DENSITIES = (0.0003, 0.0007, 0.0015, 0.004, 0.008, 0.014, 0.02, 0.04, 0.1, 0.2, 0.4)
#: :func:`sparse_grid`'s calls a round, densities and timing ranks, for a full calibration and a quick one: every
#: other density (still around :data:`RUN_DENSITY` on both sides), two calls a round, the first rank alone (its cold
#: calls each write twice the last-level cache first, 60 ms on a host that reports 480 MiB: most of its time)
GRID = {False: (5, SELECT_DENSITIES, None), True: (2, SELECT_DENSITIES[::2], 1)}


def kernels(comm, device_kind, sizes, quick, now=time.perf_counter,
            path_calls: bool = True) -> tuple[list, dict, list, list]:
    """Run every algorithm at the calibration sizes on this backend; record its
    kernels (:class:`KernelProbe`), its programs' own CPU (:class:`StepProbe`),
    its messages' send and receive path (:class:`PathProbe`) and, before each
    algorithm, the host's speed (:mod:`simsparse.compute.speed_probe`)."""
    from ..algorithms import ALGORITHMS
    from ..experiments.run.loop import run_point
    from ..experiments.config.point import Point
    from ..experiments.run.worker import MPIBackend

    P = comm.Get_size()
    # installed first: the step probe's isend then leaves out the path probe's own time too
    path = PathProbe(now, path_calls)
    probe, steps = None, StepProbe(now)
    calls, speed = [], []
    for name, cls in sorted(ALGORITHMS.items()):
        speed.append(None)   # the host's speed between the algorithms: the measured points' reference
        for n in sizes:
            params = {"error_feedback": True} if "error_feedback" in cls.Params.model_fields else {}
            if cls.check_setup(P, n, cls.Params.model_validate(params)):
                continue
            pt = Point(algorithm=name, P=P, params=params, network={"model": "alphabeta"}, compute=None,
                       workload={"n": n, "density": RUN_DENSITY, "dtype": "float32", "seed": 1234,
                                 "drift": 0.2},
                       iterations=2, warmup=WARMUP, check=False)
            backend = MPIBackend(pt, device_kind)
            if speed[-1] is None:   # (compute.speed_probe; every rank at once, as before a measured point)
                speed[-1] = speed_probe.across_ranks(comm, backend.device, backend.driver.rs.sync)
            if probe is None:
                probe = KernelProbe(backend.driver.rs.sync, now)
            probe.rank = backend.driver.rs
            probe.active = steps.active = path.active = True
            run_point(pt, backend)
            probe.active = steps.active = path.active = False
        release_heap()   # each algorithm starts from a heap of what is live, as a launch of its own would
    steps.close()
    path.close()
    if probe is not None:
        calls = probe.calls
        probe.close()
    return calls, {**steps.summary(), "kernel_calls": len(calls)}, path.gathered(comm), [v for v in speed if v]


def _sparse_inputs(name: str, x, d: float, parts: int):
    """The arguments of sparse kernel ``name`` on ``x`` at density ``d``
    (the entries it selects, finds or scatters over its elements,
    ``Work.select``): top-k's and the k-th value's k, the threshold that
    d n entries pass, a vector with d n nonzeros to sparsify, d n values to
    scatter into a dense one, or ``parts`` sparse vectors with d n / (1 - d)
    entries in all (what a rank scatters after an allgather of the parts'
    selections)."""
    import torch

    from ..ops import COO

    n = len(x)
    k = max(1, int(round(d * n)))
    if name in ("topk", "kth_abs"):
        return (x, k)
    if name == "threshold_select":
        return (x, float(torch.topk(x.abs(), k, sorted=False).values.min()))
    gen = torch.Generator().manual_seed(k)
    if name in ("sparsify", "scatter_values", "gather_at"):   # k entries at random places of n
        idx = torch.sort(torch.randperm(n, generator=gen)[:k].to(x.device)).values
        if name == "gather_at":
            return (x, idx.to(torch.int32))
        if name == "scatter_values":
            return (idx.to(torch.int32), x[:k].clone(), n, x)
        dense = torch.zeros_like(x)
        dense[idx] = x[:k]
        return (dense,)
    each = max(1, int(round(d * n / (1 - d) / parts)))
    return ([COO(torch.sort(torch.randperm(n, generator=gen)[:each].to(x.device)).values.to(torch.int32),
                 x[:each].clone(), n) for _ in range(parts)], n, x)


#: the sparse kernels :func:`sparse_grid` times on their own: those whose time at one size moves with the
#: entries they keep, find, scatter or gather (``Work.select``)
SPARSE_KERNELS = ("topk", "threshold_select", "scatter_add", "kth_abs", "sparsify", "scatter_values", "gather_at")


#: the sparse kernels that read or write entries at random places of a dense vector: :func:`sparse_grid`
#: times each of their calls with that vector out of the caches (:func:`evictor`), as an algorithm run
#: meets it (other phases, messages and ranks ran since it was last touched). Back to back, the grid
#: measured what the vector costs in the caches and nothing of its refill, which moves with the entries
#: moved: on this project's 2-core VM (32 MiB last-level cache) a gather of 3.1M at density 0.001 took
#: 14 to 45 us warm and 239 to 308 us cold, at 0.05 0.54 to 0.84 and 1.51 to 1.55 ms (two runs of
#: python benchmarks/bench_cache_residency.py --sparse)
COLD_KERNELS = ("scatter_add", "scatter_values", "gather_at")


def llc_bytes() -> int | None:
    """The CPU's last-level cache (Linux sysfs: the highest cache index of cpu0), in bytes, or None."""
    import glob

    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"), reverse=True):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    return None


def evictor(device, threads: int | None = None):
    """A function that writes twice the device's last-level cache (the CPU's
    from sysfs, a GPU's L2; 64 MiB where unknown), so that the next call
    finds its operands out of it. On the CPU it writes with ``threads``
    (default: every core of this process's; the callers time one rank while
    the others sleep) and gives the rank its own thread count back: on a
    host whose cache reads 480 MiB, one thread wrote its 960 MiB in 120 ms,
    two in 62."""
    import torch

    if device.type == "cuda":
        size = torch.cuda.get_device_properties(device).L2_cache_size
    else:
        size = llc_bytes()
    buf = torch.empty(max(2 * (size or 0), 64 << 20) // 4, device=device)
    if device.type == "cuda":
        return lambda: buf.fill_(1.0)
    threads = threads or host_cores()

    def evict():
        own = torch.get_num_threads()
        torch.set_num_threads(threads)
        buf.fill_(1.0)
        torch.set_num_threads(own)
    return evict


def sparse_grid(comm, device, sizes, reps: int, now=time.perf_counter, densities=SELECT_DENSITIES,
                turns: int | None = None) -> list:
    """Each of :data:`SPARSE_KERNELS` (the real backend's torch
    implementation) on its own at each of ``sizes`` times
    ``densities``, one rank at a time while the others sleep
    (:func:`in_turn`): ``(kernel, n, density, seconds, elements)``, the
    median of ``reps`` calls after one warm-up, and the elements the
    kernel's line counts for that call (``Work.elems``: n, or a
    scatter-add's n + nnz); each call of :data:`COLD_KERNELS` with the
    caches written over just before. The line of :func:`kernels`' calls
    gives the time at their own density; these give what it misses as the
    entries move (``select_scale``, :func:`simsparse.calibration._select_scales`).
    One at a time, since the simulator shares the cores itself: with four
    ranks looping at once on two cores, a scatter-add of 3M entries at
    density 0.2 took 5.8 ms of wall time (2.3 ms of CPU) against 1.6 ms
    alone, and its ratio to density 0.004 read 20x where alone it is 4.4x.
    In rounds, each calling every density once: a factor is a ratio of two
    densities' times, and the host's memory speed moves over seconds, so
    each density sees the same stretches of time. Timed density after
    density, top-k of 3M at density 0.0007 read 0.67 to 0.74 of 0.004 with
    a spread of 36 to 46 % over eight runs, in rounds 0.78 to 0.81 with 4.5
    to 11 % (``python benchmarks/bench_grid_order.py``); a testbed's
    calibration put it at 0.53, and its held-out points at density 0.001
    and 3.1M entries 13 to 28 % fast. ``turns``: the ranks that time it
    (:func:`in_turn`; default every one, each adding its calls)."""
    import torch

    from ..compute.kernels import get_kernel

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(4321 + comm.Get_rank())
    evict = evictor(device)
    out = []
    for n in sizes:
        x = torch.randn(n, generator=gen).to(device)
        for name in SPARSE_KERNELS:
            k = get_kernel(name)
            cold = evict if name in COLD_KERNELS else (lambda: None)

            def timed(k=k, n=n, name=name, x=x, cold=cold):
                calls = []
                for d in densities:   # every density's inputs, and its warm-up (which counts its elements)
                    args = _sparse_inputs(name, x, d, comm.Get_size())
                    calls.append((d, args, k.work(k.torch_fn(*args), *args), []))
                for _round in range(reps):
                    for _, args, _, ts in calls:
                        cold()
                        sync()
                        t0 = now()
                        k.torch_fn(*args)
                        sync()
                        ts.append(now() - t0)
                out.extend((name, n, d, _median(ts), float(w.elems)) for d, _, w, ts in calls)
                del calls
                release_heap()   # (the inputs of every density at once: up to 0.5 GB at 1.2e7 entries)
            in_turn(comm, timed, turns)
    return out


#: the kernels :func:`idle_grid` times after an idle: the streaming kernels, in place and into a fresh
#: vector (a dense collective's, an error feedback's sum, a combine's concatenation), and the sparse ones
#: (what a rank runs first as it wakes from a wait or from the run's start), and the idles (seconds)
IDLE_KERNELS = ("add_into", "copy_into", "copy", "add", "concat") + SPARSE_KERNELS
IDLES_S = (0.001, 0.003, 0.01, 0.03)
#: the idles of a quick calibration (its sleeps are most of its idle grid)
QUICK_IDLES_S = (0.001, 0.01)
#: the largest size timed after an idle (a call of 12M entries is milliseconds: its idle no longer shows)
IDLE_MAX_N = 3_000_000
#: the entries of the untimed call that takes a wake-up's own cost before the timed one (4 KB)
WAKE_N = 1024
#: the longest sleep of a waiting rank of the real backend on sockets
IDLE_SLICE_S = SocketSleep.MAX_S


def idle(seconds: float, slice_s: float = IDLE_SLICE_S) -> None:
    """Sleep ``seconds`` in slices of at most ``slice_s``, as a rank waiting on the testbed's sockets does."""
    end = time.perf_counter() + seconds
    while (left := end - time.perf_counter()) > 0:
        time.sleep(min(left, slice_s))


def _idle_inputs(name: str, x, P: int) -> tuple:
    """A call's inputs on block ``x``: a streaming kernel's on its halves, a
    sparse kernel's at the algorithm runs' density (:func:`_sparse_inputs`)."""
    n = len(x) // 2
    if name == "copy":
        return (x[:n],)
    if name in ("add_into", "copy_into", "add"):
        return (x[n:], x[:n])
    if name == "concat":   # P blocks apart in memory (a combine's received blocks), n entries in all
        m = max(1, n // P)
        return ([x[2 * i * m:(2 * i + 1) * m] for i in range(P)],)
    return _sparse_inputs(name, x[:n], RUN_DENSITY, P)


def idle_grid(comm, device, sizes, reps: int, now=time.perf_counter, idles=IDLES_S) -> list:
    """Each of :data:`IDLE_KERNELS` (the real backend's torch implementation)
    on float32 blocks of each of ``sizes``, one rank at a time while the
    others sleep (a measured step's kernels rarely overlap: the ranks reach
    them at different times; where they do, the shared cores' model shares
    them), each call after its rank slept ``idle_s`` (:func:`idle`; 0: back
    to back, the reference) and then ran the same kernel on a small block
    of other data, untimed: ``(kernel, n, idle_s, seconds)``, the median of
    ``reps`` calls. A rank that waits on the network, or for the run's
    start, sleeps, and on a VM its core then finds the operands out of its
    caches (benchmarks/bench_cache_residency.py): a top-k of 393,216 entries
    took 11 to 24 % longer after 3 to 10 ms asleep, a copy of them 1.8 to
    3.4x. The small call takes the wake-up's own cost (tens of microseconds
    whatever the size: in a measured step MPI's progress and the receive's
    unpacking pay it before the kernel runs), so what the idle adds over the
    reference is the operands' refill."""
    import torch

    from ..compute.kernels import get_kernel

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(8765 + comm.Get_rank())
    P = comm.Get_size()
    out = []
    wx = torch.randn(2 * WAKE_N, generator=gen).to(device)
    for n in sizes:
        x = torch.randn(2 * n, generator=gen).to(device)
        for name in IDLE_KERNELS:
            k = get_kernel(name)
            args, wake = _idle_inputs(name, x, P), _idle_inputs(name, wx, P)
            for d in (0.0,) + tuple(idles):
                def timed(k=k, n=n, name=name, args=args, wake=wake, d=d):
                    ts = []
                    for _ in range(reps):
                        sync()
                        if d:
                            idle(d)
                        k.torch_fn(*wake)
                        sync()
                        t0 = now()
                        k.torch_fn(*args)
                        sync()
                        ts.append(now() - t0)
                    out.append((name, n, d, _median(ts)))
                in_turn(comm, timed)
    return out


def in_turn(comm, fn, turns: int | None = None) -> None:
    """``fn()`` on each rank of ``comm`` (the first ``turns``) in turn while
    the others sleep (:func:`_sleeping_barrier`): a kernel's own time, no
    other rank's work beside it on the cores."""
    for turn in range(min(comm.Get_size(), turns or comm.Get_size())):
        if turn == comm.Get_rank():
            fn()
        _sleeping_barrier(comm)


def _sleeping_barrier(comm, poll_s: float = 1e-3) -> None:
    """A barrier whose waiting ranks sleep (MPICH's own spins on the cores the timed rank needs)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(poll_s)


def every_rank(comm, calls: list) -> list:
    """Every rank's kernel calls on rank 0, each with its rank appended: a kernel's median and
    noise come from all the ranks that ran it at once (rank 0 alone gave a size 5 calls, too few for
    a tail that one call in eight shows), and a rank that a core-mate slows counts too. A CPU
    partner of a timed GPU passes no calls (:func:`timed_device`)."""
    parts = comm.gather([(*c, comm.Get_rank()) for c in calls], root=0)
    return [c for part in parts for c in part] if comm.Get_rank() == 0 else []


# -- layers ----------------------------------------------------------------------------

def layers(comm, device, model_names, batch_size, reps, now=time.perf_counter, partner: bool = False) -> dict:
    """Per model: forward time and every tensor's backward interval (registration order), their
    medians on this rank, and every timed rank's repetitions of each as calls (``reps``: the whole
    forward, and each tensor's backward interval, by :func:`every_rank`) for their spread around
    the median (:func:`simsparse.calibration.fit.fit_kernel_noise`).
    A ``partner`` rank (on the CPU beside a timed GPU, :func:`timed_device`) only keeps the barriers."""
    import torch

    from .. import models

    out = {}
    for name in model_names:
        if partner:
            for _ in range(reps + 1):
                comm.Barrier()
            every_rank(comm, [])
            continue
        torch.manual_seed(0)
        model = models.build(name).to(device)
        params = list(model.parameters())
        ready = [0.0] * len(params)
        # on a GPU the hook runs when the backward is queued, ahead of the GPU: a CUDA event recorded there
        # marks when the GPU has made the gradient (its time from the forward's end, after the sync)
        gpu = device.type == "cuda"
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(params) + 1)] if gpu else None
        mark = (lambda i: marks[i].record()) if gpu else (lambda i: ready.__setitem__(i, now()))
        hooks = [p.register_post_accumulate_grad_hook(lambda _p, i=i: mark(i)) for i, p in enumerate(params)]
        fwd, bwd = [], []
        for it in range(reps + 1):
            batch = models.example_batch(name, batch_size, generator=torch.Generator().manual_seed(it), device=device)
            for p in params:
                p.grad = None
            comm.Barrier()
            sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)
            sync()
            t0 = now()
            loss = models.loss(name, model, batch)
            sync()
            t1 = now()
            if gpu:
                marks[-1].record()
            loss.backward()
            sync()
            if gpu:
                ready = [t1 + marks[-1].elapsed_time(m) / 1e3 for m in marks[:-1]]
            if it == 0:
                continue  # warm-up
            fwd.append(t1 - t0)
            # backward order is reverse registration; a tensor's interval ends when its gradient is ready
            order = sorted(range(len(params)), key=lambda i: ready[i])
            prev, iv = t1, [0.0] * len(params)
            for i in order:
                iv[i] = max(0.0, ready[i] - prev)
                prev = max(prev, ready[i])
            bwd.append(iv)
        for h in hooks:
            h.remove()
        out[name] = {"batch_size": batch_size, "forward_s": _median(fwd),
                     "backward_s": np.median(np.asarray(bwd), axis=0).tolist(),
                     "reps": every_rank(comm, [("forward", 0, 0, t) for t in fwd] + [
                         (f"backward {i}", 0, 0, t) for rep in bwd for i, t in enumerate(rep) if t > 0])}
    return out


def per_call(fn, sync, count: int, each: bool = False, now=time.perf_counter) -> float:
    """Seconds per call of ``fn`` called ``count`` times back to back with one
    ``sync`` at the end (with ``each``, a ``sync`` after every call too)."""
    sync()
    t0 = now()
    for _ in range(count):
        fn()
        if each:
            sync()
    sync()
    return (now() - t0) / count


def op_launch(device, reps: int = 2000, now=time.perf_counter) -> dict:
    """What one eager torch op costs on ``device``, by its smallest op (an add of one
    element): ``issue_s``, ops issued back to back and one sync at the end (the
    per-op term of a model's roofline, :func:`simsparse.compute.models.model_profile`);
    ``sync_s``, each op followed by a synchronisation (a kernel whose result the
    program needs at once). Medians of three spans."""
    import torch

    a = torch.ones(1, device=device)
    c = torch.empty_like(a)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def add():
        torch.add(a, a, out=c)

    per_call(add, sync, 200, now=now)
    return {"issue_s": _median([per_call(add, sync, reps, now=now) for _ in range(3)]),
            "sync_s": _median([per_call(add, sync, reps // 4, True, now) for _ in range(3)])}


def timed_device(kind: str, rank: int, gpus: int) -> str:
    """The device this rank's tensors live on in a calibration. The kernels of
    the ranks on the timed device and rank 0's layers are recorded, and a run
    puts one GPU under each rank: on
    a host with fewer GPUs than ranks the ranks beyond them are partners on the
    CPU, so the timed rank has its GPU alone instead of time-sliced with the
    others (one H100 and two ranks: each kernel would wait for the other's)."""
    return "cpu" if kind == "cuda" and rank >= gpus else kind


def main(argv=None):
    from mpi4py import MPI
    import torch

    from ..backends.real.mpi import MPIDriver, pick_device

    spec_path, out_path = (argv or sys.argv[1:])[:2]
    with open(spec_path) as f:
        spec = json.load(f)
    comm = MPI.COMM_WORLD
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    kind = timed_device(spec["device"], comm.Get_rank(), gpus)
    device = pick_device(kind)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.Get_size()))
    t0 = time.perf_counter()
    parts = spec.get("parts", ["p2p", "kernels", "layers"])
    now = clock(spec.get("clock"))
    raw = {"stage_s": {}}

    def stage(name, t):
        raw["stage_s"][name] = time.perf_counter() - t
        return time.perf_counter()

    t = t0
    if "p2p" in parts:
        driver = MPIDriver(comm, device)
        raw["p2p"] = p2p(driver, comm, spec["p2p_sizes"], spec["reps"], spec["quick"], spec.get("exchange_sizes", ()),
                         spec.get("concurrency_sizes", (1 << 16, 1 << 20)), spec.get("late_sizes", ()),
                         spec.get("path_calls", True), spec.get("stack", False))
        t = stage("p2p", t)
    if "kernels" in parts:
        calls, raw["steps"], raw["message_path"], raw["speed_probe"] = kernels(
            comm, kind, spec["kernel_sizes"], spec["quick"], now, spec.get("path_calls", True))
        raw["kernels"] = every_rank(comm, calls if kind == spec["device"] else [])
        t = stage("kernels", t)
        reps, densities, turns = GRID[bool(spec["quick"])]
        grid = sparse_grid(comm, device, spec["kernel_sizes"], reps, now, densities, turns)
        raw["sparse_grid"] = every_rank(comm, grid if kind == spec["device"] else [])
        t = stage("sparse_grid", t)
        woke = idle_grid(comm, device, [n for n in spec["kernel_sizes"] if n <= IDLE_MAX_N], 3 if spec["quick"] else 7,
                         now, QUICK_IDLES_S if spec["quick"] else IDLES_S)
        raw["idle_grid"] = every_rank(comm, woke if kind == spec["device"] else [])
        t = stage("idle_grid", t)
    if "layers" in parts:
        partner = kind != spec["device"]
        raw["layers"] = layers(comm, device, spec["models"], spec["batch_size"], spec["layer_reps"], now, partner)
        if not partner:
            raw["op_launch"] = op_launch(device, now=now)
        t = stage("layers", t)
    raw["device"] = f"{device.type}:{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
    if spec["device"] == "cuda":
        raw["cpu_partners"] = max(0, comm.Get_size() - gpus)
    raw["torch_threads"] = torch.get_num_threads()
    raw["wall_s"] = time.perf_counter() - t0
    if comm.Get_rank() == 0:
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(raw, f)
        os.replace(tmp, out_path)


if __name__ == "__main__":
    main()
