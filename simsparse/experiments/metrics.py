"""Turn per-iteration measurements into one results row (both backends)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .point import Point

ROW_COLUMNS = ["point_id", "backend", "schedule", "model", "batch_size", "algorithm", "params", "P", "n", "density", "k",
               "dtype", "seed", "network", "compute", "iterations", "warmup", "time_s", "time_min_s", "time_max_s",
               "t_compute_s", "t_comm_s", "t_iter_s", "t_forward_s", "t_backward_s", "t_sparsify_s",
               "t_comm_nonoverlap_s", "merged_groups",
               "bytes_sent_max", "bytes_total", "msgs_total", "correct", "max_rel_err", "sim_events", "wall_s"]
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


@dataclass
class PointOutcome:
    row: dict
    trace: list = field(default_factory=list)     # dict rows
    results: list | None = None                   # last iteration's per-rank results


def summarize(point: Point, backend: str, records: list[IterationRecord], correct: bool | None,
              max_err: float, wall_s: float) -> dict:
    """time_s is the median iteration time over measured iterations (an
    iteration's time is the maximum over ranks); byte counts are per
    iteration, averaged over measured iterations."""
    times = np.array([r.time_s for r in records])
    per_rank = np.array([r.bytes_sent for r in records], dtype=np.float64)
    row = {"point_id": point.point_id(backend), "backend": backend, **point.label_columns()}
    row.update(
        time_s=float(np.median(times)),
        time_min_s=float(times.min()),
        time_max_s=float(times.max()),
        bytes_sent_max=_num(per_rank.max(axis=1).mean()),
        bytes_total=_num(per_rank.sum(axis=1).mean()),
        msgs_total=_num(np.mean([sum(r.msgs_sent) for r in records])),
        correct=correct,
        max_rel_err=max_err,
        sim_events=int(sum(r.events for r in records)),
        wall_s=wall_s,
    )
    if point.schedule:
        # t_iter_s is time_s; the breakdown is the median of each part (the
        # parts of one iteration sum to its time)
        row["t_iter_s"] = row["time_s"]
        for key in BREAKDOWN:
            row[key] = float(np.median([r.breakdown[key] for r in records]))
        row["merged_groups"] = len(point.plan)
        # the same split as a bare collective's: device work, and the wait for communication
        row["t_compute_s"] = row["t_forward_s"] + row["t_backward_s"] + row["t_sparsify_s"]
        row["t_comm_s"] = row["t_comm_nonoverlap_s"]
    elif records and all(r.breakdown for r in records):
        for key in COLLECTIVE_BREAKDOWN:
            row[key] = float(np.median([r.breakdown[key] for r in records]))
    return row


def _num(x: float):
    """Exact integers stay integers (byte counts are compared exactly)."""
    return int(x) if float(x).is_integer() else float(x)
