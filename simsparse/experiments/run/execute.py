"""``simsparse run`` and ``simsparse measure``: the points of a config on the
simulator or under mpiexec, through a :class:`Session`.

``run`` simulates several points at once, one per core (:func:`jobs_for`),
where the grid is long enough to pay for the workers and their memory fits:
each point is deterministic, so the rows are the same as one after another,
and a grid of a few long points finishes with its longest. Every point runs
under its own :class:`~.budget.Watchdog` (:func:`simulate_watched`)."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..config.errors import ConfigError
from ..config.schema import Experiment
from ..results.format import fmt_bytes, fmt_duration
from ..results.paths import results_dir
from ..results.store import ResultsStore
from ...backends.evaluators import EvaluationError
from . import budget
from .resolve import resolve
from .session import Session


@dataclass
class Executed:
    store: ResultsStore
    out_dir: Path
    written: list = field(default_factory=list)  # provenance files


def execute(exp: Experiment, backend: str = "sim", out: str | None = None, *, fresh: bool = False,
            trace: bool = False, force: bool = False, device: str = "cpu", timeout: float | None = None,
            oversubscribe: bool = False, testbed=None, command: list[str] | None = None, log=None,
            jobs: int | None = None) -> Executed:
    """Run the points of ``exp`` not yet in its results folder. ``testbed``:
    (name, ``P -> context manager``) to measure on an emulated cluster;
    ``jobs``: the most points simulated at once (None: the cores here)."""
    log = log or sys.stderr
    out_dir = results_dir(exp.name, out, "" if backend == "sim" else "_mpi")
    if backend == "sim":
        points, members = exp.points, None

        def ident(p):
            return p.point_id("sim")
    else:
        from . import measure as ms
        from .plan import with_plan

        ms.check_prerequisites()
        # one real run per group of points that differ only in simulator-only keys (compute, network, data_scale)
        members = ms.group_points([with_plan(p) for p in exp.points])
        points = [g[0] for g in members.values()]

        def ident(p):
            return ms.measured_id(with_plan(p))
        if len(points) < len(exp.points):
            print(f"simsparse: the {len(exp.points)} points are {len(points)} real runs: points that differ only in "
                  f"compute, network or data_scale (settings of the simulator) run once on this host", file=log)
        if testbed:   # ranks that wait for the network sleep (SocketSleep): sharing cores is the point
            print(f"simsparse: measuring on the testbed {testbed[0]}: {max(p.P for p in points)} ranks share "
                  f"{ms.cores()} cores and wait for the network without spinning", file=log)
        else:
            check_cores(points, oversubscribe, ms.cores(), log)

    limits = budget.Budget.from_env()
    checked = force or not out_dir.exists()
    if backend == "sim":   # every point's evaluation resolves (a forced evaluator that cannot time one, said here)
        for p in points:
            try:
                resolve(p, budget.network_of(p), trace)
            except EvaluationError as e:
                raise ConfigError(f"{exp.path}: {e}. Allowed: fast (the default), exact, events, sampled, or an "
                                  f"evaluator the point's network and device allow (simsparse run --explain)") from None
    if not force and not out_dir.exists():   # every point is pending: a refused config leaves no folder behind
        budget.check(points, limits, backend, trace, where=exp.path)
    with Session(exp, out_dir, ident, points, fresh=fresh, trace=trace, command=command, log=log) as s:
        if not checked:
            budget.check(s.pending, limits, backend, trace, where=exp.path)
        s.begin()
        if s.pending:
            print(f"simsparse: {'simulating' if backend == 'sim' else 'measuring'} {len(s.pending)} points of "
                  f"{exp.name}", file=log, flush=True)
        progress = s.progress(backend, backend)
        max_point_s = None if force else limits.max_seconds
        peak = 0.0   # the largest point's peak memory, in whichever process it ran
        try:
            if backend == "sim":
                at_once, order, _ = jobs_for(s.pending, limits, trace, jobs)
                for p, (row, rows) in simulated(order, at_once, trace, limits.max_memory_B, max_point_s, progress):
                    s.save(row, rows)
                    progress.finished(p, row)
                    peak = max(peak, row["peak_rss_B"])
            else:
                def done(p, outcome):
                    s.save(outcome.row, outcome.trace)
                    progress.finished(p, outcome.row)

                for P in dict.fromkeys(p.P for p in s.pending):  # one mpiexec launch per P
                    batch = [p for p in s.pending if p.P == P]
                    progress.started(batch[0])
                    with (testbed[1](P) if testbed else contextlib.nullcontext()) as tb:
                        ms.measure_points(batch, device=device, trace=trace, timeout_s=timeout, members=members,
                                          on_point=done, testbed=tb)
        except PointStopped as e:
            raise budget.BudgetError(f"stopped a point of {exp.name}: {e}. The {progress.n_done} "
                                     f"points finished before it are kept in {s.store.file}; lower the point's size, "
                                     f"or raise SIMSPARSE_BUDGET") from None
        finally:
            progress.close()
        if s.pending:
            print(f"simsparse: {len(s.pending)} points in {fmt_duration(progress.elapsed_s())}"
                  + (f"; the largest peak memory of a point {fmt_bytes(peak)} (peak_rss_B in the results)" if peak
                     else ""), file=log)
        return Executed(s.store, out_dir, s.written)


# -- simulating the points ------------------------------------------------------------------

#: the estimated seconds of a grid below which its points run one after another in this process: a pool
#: of workers costs about a second to start (a forkserver that imports simsparse)
POOL_FROM_S = 10.0
#: the budget's memory estimate is held within this factor of a point's peak (benchmarks/bench_scale.py:
#: the peak is at most 1.6x the estimate on its 32 rows), so points run at once only where that many
#: times their estimates fit side by side
MEMORY_MARGIN = 3.0


class PointStopped(Exception):
    """A point stopped by its :class:`~.budget.Watchdog`: the breach, said once."""


def jobs_for(points: list, limits: budget.Budget, trace: bool, jobs: int | None = None) -> tuple[int, list, str]:
    """How many of ``points`` to simulate at once, the order to start them
    in, and why: ``jobs``, or by default one per core, the longest estimated
    first; but one where the grid is estimated under :data:`POOL_FROM_S` or
    in a daemon process (a pool's worker may not start processes of its
    own), and fewer where the largest points' estimates, times
    :data:`MEMORY_MARGIN`, would not fit the memory limit side by side."""
    import multiprocessing

    from .sweep import default_jobs

    n = min(default_jobs() if jobs is None else jobs, len(points))
    if n < 2:
        return 1, points, "--jobs 1" if jobs == 1 else "one core or one point"
    if multiprocessing.current_process().daemon:
        return 1, points, "a daemon process may not start workers"
    ests = [budget.point_estimate(p, trace) for p in points]
    if jobs is None and sum(e.seconds for e in ests) < POOL_FROM_S:
        return 1, points, f"the grid is estimated under {POOL_FROM_S:g} s"
    mem = sorted((e.memory_B for e in ests), reverse=True)
    while n > 1 and MEMORY_MARGIN * sum(mem[:n]) > limits.max_memory_B:
        n -= 1
    if n < 2:
        return 1, points, f"{MEMORY_MARGIN:g}x two points' memory estimates would not fit side by side"
    return n, [p for _, p in sorted(zip(ests, points), key=lambda ep: ep[0].seconds, reverse=True)], \
        "one per core, the longest estimated first"


#: the watchdog of the point this process simulates (read by a worker's SIGINT handler)
_WATCHING: list = []


def simulate_watched(point, trace: bool, max_memory_B: float, max_point_s: float | None) -> tuple[dict, list]:
    """One point's row and trace rows, under a :class:`~.budget.Watchdog` of
    its own (in this process, or in a worker): past a limit it raises
    :class:`PointStopped`."""
    from . import runner

    watchdog = budget.Watchdog(max_memory_B, max_point_s)
    _WATCHING[:] = [watchdog]
    try:
        with watchdog:
            got, peak = budget.peak_of(lambda: runner.simulate_point(point, trace=trace, max_seconds=max_point_s))
    except KeyboardInterrupt:
        if watchdog.breach is None:
            raise
        raise PointStopped(watchdog.breach) from None
    finally:
        _WATCHING.clear()
    # the point's own peak: the process it ran in (a pool's worker, whose memory /usr/bin/time does not see)
    return {**got.row, "peak_rss_B": peak}, got.trace


def _indexed(task) -> tuple:
    i, *args = task
    return i, simulate_watched(*args)


def _worker_signals() -> None:
    """A worker's SIGINT interrupts its point only when its watchdog sent it:
    Ctrl-C reaches the whole process group, and the run stops its workers
    itself (SIGTERM), with no traceback from each."""
    import signal

    def on_sigint(signum, frame):
        if _WATCHING and _WATCHING[0].breach is not None:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def simulated(points: list, jobs: int, trace: bool, max_memory_B: float, max_point_s: float | None, progress):
    """(point, (row, trace rows)) of every one of ``points``, started in
    their order: one after another here, or ``jobs`` at a time in a pool of
    worker processes (each worker's memory limit its share). An error stops
    the pool's workers and is raised here."""
    if jobs < 2:
        for p in points:
            progress.started(p)
            yield p, simulate_watched(p, trace, max_memory_B, max_point_s)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "simsparse.experiments.run.runner"])
    pool = ctx.Pool(jobs, initializer=_worker_signals)
    try:
        tasks = [(i, p, trace, max_memory_B / jobs, max_point_s) for i, p in enumerate(points)]
        for i, got in pool.imap_unordered(_indexed, tasks):
            yield points[i], got
    finally:
        pool.terminate()
        pool.join()


def check_cores(points, oversubscribe: bool, cores: int, log=None) -> None:
    """More ranks than cores: the ranks would time-share, and the times would
    measure the sharing. Refused unless ``oversubscribe``."""
    over = sorted({p.P for p in points if p.P > cores})
    if not over:
        return
    what = f"P = {', '.join(map(str, over))} exceed{'s' if len(over) == 1 else ''} the {cores} cores of this machine"
    if not oversubscribe:
        raise ConfigError(f"{what}: the ranks would share cores and the times would measure that sharing. Lower P, "
                          f"or pass --oversubscribe to measure anyway")
    print(f"simsparse: warning: {what}; ranks share cores (--oversubscribe), so times at those P include the "
          f"sharing", file=log or sys.stderr)
