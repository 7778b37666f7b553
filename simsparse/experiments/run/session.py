"""One command's pass over a config into a results folder, shared by
``run``, ``measure`` and ``sweep``: the folder lock, the store, the rows of
points no longer in the config moved aside, provenance, the points still to
run, and the progress line."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from ..config.errors import ConfigError
from ..config.point import Point
from ..config.schema import Experiment
from ..results import provenance
from ..results.store import LockedError, ResultsStore, writer_lock
from .progress import Progress


class SessionError(ConfigError):
    """A results folder that cannot be written now, said in one paragraph (exit status 2)."""


class Session:
    """``with Session(exp, out_dir, ident) as s:`` the folder locked and
    its store ready: ``s.pending`` are the points to run, ``s.begin()``
    writes provenance (``s.written``), ``s.save(row, trace)`` keeps a point
    as it finishes.
    ``points`` (default ``exp.points``) are what runs (``measure`` runs one
    of each group of points that differ only in simulator settings)."""

    def __init__(self, exp: Experiment, out_dir: Path, ident, points: list[Point] | None = None, *,
                 fresh: bool = False, trace: bool = False, fmt: str = "csv", command: list[str] | None = None,
                 executor: str = "local", jobs: int = 1, log=None):
        self.exp, self.out_dir, self.ident = exp, Path(out_dir), ident
        self.points = list(exp.points if points is None else points)
        self.fresh, self.trace, self.fmt = fresh, trace, fmt
        self.command, self.executor, self.jobs = command or [], executor, jobs
        self.log = log or sys.stderr
        self._stack = contextlib.ExitStack()
        self.store: ResultsStore | None = None
        self.pending: list[Point] = []
        self.written: list[Path] = []

    def __enter__(self) -> "Session":
        try:
            self._stack.enter_context(writer_lock(self.out_dir))
        except LockedError as e:
            raise SessionError(str(e)) from None
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _open(self) -> None:
        exp, ids = self.exp, [self.ident(p) for p in self.points]
        store = self.store = ResultsStore(self.out_dir, fresh=self.fresh, fmt=self.fmt, order=ids)
        store.remove_leftovers()
        stale = store.retain(set(ids))
        if stale:
            print(f"simsparse: moved {stale} rows of points no longer in {exp.path} to "
                  f"{self.out_dir / 'results.stale.csv'}", file=self.log)
        store.prune_traces(set() if self.fresh else set(ids))
        self.pending = [p for p in self.points
                        if not store.has(self.ident(p)) or (self.trace and not store.has_trace(self.ident(p)))]
        if len(self.pending) < len(self.points):
            print(f"simsparse: {len(self.points) - len(self.pending)} of {len(self.points)} points already in "
                  f"{store.file}", file=self.log)

    def begin(self) -> None:
        """The points are going to run (the budget allowed them): write the
        (empty) results file and the provenance of this pass."""
        if self.fresh or not self.store.file.exists():
            self.store.flush()
        entry = provenance.record(self.exp, self.command, self.executor, self.jobs, len(self.pending))
        self.written = provenance.write(self.out_dir, self.exp, entry, self.ident)

    def save(self, row: dict, trace_rows) -> None:
        """Keep a finished point's row (and its trace, with ``trace``)."""
        self.store.save_trace(row["point_id"], trace_rows if self.trace else None)
        self.store.add(row)

    def progress(self, label: str, backend: str) -> Progress:
        return Progress(self.pending, f"{self.exp.name} [{label}]", backend, stream=self.log)
