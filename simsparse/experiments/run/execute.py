"""``simsparse run`` and ``simsparse measure``: the points of a config, one
after another, on the simulator or under mpiexec, through a :class:`Session`."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..config.errors import ConfigError
from ..config.schema import Experiment
from ..results.format import fmt_duration
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
            oversubscribe: bool = False, testbed=None, command: list[str] | None = None, log=None) -> Executed:
    """Run the points of ``exp`` not yet in its results folder. ``testbed``:
    (name, ``P -> context manager``) to measure on an emulated cluster."""
    log = log or sys.stderr
    out_dir = results_dir(exp.name, out, "" if backend == "sim" else "_mpi")
    if backend == "sim":
        from . import runner

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
        watchdog = budget.Watchdog(limits.max_memory_B, None if force else limits.max_seconds)
        try:
            if backend == "sim":
                with watchdog:
                    for p in s.pending:
                        progress.started(p)
                        watchdog.point_started()
                        got = runner.simulate_point(p, trace=trace, max_seconds=None if force else limits.max_seconds)
                        s.save(got.row, got.trace)
                        progress.finished(p, got.row)
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
        except KeyboardInterrupt:
            if watchdog.breach is None:
                raise
            raise budget.BudgetError(f"stopped a point of {exp.name}: {watchdog.breach}. The {progress.n_done} "
                                     f"points finished before it are kept in {s.store.file}; lower the point's size, "
                                     f"or raise SIMSPARSE_BUDGET") from None
        finally:
            progress.close()
        if s.pending:
            print(f"simsparse: {len(s.pending)} points in {fmt_duration(progress.elapsed_s())}", file=log)
        return Executed(s.store, out_dir, s.written)


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
