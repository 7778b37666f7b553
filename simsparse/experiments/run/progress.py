"""Progress of a sweep on stderr: a tqdm bar on a terminal; otherwise (a log
file, a pipe, CI) one line per finished point::

    [3/12] topka P=16 n=1Mi: 0.42 ms simulated in 1.3 s wall; ~25 s left

The time left weighs every point by an estimate of its cost, the data the
backend carries per iteration: ``(warmup + iterations) x P x n x data_scale``
(plus a constant per point), so a sweep whose large-P points come last is
not promised an early finish.
"""
from __future__ import annotations

import sys
import time

from ..config.point import Point
from ..results.format import fmt_count, fmt_duration, fmt_time

#: per-point overhead in the cost model, in elements carried (set-up, the reference check, the row)
_OVERHEAD = 200_000

#: signals the CLI's handler took during this command (cleared when the command ends). Its
#: KeyboardInterrupt can be swallowed where it lands (numba's compiler calls back through ctypes,
#: which prints "Exception ignored" and goes on: 1 run in 3 of tests/cli/test_faults.py then
#: finished every point), or be held back while numba compiles (cli._in_compiler), so the run
#: raises it when a point starts or ends, in this run or the next one of the command
SIGNALLED: list[int] = []


def cost(point: Point, backend: str = "sim") -> float:
    n = point.workload["n"] * (point.data_scale if backend == "sim" else 1.0)
    return (point.warmup + point.iterations) * (point.P * n + _OVERHEAD)


def describe(points: list[Point], backend: str = "sim") -> dict:
    """A short label per point (by position): algorithm, P and n, plus what
    else varies across the points (params, schedule, model, compute, network)."""
    parts = []
    for p in points:
        d = {"schedule": p.schedule or "", "model": p.model or "",
             "algorithm": p.algorithm + (" " + ",".join(f"{k}={v}" for k, v in sorted(p.params.items()))
                                         if p.params else ""),
             "P": f"P={p.P}", "n": f"n={fmt_count(p.workload['n'])}", "density": f"density={p.workload['density']:g}",
             "compute": "" if backend != "sim" else (p.compute.get("name", "custom") if p.compute else "ideal"),
             "network": "" if backend != "sim" else str(p.network.get("name") or p.network.get("model", "")),
             "data_scale": f"data_scale={p.data_scale:g}" if backend == "sim" else ""}
        parts.append(d)
    always = ("schedule", "model", "algorithm", "P", "n")
    keys = [k for k in parts[0] if k in always or len({d[k] for d in parts}) > 1] if parts else []
    return {i: " ".join(d[k] for k in keys if d[k]) for i, d in enumerate(parts)}


class Progress:
    """Reports finished points; ``tty=None`` decides by ``stream.isatty()``."""

    def __init__(self, points: list[Point], desc: str, backend: str = "sim", stream=None, tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.backend = backend
        self.labels = describe(points, backend)
        self.index = {id(p): i for i, p in enumerate(points)}
        self.costs = [cost(p, backend) for p in points]
        self.total, self.done_cost, self.n_done = sum(self.costs), 0.0, 0
        self.n = len(points)
        self.t0 = time.perf_counter()
        self.bar = None
        if self.tty and self.n:
            from tqdm import tqdm

            self.bar = tqdm(total=self.n, desc=desc, unit="point", file=self.stream, leave=False, dynamic_ncols=True,
                            bar_format="{desc}: {n_fmt}/{total_fmt} |{bar:24}| {elapsed}{postfix}")

    def label(self, point: Point) -> str:
        return self.labels.get(self.index.get(id(point), -1), f"{point.algorithm} P={point.P}")

    def left_s(self) -> float:
        if self.done_cost <= 0:
            return float("nan")
        return (time.perf_counter() - self.t0) * (self.total - self.done_cost) / self.done_cost

    def started(self, point: Point) -> None:
        if SIGNALLED:
            raise KeyboardInterrupt
        if self.bar is not None:
            left = self.left_s()
            eta = f"; ~{fmt_duration(left)} left" if left == left else ""
            self.bar.set_postfix_str(f"running {self.label(point)}{eta}")

    def finished(self, point: Point, row: dict) -> None:
        i = self.index.get(id(point))
        self.done_cost += self.costs[i] if i is not None else 0.0
        self.n_done += 1
        what = "simulated" if self.backend == "sim" else "measured"
        left = self.left_s() if self.n_done < self.n else 0.0
        wall = float(row.get("wall_s", 0.0) or 0.0)
        line = (f"[{self.n_done}/{self.n}] {self.label(point)}: {fmt_time(row.get('time_s'))} {what} in "
                f"{f'{wall:.1f} s' if wall >= 0.05 else '<0.1 s'} wall; ~{fmt_duration(left)} left")
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"last {self.label(point)}: {fmt_time(row.get('time_s'))}; "
                                     f"~{fmt_duration(left)} left")
        else:
            print(line, file=self.stream, flush=True)
        if SIGNALLED:   # (the point is saved)
            raise KeyboardInterrupt

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0
