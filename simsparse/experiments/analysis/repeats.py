"""A measurement repeated: what ``validate`` compares against, and its own floor.

A short point on a testbed moves by a quarter between launches (docs/validation.md), so
``validate`` measures it R times and compares the prediction with the median:

* **per point** the repeat of median ``time_s`` (the lower one for an even count) goes into the
  measured folder with its trace (:func:`median_repeat`);
* **per phase** each phase's own median over the repeats (:func:`median_phases`): a phase is a
  few milliseconds of one run, and the repeat whose whole time is the median need not be the one
  whose phases are; written as ``phases.csv`` beside ``results.csv``, which ``compare`` reads
  instead of the trace's phases (:func:`simsparse.experiments.analysis.phases.join_phases`);
* **the floor**: each repeat against the median of the others (``one_vs_rest``), per point and
  per phase, is the error a perfect model would score against one launch; :func:`error_on`
  scores the prediction on the same points.
"""
from __future__ import annotations

import shutil

import numpy as np
import pandas as pd

from ...files import atomic_write
from ..results.store import read_csv
from .phases import COMMUNICATION, COMPUTE, PHASES_CSV, message_phases, phase_times


def to_repeat(first, groups, below: float) -> list[str]:
    """The measured points that ``first`` (the first repeat's store) timed below ``below`` seconds."""
    return [mid for mid in groups if mid in first.rows and first.rows[mid]["time_s"] < below]


def _one_vs_rest(ts) -> list[float]:
    """|t_i / median(t_j, j != i) - 1| for each repeat (none where the others' median is 0)."""
    out = []
    for i, t in enumerate(ts):
        rest = float(np.median(ts[:i] + ts[i + 1:]))
        if rest > 0:
            out.append(abs(t / rest - 1))
    return out


def _stats(values, prefix: str = "") -> dict:
    """Median and p90 of ``values`` (NaN for none)."""
    a = np.asarray(values if len(values) else [np.nan], dtype=float)
    return {f"{prefix}median": float(np.median(a)), f"{prefix}p90": float(np.percentile(a, 90))}


def _by_time(runs, pid) -> tuple[list, tuple]:
    """The repeats' (row, store) of ``pid`` by time, and the median one (the lower for an even count)."""
    rows = sorted(((st.rows[pid], st) for st in runs if pid in st.rows), key=lambda x: x[0]["time_s"])
    return rows, rows[(len(rows) - 1) // 2]


def median_repeat(runs, pids, out) -> dict:
    """Per point, the repeat whose ``time_s`` is the median goes into ``out`` (a results store) with
    its trace, so every record of the point comes from one run; the row gains ``repeats``,
    ``time_repeat_min_s`` and ``time_repeat_max_s``. Returns the median and p90 over the points
    measured more than once of (max - min) / median, of each repeat against the median of the
    others (``one_vs_rest_*``), and those ``repeated`` point ids."""
    spreads, one_vs_rest, repeated = [], [], []
    for pid in pids:
        rows, (row, st) = _by_time(runs, pid)
        ts = [r["time_s"] for r, _ in rows]
        if st.has_trace(pid):   # the file as it is: no parse and rewrite
            atomic_write(out.trace_file(pid), lambda tmp, src=st.trace_file(pid): shutil.copyfile(src, tmp))
        else:
            out.save_trace(pid, None)
        out.add({**row, "repeats": len(rows), "time_repeat_min_s": min(ts), "time_repeat_max_s": max(ts)})
        if len(ts) > 1:
            spreads.append((max(ts) - min(ts)) / row["time_s"])
            one_vs_rest += _one_vs_rest(ts)
            repeated.append(pid)
    out.combine_traces(True)
    return {**_stats(spreads), "points": len(spreads), **_stats(one_vs_rest, "one_vs_rest_"), "repeated": repeated}


def median_phases(runs, pids, out_dir) -> dict:
    """Every phase's time (:func:`~.phases.phase_times`) in every repeat of ``pids``; per (point,
    phase) their median goes to ``out_dir/phases.csv`` (with ``repeats``, a phase missing from a
    repeat counting 0 there, as ``compare`` counts it, and ``point_time_s``, the median repeat's
    ``time_s``: ``compare`` ignores the medians of a point measured again since). Returns the
    phases' one-vs-rest median and p90 over the (point, phase) pairs measured more than once, and
    the same over the communication phases (:mod:`.phases`) alone."""
    frames, sent = [], set()
    for r, st in enumerate(runs):
        for pid in pids:
            if pid in st.rows and st.has_trace(pid):
                t = read_csv(st.trace_file(pid))
                if len(t):
                    sent |= message_phases(t)
                    frames.append(phase_times(t, {pid: int(st.rows[pid].get("warmup", 0) or 0)}).assign(run=r))
    if not frames:
        (out_dir / PHASES_CSV).unlink(missing_ok=True)
        return {**_stats([], "phases_one_vs_rest_"), **_stats([], f"{COMMUNICATION}_one_vs_rest_"),
                **_stats([], f"{COMPUTE}_one_vs_rest_"), "phases": 0}
    per = pd.concat(frames, ignore_index=True)
    point_s = {pid: float(_by_time(runs, pid)[1][0]["time_s"]) for pid in per["point_id"].unique()}
    ran = per.groupby("point_id")["run"].unique()          # the repeats that measured each point
    rows, floor, kind = [], [], {COMMUNICATION: [], COMPUTE: []}
    for (pid, phase), g in per.groupby(["point_id", "phase"], sort=False):
        ts = g.set_index("run")["time_s"].reindex(ran[pid], fill_value=0.0).tolist()
        rows.append((pid, phase, float(np.median(ts)), len(ts), point_s[pid]))
        if len(ts) > 1:
            floor += _one_vs_rest(ts)
            kind[COMMUNICATION if (str(pid), phase) in sent else COMPUTE] += _one_vs_rest(ts)
    df = pd.DataFrame(rows, columns=["point_id", "phase", "time_s", "repeats", "point_time_s"])
    atomic_write(out_dir / PHASES_CSV, lambda tmp: df.to_csv(tmp, index=False))
    by_kind = {k: v for c, f in kind.items() for k, v in _stats(f, f"{c}_one_vs_rest_").items()}
    return {**_stats(floor, "phases_one_vs_rest_"), **by_kind, "phases": int((df["repeats"] > 1).sum())}


def error_on(points, pids: list) -> dict:
    """The prediction's median and p90 of |error| on the measured points ``pids`` (the rows of a
    comparison's ``points`` or ``phases``), to set beside the repeats' own scatter on them."""
    e = points[points["meas_point_id"].isin(pids)]["rel_err"].abs().dropna().to_numpy()
    return {**_stats(e), "points": len(e)}
