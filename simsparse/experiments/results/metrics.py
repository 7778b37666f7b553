"""Turn per-iteration measurements into one results row (both backends)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...period import Cycle
from ..config.point import Point

#: ``iteration``: the loop's position (0 .. warm-up first); ``weight``: the
#: iteration's weight in the point's mean over periods (0 in warm-up)
TRACE_COLUMNS = ["point_id", "iteration", "rank", "lane", "phase", "op", "peer", "bytes", "start_s", "end_s",
                 "weight"]


ROW_COLUMNS = ["point_id", "backend", "schedule", "model", "batch_size", "algorithm", "params", "P", "n", "density", "k",
               "dtype", "seed", "network", "compute", "iterations", "warmup", "time_s", "time_median_s",
               "time_min_s", "time_max_s", "period",
               "t_compute_s", "t_comm_s", "t_iter_s", "t_forward_s", "t_backward_s", "t_sparsify_s",
               "t_comm_nonoverlap_s", "merged_groups", "cpu_s",
               "bytes_sent_max", "bytes_total", "msgs_total", "correct", "max_rel_err", "sim_events", "wall_s",
               "peak_rss_B"]
BREAKDOWN = ("t_forward_s", "t_backward_s", "t_sparsify_s", "t_comm_nonoverlap_s")
#: a bare collective's slowest rank: device busy time and the rest (messages, waiting)
COLLECTIVE_BREAKDOWN = ("t_compute_s", "t_comm_s")


@dataclass
class IterationRecord:
    time_s: float                # iteration time: max over ranks
    bytes_sent: list             # per rank
    msgs_sent: list              # per rank
    events: int = 0
    breakdown: dict | None = None  # the slowest rank's time by kind (BREAKDOWN or COLLECTIVE_BREAKDOWN keys)
    counter: int = 0             # the iteration as the algorithm counts it (its kind: period.Cycle.kind)


@dataclass
class PointOutcome:
    row: dict
    trace: list = field(default_factory=list)     # dict rows
    results: list | None = None                   # last iteration's per-rank results


def summarize(point: Point, backend: str, records: list[IterationRecord], cycle: Cycle, correct: bool | None,
              max_err: float, wall_s: float) -> dict:
    """An iteration's time is the maximum over ranks. ``time_s`` is its mean
    over whole periods of the algorithm's periodic work (``period``
    iterations; :mod:`.period`): the mean of the measured iterations when
    there is none. ``time_median_s``, ``time_min_s`` and ``time_max_s`` are
    over the measured iterations (those added for missing kinds included). Byte and message counts and the breakdown
    are per iteration, means over periods like ``time_s`` (so the parts of
    the breakdown sum to it)."""
    times = np.array([r.time_s for r in records])
    per_rank = np.array([r.bytes_sent for r in records], dtype=np.float64)
    counters = [r.counter for r in records]

    def mean(values):
        return cycle.mean(counters, values)

    row = {"point_id": point.point_id(backend), "backend": backend, **point.label_columns()}
    row.update(
        time_s=float(mean(times)),
        time_median_s=float(np.median(times)),
        time_min_s=float(times.min()),
        time_max_s=float(times.max()),
        period=cycle.length,
        bytes_sent_max=_num(mean(per_rank.max(axis=1))),
        bytes_total=_num(mean(per_rank.sum(axis=1))),
        msgs_total=_num(mean([sum(r.msgs_sent) for r in records])),
        correct=correct,
        max_rel_err=max_err,
        sim_events=int(sum(r.events for r in records)),
        wall_s=wall_s,
    )
    if point.schedule:
        row["t_iter_s"] = row["time_s"]
        for key in BREAKDOWN:
            row[key] = float(mean([r.breakdown[key] for r in records]))
        row["merged_groups"] = len(point.plan)
        # the same split as a bare collective's: device work, and the wait for communication
        row["t_compute_s"] = row["t_forward_s"] + row["t_backward_s"] + row["t_sparsify_s"]
        row["t_comm_s"] = row["t_comm_nonoverlap_s"]
    elif records and all(r.breakdown for r in records):
        for key in COLLECTIVE_BREAKDOWN:
            row[key] = float(mean([r.breakdown[key] for r in records]))
    if records and all(r.breakdown and "cpu_s" in r.breakdown for r in records):
        row["cpu_s"] = float(mean([r.breakdown["cpu_s"] for r in records]))
    return row


def _num(x):
    """Exact integers stay integers (byte counts are compared exactly)."""
    return int(x) if x == int(x) else float(x)
