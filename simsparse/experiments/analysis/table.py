"""Numbers for people: times, bytes and counts with units, and the results
table ``simsparse run`` and ``measure`` print.

The table has one block per combination of the columns that vary besides
the algorithm and P (e.g. ``compute = p100``); columns with one value in every
row are named once above the blocks. Inside a block, rows go by P, then in
the config's order. ``speed-up`` is the baseline's time at the same P in the
same block divided by the row's time (above 1: faster than the baseline).
A line above the blocks says which statistic ``time`` is (``time_s``:
:func:`~simsparse.experiments.results.metrics.summarize`).
"""
from __future__ import annotations

import math

import pandas as pd

from ..results.format import _sig, fmt_bytes, fmt_count, fmt_time

#: the baseline of ``speed-up`` when none is named: the first of these in the results
DEFAULT_BASELINES = ("rabenseifner", "ring", "recursive_doubling")
#: columns that split the table into blocks when they vary
BLOCK_COLUMNS = ["model", "batch_size", "network", "compute", "n", "density", "dtype", "data_scale"]


def series_label(row) -> str:
    """``algorithm {params}``, behind ``schedule /`` for a training iteration."""
    alg = str(row.get("algorithm", ""))
    if str(row.get("algorithm_default", "")) == "True":  # the schedule's own, the config listed none
        alg += " (default)"
    params = row.get("params", "")
    if isinstance(params, str) and params and params != "nan":
        alg += " " + params
    sched = row.get("schedule", "")
    if isinstance(sched, str) and sched and sched != "nan":
        alg = f"{sched} / {alg}"
    return alg


def pick_baseline(labels, wanted: str | None = None) -> str | None:
    """The series to compare against: ``wanted`` (a full label, or the first
    label that starts with it), else the first dense allreduce present."""
    labels = list(dict.fromkeys(labels))
    if wanted:
        for lab in labels:
            if lab == wanted:
                return lab
        for lab in labels:
            if lab.startswith(wanted) or f"/ {wanted}" in lab:
                return lab
        return None
    for name in DEFAULT_BASELINES:
        for lab in labels:
            if lab == name or lab.endswith(f"/ {name}"):
                return lab
    return None


def _present(df: pd.DataFrame, col: str) -> bool:
    return col in df.columns and df[col].astype(str).replace({"nan": "", "None": ""}).str.len().any()


def _vals(df: pd.DataFrame, col: str) -> list:
    return list(dict.fromkeys(df[col].astype(str).replace({"nan": "", "None": ""})))


def _fmt_value(col: str, v) -> str:
    if col == "n":
        return fmt_count(v)
    return str(v)


def results_table(df: pd.DataFrame, baseline: str | None = None) -> tuple[str, list[str]]:
    """The table as text, and notes (e.g. a baseline that was not found)."""
    notes: list[str] = []
    if df.empty:
        return "no results", notes
    df = df.reset_index(drop=True).copy()
    df["_series"] = [series_label(r) for r in df.to_dict("records")]
    base = pick_baseline(df["_series"], baseline)
    if baseline and base is None:
        notes.append(f"--baseline {baseline!r} matches no series; series: {', '.join(dict.fromkeys(df['_series']))}")
    training = _present(df, "schedule")
    cols = [c for c in BLOCK_COLUMNS if _present(df, c)]
    const = [c for c in cols if len(_vals(df, c)) == 1]
    facets = [c for c in cols if c not in const]
    lines = []
    if const:
        lines.append("all rows: " + ", ".join(f"{c} = {_fmt_value(c, df[c].iloc[0])}" for c in const))
    if "period" in df.columns:
        lines.append(_time_note(df))
    if training:
        lines.append("fwd+bwd: the slowest rank's forward and backward passes; other compute: its other device work "
                     "(selection, compression, reductions, copies, the optimizer; t_sparsify_s); comm wait: the rest of "
                     "its iteration")
    if base:
        lines.append(f"speed-up: time of {base} / time, at the same P"
                     + (" and " + ", ".join(facets) if facets else ""))
    groups = df.groupby([df[c].astype(str) for c in facets], sort=False) if facets else [((), df)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        lines.append("")
        if facets:
            lines.append("== " + ", ".join(f"{c} = {_fmt_value(c, v)}" for c, v in zip(facets, key)) + " ==")
        lines.extend(_block(g, base, training))
    return "\n".join(lines), notes


def _time_note(df: pd.DataFrame) -> str:
    """``time``: the mean over a period of each series' periodic work, or over the measured iterations."""
    period = pd.to_numeric(df["period"], errors="coerce")
    periodic = df[period > 1].groupby(period[period > 1].astype(int), sort=True)["_series"].unique()
    over = "; ".join(f"{', '.join(series)}: {p} iterations" for p, series in periodic.items())
    return ("time: mean of an iteration " + (f"over a period of its periodic work ({over}), otherwise " if over else "")
            + "over the measured iterations; the median and the max are time_median_s and time_max_s in the results")


def _block(g: pd.DataFrame, base: str | None, training: bool) -> list[str]:
    g = g.sort_values("P", kind="stable")
    base_t = {}
    if base:
        b = g[g["_series"] == base]
        base_t = dict(zip(b["P"], pd.to_numeric(b["time_s"], errors="coerce")))
    header = ["P", "schedule / algorithm" if training else "algorithm", "time"]
    if base:
        header.append("speed-up")
    if training:
        header += ["fwd+bwd", "other compute", "comm wait", "groups"]
    else:
        header += ["compute", "comm"]
    header += ["sent (busiest)", "sent (all)", "correct"]
    rows = []
    for r in g.to_dict("records"):
        t = pd.to_numeric(r.get("time_s"), errors="coerce")
        cells = [str(r["P"]), r["_series"], fmt_time(t)]
        if base:
            bt = base_t.get(r["P"])
            cells.append(f"{_sig(bt / t)}x" if bt is not None and t and math.isfinite(bt) and t > 0 else "-")
        if training:
            fb = _num(r.get("t_forward_s")) + _num(r.get("t_backward_s"))
            groups = r.get("merged_groups", "")
            cells += [fmt_time(fb), fmt_time(r.get("t_sparsify_s")), fmt_time(r.get("t_comm_nonoverlap_s")),
                      "-" if _missing(groups) else str(int(float(groups)))]
        else:
            cells += [fmt_time(r.get("t_compute_s")), fmt_time(r.get("t_comm_s"))]
        ok = r.get("correct")
        cells += [fmt_bytes(r.get("bytes_sent_max")), fmt_bytes(r.get("bytes_total")),
                  "-" if _missing(ok) else ("yes" if str(ok) == "True" else "NO")]
        rows.append(cells)
    left = {1}  # the series column is text
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    out = []
    for cells in [header] + rows:
        out.append("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                   .rstrip())
    return out


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v) in ("", "nan", "None")


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")
