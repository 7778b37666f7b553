"""``trace.json``: a results folder's trace in the Trace Event format (Perfetto, chrome://tracing).

Layout, for a folder of many points:

* one process per point: ``pid`` = the point's 1-based row in results.csv,
  named "<pid>: <schedule / algorithm params> P=.. n=.. [backend] (<point_id>)";
* one thread per (rank, lane), named "rank 3 / main", "rank 3 / comm/b2",
  sorted by rank then lane; ``tid`` values are unique over the whole file;
* every trace record is a complete event: ``ph: "X"``, ``ts``/``dur`` in
  microseconds from the iteration's start, ``name`` = op, ``cat`` = phase,
  ``args`` = phase, peer, bytes, iteration.

The format requires the complete events of one thread to nest. The real
backend's records of one lane can overlap without nesting (an ``irecv`` and
an ``isend`` in flight together), so such a record goes on an overflow
thread of the same (rank, lane), "rank 3 / main (2)", listed right after it.

Only the first measured iteration of each point (iteration = ``warmup``) is
written by default: traces get big. With ``all_iterations`` every iteration is
laid end to end on the time axis.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from ...files import atomic_write


def _lane_order(lane: str):
    """main first, then lanes in natural order (comm/b2 before comm/b10)."""
    return (lane != "main", [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", lane)])


def _point_name(pid: int, row: dict | None, point_id: str) -> str:
    if row is None:
        return f"{pid}: {point_id}"
    params = row.get("params")
    alg = row["algorithm"] + (f" {params}" if isinstance(params, str) and params else "")
    sched = row.get("schedule")
    if isinstance(sched, str) and sched:
        alg = f"{sched} / {alg}"
    return f"{pid}: {alg} P={row['P']} n={row.get('n', '?')} [{row.get('backend', '?')}] ({point_id})"


def _slots(keys: list, ts: list[int], te: list[int]) -> list[int]:
    """For spans sorted by (key, start, -end): the overflow thread of each within
    its key (rank, lane) so that every thread's spans nest or are disjoint
    (greedy, first fit)."""
    out, stacks, last = [], [], None
    for key, s, e in zip(keys, ts, te):
        if key != last:
            stacks, last = [], key
        for k, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                out.append(k)
                break
        else:
            stacks.append([e])
            out.append(len(stacks) - 1)
    return out


def trace_events(trace: pd.DataFrame, results: pd.DataFrame | None = None, all_iterations: bool = False) -> dict:
    """The Trace Event JSON object of ``trace`` (trace.csv's columns); ``results``
    (results.csv) names the points, orders them and gives each its warm-up."""
    rows = {} if results is None else {str(r["point_id"]): r for r in results.to_dict("records")}
    by_point = {str(k): g for k, g in trace.groupby(trace["point_id"].astype(str), sort=False)}
    order = list(rows) + [p for p in by_point if p not in rows]
    events, tid = [], 0
    for pid, point_id in enumerate(order, start=1):
        t = by_point.get(point_id)
        if t is None:
            continue
        row = rows.get(point_id)
        first = int(row["warmup"]) if row is not None and "warmup" in row else int(t["iteration"].min())
        if not all_iterations:
            t = t[t["iteration"] == (first if (t["iteration"] == first).any() else t["iteration"].min())]
        t = t.copy()
        # from the (first written) iteration's start; later iterations follow the one before
        ends = t.groupby("iteration")["end_s"].max().sort_index()
        offset = (ends.cumsum() - ends).to_dict()
        # whole nanoseconds, so that nesting holds exactly as a viewer rounds ts and dur (us * 1000)
        t["ts"] = ((t["start_s"] + t["iteration"].map(offset)) * 1e9).round().astype("int64")
        t["te"] = ((t["end_s"] + t["iteration"].map(offset)) * 1e9).round().astype("int64").clip(lower=t["ts"])
        lanes = sorted(t["lane"].astype(str).unique(), key=_lane_order)
        t["lane_i"] = t["lane"].astype(str).map({ln: i for i, ln in enumerate(lanes)})
        t = t.sort_values(["rank", "lane_i", "ts", "te"], ascending=[True, True, True, False])
        cols = {c: t[c].tolist() for c in ("rank", "lane_i", "ts", "te", "op", "phase", "peer", "bytes", "iteration")}
        keys = list(zip(cols["rank"], cols["lane_i"]))
        slots = _slots(keys, cols["ts"], cols["te"])
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": _point_name(pid, row, point_id)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tids = {}
        for rank, lane_i, k in sorted(set((r, ln, k) for (r, ln), k in zip(keys, slots))):
            tid += 1
            tids[rank, lane_i, k] = tid
            name = f"rank {rank} / {lanes[lane_i]}" + (f" ({k + 1})" if k else "")
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for (rank, lane_i), k, ts, te, op, phase, peer, nbytes, it in zip(
                keys, slots, cols["ts"], cols["te"], cols["op"], cols["phase"], cols["peer"], cols["bytes"],
                cols["iteration"]):
            events.append({"ph": "X", "name": str(op), "cat": str(phase), "pid": pid, "tid": tids[rank, lane_i, k],
                           "ts": ts / 1000, "dur": (te - ts) / 1000,
                           "args": {"phase": str(phase), "peer": int(peer), "bytes": int(nbytes), "iteration": int(it)}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": "simsparse",
                          "iterations": "all" if all_iterations else "first measured iteration of each point"}}


def write_trace_json(trace: pd.DataFrame, results: pd.DataFrame | None, path, all_iterations: bool = False) -> Path:
    """Write :func:`trace_events` to ``path`` atomically (mode 0644 under the usual umask)."""
    obj = trace_events(trace, results, all_iterations)

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, separators=(",", ":"))

    atomic_write(Path(path), write)
    return Path(path)
