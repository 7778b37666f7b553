"""Per-phase times of a trace, and the comparison of two sides' phases.

**Phase time.** For a point and a phase path ``p`` (and each of its ancestors:
``split_reduce`` covers ``split_reduce/allgather``; a bucket's ``task`` record
has phase ``comm/b3``, so ``comm`` covers all buckets), take the records whose
phase is ``p`` or below it, of every lane and op (messages and device work:
``compute:*``, ``forward``, ``backward``). Per rank and iteration the phase's
time is the length of the union of their ``[start_s, end_s]`` intervals; an
iteration's time is the maximum over ranks (0 where the phase did not run),
and the point's is the mean over whole periods of the algorithm's periodic
work, like ``time_s``: the measured iterations (those in the trace from that
side's ``warmup`` on) weighed by the trace's ``weight`` column
(:mod:`.period`; a trace without it, written before, weighs them equally).
Where the measured folder holds ``phases.csv`` (``validate`` with repeats:
each phase's median over the repeats, :mod:`.repeats`), its times replace
the measured trace's.

**Kind.** A phase is a *communication* phase where either side's trace has
a message (``send`` or ``recv``) in it or below it, else a *compute* phase
(only kernels: a top-k, a quantization). Issue 21 states its aim for the
iteration time and the communication phases; the compute phases are
kernels, compared call by call in ``kernels.csv`` (:mod:`.kernels`), and
summarised beside them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .kernels import measured_records

#: file of a measured folder with each phase's median over repeats (written by :mod:`.repeats`)
PHASES_CSV = "phases.csv"
#: trace ops that are messages
MESSAGE_OPS = ("send", "recv")
#: the ``kind`` of a phase row
COMMUNICATION, COMPUTE = "communication", "compute"


def error_stats(rel_err: pd.Series) -> tuple[float, float]:
    """(median, p90) of |error|, NaN ignored."""
    a = np.abs(pd.to_numeric(rel_err, errors="coerce").dropna().to_numpy())
    return (float(np.median(a)), float(np.percentile(a, 90))) if a.size else (float("nan"), float("nan"))


def _with_ancestors(phases) -> dict:
    """Each phase path -> itself and its ancestors (``a/b`` -> ``a``, ``a/b``)."""
    return {ph: ["/".join(ph.split("/")[:i + 1]) for i in range(ph.count("/") + 1)] for ph in phases}


def phase_times(trace: pd.DataFrame, warmup: dict[str, int]) -> pd.DataFrame:
    """Per (point_id, phase): the phase time defined in the module docstring
    (``warmup`` maps point_id to its warm-up iterations)."""
    t = measured_records(trace, warmup)
    if t.empty:
        return pd.DataFrame(columns=["point_id", "phase", "time_s"])
    it = t.groupby(["point_id", "iteration"])
    weight = it["weight"].first() if "weight" in t.columns else pd.Series(1.0, it.size().index)
    prefixes = _with_ancestors(t["phase"].astype(str).unique())
    t = t.assign(phase=t["phase"].astype(str).map(prefixes)).explode("phase")
    g = ["point_id", "phase", "iteration", "rank"]
    t = t.sort_values(g + ["start_s"]).reset_index(drop=True)
    end = t["end_s"].to_numpy(dtype=float)
    start = t["start_s"].to_numpy(dtype=float)
    # the new coverage of a record: the part past the max end of the earlier records of its group
    prev = t.groupby(g, sort=False)["end_s"].cummax().groupby([t[c] for c in g], sort=False).shift(1)
    covered = np.maximum(0.0, end - np.maximum(start, prev.fillna(-np.inf).to_numpy()))
    t = t.assign(covered=covered)
    per_rank = t.groupby(g, sort=False)["covered"].sum()
    per_iter = per_rank.groupby(level=[0, 1, 2]).max()
    rows = []
    for (pid, phase), s in per_iter.groupby(level=[0, 1]):
        w = weight.loc[pid]
        vals = s.droplevel([0, 1]).reindex(w.index, fill_value=0.0)
        rows.append((pid, phase, float(np.average(vals, weights=w))))
    return pd.DataFrame(rows, columns=["point_id", "phase", "time_s"])


def message_phases(trace: pd.DataFrame) -> set:
    """The (point_id, phase) pairs with a message in or below the phase, in any iteration. A
    schedule's task phase (a bucket's ``comm/b3``, the phase of its lane's ``task`` record) holds
    the messages of its lane, which are posted in the collective's own phases."""
    t = trace[trace["op"].astype(str).isin(MESSAGE_OPS)]
    pairs = t[["point_id", "phase"]]
    if "lane" in t.columns:
        lanes = t.loc[t["lane"].astype(str) != "main", ["point_id", "lane"]].rename(columns={"lane": "phase"})
        pairs = pd.concat([pairs, lanes], ignore_index=True)
    pairs = pairs.astype(str).drop_duplicates()
    prefixes = _with_ancestors(pairs["phase"].unique())
    return {(pid, a) for pid, ph in pairs.itertuples(index=False) for a in prefixes[ph]}


def join_phases(points: pd.DataFrame, pred_trace: pd.DataFrame, meas_trace: pd.DataFrame,
                pred_phases: pd.DataFrame | None = None,
                meas_phases: pd.DataFrame | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per (joined point, phase): the point's key, phase, kind, pred_s, meas_s, rel_err.
    ``pred_phases`` and ``meas_phases`` (a folder's phases.csv: the median over repeats,
    :mod:`.repeats`) replace that side's trace's phase times for the points they have."""
    def side(trace, role, medians):
        t = phase_times(trace, dict(zip(points[f"{role}_point_id"], points[f"{role}_warmup"])))
        if medians is None:
            return t
        return pd.concat([t[~t["point_id"].isin(medians["point_id"])], medians[["point_id", "phase", "time_s"]]],
                         ignore_index=True)

    pt, mt = side(pred_trace, "pred", pred_phases), side(meas_trace, "meas", meas_phases)
    sent = message_phases(pred_trace) | message_phases(meas_trace)
    notes, frames = [], []
    for _, r in points.iterrows():
        a = pt[pt["point_id"] == r["pred_point_id"]].set_index("phase")["time_s"]
        b = mt[mt["point_id"] == r["meas_point_id"]].set_index("phase")["time_s"]
        if a.empty or b.empty:
            side = "pred" if a.empty else "meas"
            notes.append(f"no trace records of {side.upper()} point {r[side + '_point_id']} ({r['algorithm']} "
                         f"P={r['P']}): no phases compared for it")
            continue
        both = pd.concat([a.rename("pred_s"), b.rename("meas_s")], axis=1).fillna(0.0).reset_index(names="phase")
        for c in points.columns:
            if c not in ("pred_s", "meas_s", "rel_err"):
                both[c] = r[c]
        both["kind"] = [COMMUNICATION if (str(r["pred_point_id"]), ph) in sent
                        or (str(r["meas_point_id"]), ph) in sent else COMPUTE for ph in both["phase"]]
        frames.append(both)
    if not frames:
        return pd.DataFrame(columns=list(points.columns) + ["phase", "kind"]), notes
    ph = pd.concat(frames, ignore_index=True)
    ph["rel_err"] = (ph["pred_s"] - ph["meas_s"]) / ph["meas_s"].where(ph["meas_s"] > 0)  # NaN where nothing measured
    return ph, notes


def phase_summary(phases: pd.DataFrame, crowd: int = 8) -> tuple[pd.DataFrame, dict]:
    """Per phase over points: medians of the times, median and p90 of |error|,
    longest measured first. Children of a phase with more than ``crowd``
    children (a schedule's per-bucket ``comm/b<i>``) are left out; the second
    value counts them per parent (they stay in compare.csv)."""
    names = list(phases["phase"].unique())
    kids = pd.Series([n.rsplit("/", 1)[0] for n in names if "/" in n]).value_counts()
    crowded = set(kids[kids > crowd].index)
    rows = []
    for phase, g in phases.groupby("phase", sort=False):
        if "/" in phase and phase.rsplit("/", 1)[0] in crowded:
            continue
        m, q = error_stats(g["rel_err"])
        rows.append({"phase": phase, "kind": g["kind"].iloc[0] if "kind" in g else "", "points": len(g),
                     "predicted": g["pred_s"].median(), "measured": g["meas_s"].median(),
                     "median": g["rel_err"].median(), "min": g["rel_err"].min(), "max": g["rel_err"].max(),
                     "median |err|": m, "p90 |err|": q})
    s = pd.DataFrame(rows).sort_values(["measured", "phase"], ascending=[False, True]).reset_index(drop=True)
    return s, {p: int(kids[p]) for p in sorted(crowded)}




def by_kind(phases: pd.DataFrame) -> dict:
    """``{kind: (phase rows, median |error|, p90 |error|)}`` over the (point, phase) rows of each kind."""
    if "kind" not in phases:
        return {}
    return {k: (len(g), *error_stats(g["rel_err"])) for k, g in phases.groupby("kind", sort=True)}
