"""Results on disk: written atomically, resumable.

``results/<name>/results.csv`` holds one row per point, keyed by
``point_id`` (a hash of the fully resolved point and the backend). After
every finished point the whole file is rewritten to a temporary file and
renamed over the old one, so an interrupted run never leaves a half-written
file; re-running the same config skips the points already present, so no row
is lost or duplicated. Rows of points no longer in the config are moved to
``results.stale.csv`` rather than silently dropped. A row written before
``time_s`` became the mean over a period (it has no ``time_median_s``) does
not count as present: its point runs again and the new row replaces it, so
one folder never mixes the two statistics.

Traces (``--trace``): one file per point, ``trace/<point_id>.csv``, written
when the point finishes (so a resumed sweep keeps them), and after the run
``trace.csv`` and ``trace.json``, which hold exactly the points of the
current config (:meth:`ResultsStore.combine_traces`). A point's trace file
goes when its point leaves the config or is run again without ``--trace``.

Every file is written through :func:`atomic_write`, with the usual mode
(0666 less the umask), so a colleague can read the results. A process
killed with SIGKILL may leave only a temporary ``.<file>.*`` beside the file
it was replacing; :func:`writer_lock` keeps a second sweep out of a folder
that one is writing, and under it :meth:`ResultsStore.remove_leftovers`
deletes those.

The results file is ``results.csv`` or, with ``fmt="parquet"``,
``results.parquet`` (the store reads whichever of the two is there, and
keeps one: switching format converts). Rows are kept in the order given by
``order`` (the config's points), whatever order they finished in.
"""
from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

import numpy as np
import pandas as pd

from ...files import atomic_write
from .metrics import ROW_COLUMNS, TRACE_COLUMNS
from .trace_event import write_trace_json


def read_csv(path, **kw) -> pd.DataFrame:
    """A simsparse CSV; point ids always as text (all-digit ids would parse as numbers)."""
    ids = {c: str for c in ("point_id", "pred_point_id", "meas_point_id")}
    return pd.read_csv(path, dtype=ids, keep_default_na=False, na_values=[""], **kw)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


class LockedError(Exception):
    """Another process is writing to the results folder."""


@contextlib.contextmanager
def writer_lock(out_dir: Path):
    """Hold ``<out_dir>/.lock`` (an advisory ``flock``, released by the
    kernel even when the holder is killed) while writing the folder."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"{out_dir}: another simsparse process is writing to this results folder; wait for it "
                              f"to finish, or pass --out with another folder") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _for_parquet(df: pd.DataFrame) -> pd.DataFrame:
    """Columns Parquet can type: empty text becomes missing, an object column
    of numbers becomes numeric, of booleans boolean, anything else text."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype != object:
            continue
        vals = [None if v is None or (isinstance(v, str) and v == "") or (isinstance(v, float) and v != v) else v
                for v in out[c]]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, (bool, np.bool_)) for v in present):
            out[c] = pd.array(vals, dtype="boolean")
        elif all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                 for v in present):
            out[c] = pd.to_numeric(pd.Series(vals, index=out.index, dtype=object))
        else:
            out[c] = [None if v is None else str(v) for v in vals]
    return out


def read_results(path: Path) -> pd.DataFrame:
    """A results file, CSV or Parquet, with point ids as text."""
    path = Path(path)
    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
        for c in ("point_id", "pred_point_id", "meas_point_id"):
            if c in df:
                df[c] = df[c].astype(str)
        return df
    return read_csv(path)


class ResultsStore:
    FORMATS = ("csv", "parquet")

    def __init__(self, out_dir: Path, fresh: bool = False, fmt: str = "csv", order: list[str] | None = None):
        if fmt not in self.FORMATS:
            raise ValueError(f"results format {fmt!r}: allowed {', '.join(self.FORMATS)}")
        self.dir = Path(out_dir)
        self.csv = self.dir / "results.csv"
        self.file = self.dir / f"results.{fmt}"
        self.order = {pid: i for i, pid in enumerate(order or [])}
        self.rows: dict[str, dict] = {}
        found = [f for f in (self.file, *(self.dir / f"results.{x}" for x in self.FORMATS)) if f.exists()]
        if found and not fresh:
            df = read_results(found[0])
            if "params" in df:
                df["params"] = df["params"].astype(object).where(df["params"].notna(), "")
            for rec in df.to_dict("records"):
                self.rows[str(rec["point_id"])] = rec

    def remove_leftovers(self) -> None:
        """Delete temporary files of atomic writes that a SIGKILL interrupted
        (call it holding :func:`writer_lock`: they could be another writer's)."""
        for folder, names in ((self.dir, ["results.csv", "results.parquet", "results.stale.csv"]),
                              (self.trace_dir, ["*.csv"])):
            for name in names:
                for f in folder.glob(f".{name}.*") if folder.is_dir() else []:
                    f.unlink(missing_ok=True)

    def has(self, point_id: str) -> bool:
        """Whether the point has a row of the current statistic (module docstring)."""
        row = self.rows.get(point_id)
        return row is not None and pd.notna(row.get("time_median_s"))

    def add(self, row: dict) -> None:
        self.rows[row["point_id"]] = row
        self.flush()

    def retain(self, point_ids: set[str]) -> int:
        """Keep only the given points; move the others to results.stale.csv."""
        stale = [r for pid, r in self.rows.items() if pid not in point_ids]
        if stale:
            write_csv(pd.DataFrame(stale), self.dir / "results.stale.csv")
            self.rows = {pid: r for pid, r in self.rows.items() if pid in point_ids}
            self.flush()
        return len(stale)

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(list(self.rows.values()))
        if df.empty:
            return pd.DataFrame(columns=ROW_COLUMNS)
        if self.order:
            last = len(self.order)
            df = df.iloc[sorted(range(len(df)), key=lambda i: self.order.get(str(df["point_id"].iat[i]), last))]
            df = df.reset_index(drop=True)
        lead = [c for c in ROW_COLUMNS if c in df.columns]
        return df[lead + [c for c in df.columns if c not in lead]]

    def flush(self) -> None:
        df = self.frame()
        if self.file.suffix == ".parquet":
            atomic_write(self.file, lambda tmp: _for_parquet(df).to_parquet(tmp, index=False))
        else:
            write_csv(df, self.file)
        for other in self.FORMATS:  # one results file per folder: a change of format converts
            f = self.dir / f"results.{other}"
            if f != self.file:
                f.unlink(missing_ok=True)

    # -- traces ------------------------------------------------------------------
    @property
    def trace_dir(self) -> Path:
        return self.dir / "trace"

    def trace_file(self, point_id: str) -> Path:
        return self.trace_dir / f"{point_id}.csv"

    def has_trace(self, point_id: str) -> bool:
        return self.trace_file(point_id).exists()

    def save_trace(self, point_id: str, rows: list | None) -> None:
        """The point's trace; ``None``: the point ran untraced, so an older trace of it goes."""
        if rows is None:
            self.trace_file(point_id).unlink(missing_ok=True)
        else:
            write_csv(pd.DataFrame(rows, columns=TRACE_COLUMNS), self.trace_file(point_id))

    def prune_traces(self, keep: set[str]) -> int:
        """Delete the per-point trace files of points not in ``keep``."""
        gone = 0
        if self.trace_dir.is_dir():
            for f in self.trace_dir.glob("*.csv"):
                if f.stem not in keep:
                    f.unlink()
                    gone += 1
        return gone

    def combine_traces(self, requested: bool) -> tuple[list[Path], str | None]:
        """Rewrite ``trace.csv`` and ``trace.json`` from the per-point files
        of the rows in results.csv -- when traces were requested or those
        files exist -- so they never hold points of another config. If some
        row has no trace, they are removed instead. Returns (files written, note)."""

        outs = [self.dir / "trace.csv", self.dir / "trace.json"]
        if not requested and not any(f.exists() for f in outs):
            return [], None
        df = self.frame()
        ids = [str(pid) for pid in df["point_id"]]
        missing = [pid for pid in ids if not self.has_trace(pid)]
        if missing:
            removed = [f.name for f in outs if f.exists()]
            for f in outs:
                f.unlink(missing_ok=True)
            note = (f"{len(missing)} of {len(ids)} points have no trace; "
                    + (f"removed {' and '.join(removed)} (they would not match results.csv); " if removed else "")
                    + "run with --trace to trace them")
            return [], note
        # point_id as text: an all-digit id would otherwise be read as a number
        parts = [read_csv(self.trace_file(pid)) for pid in ids]
        parts = [p for p in parts if len(p)]
        trace = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=TRACE_COLUMNS)
        write_csv(trace, outs[0])
        write_trace_json(trace, df, outs[1])  # the first measured iteration of each point
        return outs, None
