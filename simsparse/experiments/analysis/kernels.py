"""Kernel calls compared: each kernel's measured calls against its predicted ones.

A point's error mixes the network model's and the compute model's. This
separates the compute model's part. For every joined point and every kernel
(trace op ``compute:<kernel>``), over each side's measured iterations (from
its ``warmup`` on), a call's time is its record's ``end_s - start_s``: on a
shared core the wall time while the core is shared, on both sides, so the
core sharing is compared too. Per (point, kernel) the row gives each side's
calls, median call and mean call (weighed by the trace's ``weight``, as
``time_s`` is), and ``ratio``, the measured mean over the predicted mean.

``compare`` writes the rows to ``kernels.csv`` and prints, per kernel whose
measured mean call takes at least :data:`SHOWN_FROM_S`, the median, lowest and
highest ratio over points, and over all those calls the measured time over
the predicted (the compute model's bias where the kernels take time).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: kernels whose measured mean call is shorter than this are left out of the printed summary
SHOWN_FROM_S = 1e-3
COLUMNS = ["op", "pred_calls", "meas_calls", "pred_median_s", "meas_median_s", "pred_mean_s", "meas_mean_s",
           "ratio"]


def measured_records(trace: pd.DataFrame, warmup: dict[str, int]) -> pd.DataFrame:
    """The records of the points in ``warmup`` (point_id -> its warm-up iterations) from their first measured
    iteration on."""
    t = trace[trace["point_id"].isin(warmup)]
    return t[t["iteration"] >= t["point_id"].map(warmup)]


def call_stats(trace: pd.DataFrame, warmup: dict[str, int]) -> pd.DataFrame:
    """Per (point_id, op) of the kernel records of the measured iterations: calls, median and weighed mean
    duration (``warmup`` maps point_id to its warm-up iterations)."""
    t = measured_records(trace, warmup)
    t = t[t["op"].astype(str).str.startswith("compute:")]
    if t.empty:
        return pd.DataFrame(columns=["point_id", "op", "calls", "median_s", "mean_s"])
    d = t["end_s"].to_numpy(float) - t["start_s"].to_numpy(float)
    w = t["weight"].to_numpy(float) if "weight" in t.columns else np.ones(len(t))
    w = np.where(w > 0, w, 0.0) if np.any(w > 0) else np.ones(len(t))
    f = pd.DataFrame({"point_id": t["point_id"].to_numpy(), "op": t["op"].astype(str).to_numpy(), "d": d, "w": w,
                      "wd": w * d})
    g = f.groupby(["point_id", "op"], sort=False)
    out = g.agg(calls=("d", "size"), median_s=("d", "median"), wsum=("w", "sum"), wdsum=("wd", "sum"))
    out["mean_s"] = out["wdsum"] / out["wsum"].where(out["wsum"] > 0)
    return out.drop(columns=["wsum", "wdsum"]).reset_index()


def join_kernels(points: pd.DataFrame, pred_trace: pd.DataFrame, meas_trace: pd.DataFrame) -> pd.DataFrame:
    """One row per (joined point, kernel run on both sides): the point's key, then :data:`COLUMNS`."""
    ps = call_stats(pred_trace, dict(zip(points["pred_point_id"], points["pred_warmup"])))
    mk = call_stats(meas_trace, dict(zip(points["meas_point_id"], points["meas_warmup"])))
    key = [c for c in points.columns if c not in ("pred_s", "meas_s", "rel_err")]
    j = points[key].merge(ps.add_prefix("pred_").rename(columns={"pred_op": "op"}),
                          on="pred_point_id")
    j = j.merge(mk.add_prefix("meas_").rename(columns={"meas_op": "op"}), on=["meas_point_id", "op"])
    j["ratio"] = j["meas_mean_s"] / j["pred_mean_s"].where(j["pred_mean_s"] > 0)
    return j[key + COLUMNS].reset_index(drop=True)


def kernel_summary(rows: pd.DataFrame, shown_from_s: float = SHOWN_FROM_S) -> tuple[pd.DataFrame, float]:
    """Per kernel with a measured mean call of at least ``shown_from_s``: points, median, min and max of
    ``ratio``, the median measured call; longest first. Second value: over those rows, the measured
    calls' total time over the predicted calls' (each row's mean times its measured calls)."""
    r = rows[(rows["meas_mean_s"] >= shown_from_s) & rows["ratio"].notna()]
    if r.empty:
        return pd.DataFrame(columns=["kernel", "points", "measured call", "ratio median", "min", "max"]), np.nan
    s = (r.groupby("op").agg(points=("ratio", "size"), measured=("meas_median_s", "median"),
                             med=("ratio", "median"), lo=("ratio", "min"), hi=("ratio", "max"))
         .sort_values("measured", ascending=False).reset_index())
    s.columns = ["kernel", "points", "measured call", "ratio median", "min", "max"]
    total = float((r["meas_mean_s"] * r["meas_calls"]).sum() / (r["pred_mean_s"] * r["meas_calls"]).sum())
    return s, total


def kernel_report(rows: pd.DataFrame, fmt_time) -> list[str]:
    """The printed lines of the summary (none without rows)."""
    s, total = kernel_summary(rows)
    if s.empty:
        return []
    s["kernel"] = s["kernel"].str.removeprefix("compute:")
    s["measured call"] = s["measured call"].map(fmt_time)
    for c in ("ratio median", "min", "max"):
        s[c] = s[c].map(lambda v: f"{v:.2f}")
    return ["", f"kernel calls, measured mean over predicted mean per point (kernels of at least "
                f"{fmt_time(SHOWN_FROM_S)} a call; all in kernels.csv):", s.to_string(index=False),
            f"those calls took {total:.2f}x their predicted time in all"]
