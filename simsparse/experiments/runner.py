"""Run experiment points on the simulator backend."""
from __future__ import annotations

import time

from ..backends.sim import Simulator
from .metrics import IterationRecord, PointOutcome, summarize
from .point import Point, check_results

TRACE_COLUMNS = ["point_id", "iteration", "rank", "phase", "op", "peer", "bytes", "start_s", "end_s"]


def simulate_point(point: Point, trace: bool = False, keep_results: bool = False) -> PointOutcome:
    """Simulate ``warmup + iterations`` iterations of one point (at its
    ``data_scale``: reduced data, bytes and compute work scaled back up)."""
    t0 = time.perf_counter()
    spec = point.network_spec()
    small, byte_scale = point.at_scale()
    sim = Simulator(spec.build(), point.device(), spec.eager_threshold_B, spec.rendezvous_rtt_s, trace=trace,
                    byte_scale=byte_scale)
    workload = small.workload_obj()
    algs = small.instances()
    pid = point.point_id("sim")
    records, trace_rows = [], []
    correct, worst = (True if point.check else None), 0.0
    stats = None
    for it in range(point.warmup + point.iterations):
        grads = workload.grads(point.P, it)
        stats = sim.run([_program(a, g) for a, g in zip(algs, grads)])
        if point.check:
            ok, err = check_results(small, [a.last_input for a in algs], stats.results,
                                    [a.check_state() for a in algs])
            correct = correct and ok
            worst = max(worst, err)
        if it >= point.warmup:
            records.append(IterationRecord(stats.time_s, list(stats.bytes_sent), list(stats.msgs_sent), stats.n_events))
        if trace:
            trace_rows.extend(dict(zip(TRACE_COLUMNS, (pid, it, *t))) for t in stats.trace)
    row = summarize(point, "sim", records, correct, worst, time.perf_counter() - t0)
    return PointOutcome(row, trace_rows, stats.results if keep_results else None)


def _program(alg, grad):
    return lambda ctx: alg.iteration(ctx, grad)
