"""``simsparse sweep``: the points of a config simulated in parallel, resumable.

Points are independent, so they go to an executor as tasks
(:func:`run_task`: one point in, its row out) and come back in any order:

* ``local``: a process pool on this machine (``--jobs`` processes; with one
  job the points run in this process);
* ``mpi``: an ``mpi4py.futures`` pool, for several machines. Launch it as
  ``mpiexec -n N python -m mpi4py.futures -m simsparse.cli sweep ... --executor mpi``
  (rank 0 runs the sweep, the other N-1 ranks simulate); started without
  ``mpiexec`` it spawns ``--jobs`` MPI workers;
* ``dask``: a Dask distributed cluster, the scheduler at ``--scheduler ADDR``,
  or a ``LocalCluster`` of ``--jobs`` worker processes when none is given.

Only this process writes results: each finished point is stored at once
(:class:`~.store.ResultsStore`, one atomic rename per point), so a sweep
killed at any moment, even with SIGKILL, loses only the points still
running, and the same command resumes it. Rows are kept in the config's
order. They are identical whatever the executor and number of jobs except
:data:`RUN_COLUMNS`, which say when and where each point ran.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..results import provenance
from ..config.schema import ConfigError, Experiment
from ..config.point import Point
from .progress import cost
from ..results.store import ResultsStore
from .session import Session

EXECUTORS = ("local", "mpi", "dask")
#: columns that say when and where a point ran (and how long it took): the only ones that differ between runs
RUN_COLUMNS = ("wall_s", "peak_rss_B", "host", "worker", "started_at")


class SweepError(ConfigError):
    """An executor that cannot start, said in one paragraph (exit status 2)."""


def ident(point: Point) -> str:
    return point.point_id("sim")


def run_task(point: Point, trace: bool = False, max_seconds: float | None = None) -> tuple[dict, list]:
    """Simulate one point (in a worker): its row, with where and when it ran, and its trace rows."""
    from . import budget
    from .runner import simulate_point

    started = provenance.now()
    out, peak = budget.peak_of(lambda: simulate_point(point, trace=trace, max_seconds=max_seconds))
    row = {**out.row, "peak_rss_B": peak, "host": socket.gethostname(), "worker": os.getpid(), "started_at": started}
    return row, out.trace


# -- executors ---------------------------------------------------------------------------

@contextlib.contextmanager
def open_executor(kind: str, jobs: int, scheduler: str | None = None) -> Iterator[Executor]:
    """A ``concurrent.futures`` executor of the given kind; on the way out
    (an error or Ctrl-C included) queued tasks are cancelled."""
    if kind not in EXECUTORS:
        raise SweepError(f"--executor {kind!r}: allowed {', '.join(EXECUTORS)}")
    if scheduler and kind != "dask":
        raise SweepError(f"--scheduler {scheduler} is the address of a Dask scheduler; use it with --executor dask")
    close = None
    if kind == "local":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__, "simsparse.experiments.run.runner"])
        ex = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
    elif kind == "mpi":
        ex = _mpi_executor(jobs)
    else:
        ex, close = _dask_executor(jobs, scheduler)
    ok = False
    try:
        yield ex
        ok = True
    finally:
        if close is None:
            ex.shutdown(wait=ok, cancel_futures=True)
        else:  # Dask's executor: wait=False cancels what is queued or running
            ex.shutdown(wait=ok)
            close()


def _mpi_executor(jobs: int) -> Executor:
    try:
        from mpi4py import MPI
        from mpi4py.futures import MPIPoolExecutor, _core
    except ImportError:
        raise SweepError("--executor mpi needs mpi4py (pip install 'simsparse[mpi]')") from None
    launched = MPI.COMM_WORLD.Get_size()
    if launched > 1 and getattr(_core, "SharedPool", None) is None:
        raise SweepError(f"--executor mpi: this process is one of {launched} MPI ranks that would each run the whole "
                         f"sweep; launch it as `mpiexec -n N python -m mpi4py.futures -m simsparse.cli sweep ...` "
                         f"(rank 0 runs the sweep, the others simulate)")
    return MPIPoolExecutor() if launched > 1 else MPIPoolExecutor(max_workers=jobs)


def _dask_executor(jobs: int, scheduler: str | None):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SweepError("--executor dask needs dask.distributed (pip install 'dask[distributed]')") from None
    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout="20s")
        else:
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.ERROR)
            client = Client(cluster)
    except (OSError, TimeoutError) as e:
        if cluster is not None:
            cluster.close()
        raise SweepError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({e}); give the address "
                         f"`dask scheduler` prints (e.g. tcp://host:8786), or leave --scheduler out for a "
                         f"LocalCluster of --jobs workers") from None

    def close():
        client.close()
        if cluster is not None:
            cluster.close()

    return client.get_executor(pure=False), close


def outcomes(points: list[Point], executor: str, jobs: int, scheduler: str | None = None,
             trace: bool = False, max_seconds: float | None = None) -> Iterator[tuple[Point, tuple | BaseException]]:
    """(point, (row, trace) or the exception it raised), as points finish.
    The largest points go first, so a pool does not end on one long point."""
    if executor == "local" and jobs == 1:
        for p in points:
            try:
                yield p, run_task(p, trace, max_seconds)
            except Exception as e:  # reported with the point; the sweep goes on
                yield p, e
        return
    with open_executor(executor, jobs, scheduler) as ex:
        futures = {ex.submit(run_task, p, trace, max_seconds): p for p in sorted(points, key=cost, reverse=True)}
        for f in as_completed(futures):
            err = f.exception()
            yield futures[f], err if err is not None else f.result()


# -- the sweep ---------------------------------------------------------------------------

@dataclass
class SweepResult:
    store: ResultsStore
    ran: int
    failed: list = field(default_factory=list)   # (point, exception)
    elapsed_s: float = 0.0
    written: list = field(default_factory=list)  # provenance files


def sweep(exp: Experiment, out_dir: Path, executor: str = "local", jobs: int = 1, scheduler: str | None = None,
          fmt: str = "csv", fresh: bool = False, trace: bool = False, command: list[str] | None = None,
          log=None, max_seconds: float | None = None) -> SweepResult:
    """Simulate the points of ``exp`` not yet in ``out_dir``, writing each row as it arrives
    (``max_seconds``: :func:`~.runner.simulate_point`)."""
    log = log or sys.stderr
    with Session(exp, out_dir, ident, fresh=fresh, trace=trace, fmt=fmt, command=command, executor=executor,
                 jobs=jobs, log=log) as s:
        s.begin()
        if not s.pending:
            return SweepResult(s.store, 0, written=s.written)
        where = f"dask at {scheduler}" if scheduler else f"{executor}, {jobs} job{'s' if jobs != 1 else ''}"
        print(f"simsparse: simulating {len(s.pending)} points of {exp.name} ({where})", file=log, flush=True)
        progress = s.progress("sweep", "sim")
        failed = []
        try:
            for p, got in outcomes(s.pending, executor, jobs, scheduler, trace, max_seconds):
                if isinstance(got, BaseException):
                    failed.append((p, got))
                    print(f"simsparse: {progress.label(p)} failed: {type(got).__name__}: {got}", file=log, flush=True)
                    continue
                row, rows = got
                s.save(row, rows)
                progress.finished(p, row)
        finally:
            progress.close()
        return SweepResult(s.store, len(s.pending) - len(failed), failed, progress.elapsed_s(), s.written)


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1

