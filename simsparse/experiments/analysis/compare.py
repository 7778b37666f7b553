"""``simsparse compare PRED MEAS``: predicted against measured, per point and per phase.

**Join key.** Rows are joined on the columns that say *what* ran, never on
``point_id`` (it hashes the backend) nor on what describes the machine
(``network``, ``net_*``, ``compute``: a measured row's ``compute`` is e.g.
``cpu:cpu``), nor on ``data_scale`` (simulator only), ``iterations``,
``warmup`` or the derived ``k``: see :data:`KEY_COLUMNS` plus every ``wl_*``
workload knob. A column missing on one side counts as empty.

**Phase time** and each phase's *kind* (communication or compute): :mod:`.phases`.

Errors are ``(pred - meas) / meas`` (empty for a phase measured at 0); the
summaries are the median and the 90th percentile (``numpy.percentile``,
linear) of ``|error|`` over points. Output: ``compare.csv`` (a ``level``
column: one ``point`` row per point, one ``phase`` row per (point, phase)),
``kernels.csv`` (each kernel's calls on both sides: :mod:`.kernels`) and
``compare.png``, in ``<MEAS folder>/compare_<PRED folder name>/`` by default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..config.errors import ConfigError
from ...files import atomic_write
from ..results.store import read_csv
from .kernels import join_kernels, kernel_report
from .phases import PHASES_CSV, by_kind, error_stats, join_phases, phase_summary

KEY_COLUMNS = ["schedule", "model", "batch_size", "algorithm", "params", "schedule_params", "P", "n", "density",
               "dtype", "seed"]
SHOWN = ["schedule", "model", "batch_size", "algorithm", "params", "schedule_params", "P", "n", "density"]


class CompareError(ConfigError):
    """Inputs that cannot be compared (exit status 2)."""


# -- inputs ------------------------------------------------------------------
def locate(path, role: str) -> tuple[Path, Path | None]:
    """(results.csv, trace.csv or None) of a results folder or results.csv file."""
    p = Path(path)
    csv = p if p.suffix == ".csv" else p / "results.csv"
    if not csv.is_file():
        raise CompareError(f"{role} {path}: no results file {csv} (give a folder written by `simsparse run` or "
                           f"`simsparse measure`, or its results.csv).")
    trace = csv.parent / "trace.csv"
    return csv, trace if trace.is_file() else None


def _norm(v) -> str:
    """A key value as canonical text (16 and 16.0 agree; empty and NaN agree)."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return str(int(v)) if float(v).is_integer() else repr(float(v))
    return str(v)


def key_columns(*frames: pd.DataFrame) -> list[str]:
    wl = sorted({c for f in frames for c in f.columns if c.startswith("wl_")})
    return KEY_COLUMNS + wl


def _describe(row, cols) -> str:
    return " ".join(f"{c}={row[c]}" for c in cols if row[c] != "")


def _varying(cols, *frames) -> list[str]:
    """The key columns worth naming a point by: algorithm, P and those that vary."""
    return [c for c in cols if c in ("algorithm", "P") or pd.concat([f[c] for f in frames]).nunique() > 1]


def _filter(df: pd.DataFrame, where: list[str], csv: Path, role: str) -> pd.DataFrame:
    for cond in where:
        col, eq, val = cond.partition("=")
        if not eq or col not in df.columns:
            raise CompareError(f"--{role.lower()}-where {cond!r}: expected COLUMN=VALUE with a column of {csv}")
        df = df[df[col].map(_norm) == _norm(val)]
    return df


def load_side(path, role: str, where: list[str] = ()) -> tuple[pd.DataFrame, Path, Path | None]:
    """A side's rows (filtered), checked: a positive time_s, one row per key."""
    csv, trace = locate(path, role)
    df = _filter(read_csv(csv), list(where), csv, role)
    missing = [c for c in ("algorithm", "P", "time_s") if c not in df.columns]
    if missing or df.empty:
        raise CompareError(f"{role} {csv}: " + (f"no column {', '.join(missing)}" if missing else "no rows")
                           + "; expected the results.csv of `simsparse run` or `simsparse measure`.")
    df = df.reset_index(drop=True)
    for col, default in (("point_id", ""), ("compute", ""), ("network", ""), ("warmup", 0)):
        if col not in df.columns:
            df[col] = default
    df["warmup"] = pd.to_numeric(df["warmup"], errors="coerce").fillna(0).astype(int)
    return df, csv, trace


def _keyed(df: pd.DataFrame, cols: list[str], role: str, csv: Path) -> pd.DataFrame:
    out = df.copy()
    for c in cols:
        out[c] = df[c].map(_norm) if c in df.columns else ""
    out["_key"] = list(zip(*(out[c] for c in cols)))
    t = pd.to_numeric(out["time_s"], errors="coerce")
    bad, named = out[~(t > 0)], _varying(cols, out)
    if len(bad):
        pts = "; ".join(f"{_describe(r, named)} (time_s={r['time_s']})" for _, r in bad.head(5).iterrows())
        raise CompareError(f"{role} {csv}: {len(bad)} row(s) with a time_s that is not a positive number: {pts}.")
    out["time_s"] = t
    dup = out[out["_key"].duplicated(keep=False)]
    if len(dup):
        differ = [c for c in out.columns if c not in cols and c.startswith(("network", "compute", "net_", "data_scale"))
                  and dup[c].astype(str).nunique() > 1]
        raise CompareError(f"{role} {csv}: {dup['_key'].nunique()} point(s) appear more than once, e.g. "
                           f"{_describe(dup.iloc[0], named)}; they differ in {', '.join(differ) or 'columns outside the key'}"
                           f". Pick one with --{role.lower()}-where COLUMN=VALUE (e.g. compute=p100).")
    return out


def join_points(pred: pd.DataFrame, meas: pd.DataFrame, files: tuple[Path, Path], allow_partial: bool = False
                ) -> tuple[pd.DataFrame, list[str]]:
    """One row per point in both: key columns, ids, pred_s, meas_s, rel_err; and warnings."""
    cols = key_columns(pred, meas)
    p, m = _keyed(pred, cols, "PRED", files[0]), _keyed(meas, cols, "MEAS", files[1])
    only_p = p[~p["_key"].isin(set(m["_key"]))]
    only_m = m[~m["_key"].isin(set(p["_key"]))]
    n_common = len(p) - len(only_p)
    if n_common == 0:
        differ = [c for c in cols if not set(p[c]) & set(m[c])]
        raise CompareError(f"no point of PRED {files[0]} ({len(p)} points) is in MEAS {files[1]} ({len(m)} points)"
                           + (f"; no value in common in column(s) {', '.join(differ)}" if differ else "")
                           + ". Points are matched on " + ", ".join(cols) + ".")
    msgs, named = [], _varying(cols, p, m)
    for side, rows, this, other in (("PRED", only_p, files[0], files[1]), ("MEAS", only_m, files[1], files[0])):
        if len(rows):
            shown = "; ".join(_describe(r, named) for _, r in rows.head(8).iterrows())
            more = f"; and {len(rows) - 8} more" if len(rows) > 8 else ""
            msgs.append(f"{len(rows)} point(s) of {side} {this} are not in {other}: {shown}{more}")
    if msgs and not allow_partial:
        raise CompareError(". ".join(msgs) + f". Measure (or simulate) them, or pass --allow-partial to compare the "
                           f"{n_common} point(s) in common.")
    cpu = ["cpu_s"] if "cpu_s" in p and "cpu_s" in m else []
    j = p.merge(m[["_key", "point_id", "time_s", "compute", "warmup"] + cpu], on="_key", suffixes=("_p", "_m"))
    out = j[cols].copy()
    out["pred_point_id"], out["meas_point_id"] = j["point_id_p"], j["point_id_m"]
    for side, suf in (("pred", "_p"), ("meas", "_m")):
        out[f"{side}_compute"] = j[f"compute{suf}"]
        out[f"{side}_warmup"] = j[f"warmup{suf}"].astype(int)
    out["pred_network"] = j["network"]
    out["pred_s"], out["meas_s"] = j["time_s_p"], j["time_s_m"]
    out["rel_err"] = (out["pred_s"] - out["meas_s"]) / out["meas_s"]
    if cpu:   # CPU seconds per rank and iteration: the model's core-seconds against the ranks' process CPU
        out["pred_cpu_s"] = pd.to_numeric(j["cpu_s_p"], errors="coerce")
        out["meas_cpu_s"] = pd.to_numeric(j["cpu_s_m"], errors="coerce")
    return out, msgs


# -- the comparison ----------------------------------------------------------------
def error_grid(points: pd.DataFrame, rows: str = "P", cols: str = "n", most: int = 12) -> pd.DataFrame | None:
    """Median |error| per (``rows``, ``cols``) value, where both vary (2 to
    ``most`` values each): where a sweep's error sits, e.g. short messages
    at many ranks per core. None otherwise."""
    if rows not in points or cols not in points:
        return None
    if not all(2 <= points[c].nunique() <= most for c in (rows, cols)):
        return None
    err = pd.to_numeric(points["rel_err"], errors="coerce").abs()
    return err.groupby([points[rows], points[cols]]).median().unstack(cols)


@dataclass
class Comparison:
    points: pd.DataFrame
    phases: pd.DataFrame
    files: tuple
    notes: list = field(default_factory=list)
    written: list = field(default_factory=list)
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)   # :mod:`.kernels`

    def frame(self) -> pd.DataFrame:
        """compare.csv: level 'point' rows, then level 'phase' rows."""
        pts = self.points.assign(level="point", phase="", kind="")
        out = pd.concat([pts, self.phases.assign(level="phase")], ignore_index=True) if len(self.phases) else pts
        lead = ["level", "phase", "kind"] + [c for c in self.points.columns if c not in ("pred_s", "meas_s", "rel_err")]
        return out[lead + ["pred_s", "meas_s", "rel_err"]]


def _read_trace(path: Path) -> pd.DataFrame | None:
    try:
        t = read_csv(path)
    except pd.errors.EmptyDataError:
        return None
    need = {"point_id", "iteration", "rank", "phase", "start_s", "end_s"}
    return t if need <= set(t.columns) and len(t) else None


def _current(medians: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame | None:
    """The rows of a phases.csv whose point still has the time they were taken with in its side's
    ``rows`` (a point run again since keeps its trace's phases); None if none is left."""
    if "point_time_s" not in medians:
        return None
    now = dict(zip(rows["point_id"].astype(str), pd.to_numeric(rows["time_s"], errors="coerce")))
    t = medians["point_id"].astype(str).map(now)
    keep = medians[np.isclose(t.to_numpy(dtype=float), medians["point_time_s"].to_numpy(dtype=float), rtol=1e-12)]
    return keep if len(keep) else None


def compare(pred, meas, allow_partial: bool = False, pred_where=(), meas_where=()) -> Comparison:
    p, pcsv, ptrace = load_side(pred, "PRED", pred_where)
    m, mcsv, mtrace = load_side(meas, "MEAS", meas_where)
    points, notes = join_points(p, m, (pcsv, mcsv), allow_partial)
    for role, df, csv in (("PRED", p, pcsv), ("MEAS", m, mcsv)):
        if "time_median_s" not in df.columns:
            notes.append(f"{role} {csv} predates time_s as the mean over periods: its time_s is the median")
    phases = calls = pd.DataFrame()
    if ptrace is None or mtrace is None:
        lacking = " and ".join(str(c.parent) for c, t in ((pcsv, ptrace), (mcsv, mtrace)) if t is None)
        notes.append(f"no per-phase comparison: {lacking} has no trace.csv (run with --trace)")
    else:
        traces = [_read_trace(f) for f in (ptrace, mtrace)]
        bad = [str(f) for f, t in zip((ptrace, mtrace), traces) if t is None]
        if bad:
            notes.append(f"no per-phase comparison: {' and '.join(bad)} has no trace records")
        else:
            medians = []
            for role, csv, rows in (("predicted", pcsv, p), ("measured", mcsv, m)):
                f = csv.parent / PHASES_CSV
                medians.append(_current(read_csv(f), rows) if f.is_file() else None)
                if medians[-1] is not None:
                    notes.append(f"{role} phases: each phase's median over the repeats ({f})")
            phases, more = join_phases(points, *traces, *medians)
            notes += more
            calls = join_kernels(points, *traces)
    return Comparison(points, phases, (pcsv, mcsv, ptrace, mtrace), notes, kernels=calls)


def default_out(pred, meas) -> Path:
    """``<MEAS folder>/compare_<PRED folder name>/``: one measurement, several predictions."""
    pcsv, _ = locate(pred, "PRED")
    mcsv, _ = locate(meas, "MEAS")
    return mcsv.parent / f"compare_{pcsv.parent.resolve().name}"


def fmt_time(s: float) -> str:
    if not np.isfinite(s):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale * (1 - 5e-4):  # 999.99999 ns is "1 us"
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns" if s else "0"


def fmt_err(e: float) -> str:
    return f"{100 * e:+.1f}%" if np.isfinite(e) else "-"


def report(c: Comparison) -> str:
    """The printed tables: per point, then per phase (medians over points)."""
    pts = c.points
    shown = [k for k in SHOWN if k in ("algorithm", "P") or (k in pts and pts[k].nunique() > 1)]
    t = pts[shown].copy()
    t["predicted"], t["measured"] = pts["pred_s"].map(fmt_time), pts["meas_s"].map(fmt_time)
    t["error"] = pts["rel_err"].map(fmt_err)
    med, p90 = error_stats(pts["rel_err"])
    signed = pd.to_numeric(pts["rel_err"], errors="coerce").dropna()
    lines = [f"predicted {c.files[0]}  vs  measured {c.files[1]}", t.to_string(index=False),
             f"|error| over {len(pts)} points: median {100 * med:.1f}%, p90 {100 * p90:.1f}%"]
    if len(signed):   # a bias, not scatter, if nearly every point is on one side
        lines.append(f"signed error: median {100 * signed.median():+.1f}%; {int((signed < 0).sum())} of "
                     f"{len(signed)} points predicted low, {int((signed > 0).sum())} high")
    grid = error_grid(pts)
    if grid is not None:
        shown_grid = grid.apply(lambda col: col.map(lambda e: f"{100 * e:.1f}%" if np.isfinite(e) else "-"))
        lines += ["median |error| by P (rows) and n (columns):", shown_grid.to_string()]
    if "pred_cpu_s" in pts:
        r = (pts["meas_cpu_s"] / pts["pred_cpu_s"]).replace([np.inf, -np.inf], np.nan).dropna()
        if len(r):
            lines.append(f"CPU per rank and iteration, measured / predicted over {len(r)} points: median "
                         f"{r.median():.2f}, p10 {r.quantile(0.1):.2f}, p90 {r.quantile(0.9):.2f} (measured: the "
                         f"ranks' process CPU, waiting included; predicted: the core-seconds the model charges)")
    if len(c.phases):
        s, hidden = phase_summary(c.phases)
        s = s[["phase", "kind", "points", "predicted", "measured", "median |err|", "p90 |err|"]]
        for col in ("predicted", "measured"):
            s[col] = s[col].map(fmt_time)
        for col in ("median |err|", "p90 |err|"):
            s[col] = s[col].map(lambda e: f"{100 * e:.1f}%" if np.isfinite(e) else "-")
        lines += ["", "per phase (max over ranks of the union of the phase's records, median over measured "
                      "iterations; times are medians over points):", s.to_string(index=False)]
        lines += [f"({n} phases under {p}/ not shown; they are in compare.csv)" for p, n in hidden.items()]
        lines += [f"|error| over {n} (point, phase) pairs of {kind} phases: median {100 * m:.1f}%, p90 {100 * q:.1f}%"
                  for kind, (n, m, q) in by_kind(c.phases).items()]
    return "\n".join(lines + (kernel_report(c.kernels, fmt_time) if len(c.kernels) else []))


def run_compare(pred, meas, out=None, plot: bool = True, allow_partial: bool = False, pred_where=(),
                meas_where=(), echo=print, warn=None) -> Comparison:
    """What ``simsparse compare`` does: compare, print, write compare.csv (and compare.png)."""
    c = compare(pred, meas, allow_partial, pred_where, meas_where)
    out = Path(out) if out else default_out(pred, meas)
    for note in c.notes:
        (warn or echo)(f"simsparse: {note}")
    echo(report(c))
    frame = c.frame()
    atomic_write(out / "compare.csv", lambda tmp: frame.to_csv(tmp, index=False))
    c.written.append(out / "compare.csv")
    if len(c.kernels):
        atomic_write(out / "kernels.csv", lambda tmp: c.kernels.to_csv(tmp, index=False))
        c.written.append(out / "kernels.csv")
    if plot:
        from .plot import plot_compare

        c.written.append(plot_compare(c, out / "compare.png", error_stats(c.points["rel_err"]),
                                      phase_summary(c.phases)[0] if len(c.phases) else None))
    echo("wrote " + ", ".join(str(w) for w in c.written))
    return c
