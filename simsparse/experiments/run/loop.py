"""The one experiment loop: ``warmup + iterations`` iterations of a point on
a backend, plus one of each kind of iteration of the algorithm's periodic
work that these did not measure (:mod:`.period`), every result checked
against numpy, one results row.

A backend (:class:`~.simulate.SimBackend`, :class:`~.worker.MPIBackend`) runs
the ranks it holds (all of them in the simulator, its own in an MPI process)
and gathers per-rank values on the root. What a rank runs is a *job*: a bare
collective (an algorithm instance fed the workload's gradient) or a training
iteration (a schedule instance; gradients come from the backward pass).
"""
from __future__ import annotations

import time

import numpy as np

from .backend import ExperimentBackend
from ..results.metrics import TRACE_COLUMNS, IterationRecord, PointOutcome, summarize
from ...period import Cycle
from ..config.point import Point, to_dense, to_host

class AlgorithmJob:
    """A rank's algorithm instance on the workload's gradient."""

    def __init__(self, point: Point, rank: int):
        self.alg = point.algorithm_cls(point.setup(rank), point.params_model())
        self.n = point.workload["n"]

    def program(self, grad):
        return lambda ctx: self.alg.iteration(ctx, grad)

    def periodic_work(self) -> dict[str, int]:
        return self.alg.periodic_work(self.alg.params)

    def skip_to(self, t: int) -> None:
        self.alg.skip_to(t)

    def check_input(self) -> np.ndarray:
        return to_dense(self.alg.last_input, self.n)

    def check_result(self, result) -> np.ndarray:
        return to_dense(result, self.n)

    result_dense = check_result

    def state(self):
        return self.alg.check_state()

    def release(self) -> None:
        """Drop the last iteration's input, which only its check reads."""
        self.alg.last_input = None

    def keep_inputs(self, on: bool) -> None:
        """Whether the algorithm keeps each iteration's input for the check."""
        self.alg.keep_input = on


class ScheduleJob:
    """A rank's schedule instance: one training iteration per call."""

    def __init__(self, point: Point, rank: int):
        self.sched = point.schedule_for(rank)

    def program(self, grad=None):
        return self.sched.run

    def periodic_work(self) -> dict[str, int]:
        return self.sched.periodic_work()

    def skip_to(self, t: int) -> None:
        self.sched.skip_to(t)

    def check_input(self) -> list:
        """Per bucket, the collective's input as host numpy (no full-size copy)."""
        return [to_host(x) for x in self.sched.last_inputs()]

    def check_result(self, result) -> list:
        return [to_host(r) for r in result]

    def result_dense(self, result) -> np.ndarray:
        return self.sched.assemble(result, to_dense)

    def state(self):
        return self.sched.check_state()

    def release(self) -> None:
        """Drop every bucket's last input, which only the check reads."""
        for a in self.sched.algs:
            a.last_input = None

    def keep_inputs(self, on: bool) -> None:
        for a in self.sched.algs:
            a.keep_input = on


def make_job(point: Point, rank: int):
    return ScheduleJob(point, rank) if point.schedule else AlgorithmJob(point, rank)


def check(point: Point, job, inputs: list, results: list, states: list) -> tuple[bool, float]:
    """Compare every rank's result with the numpy reference computed from
    every rank's input and check state; a schedule bucket by bucket. Returns
    (all correct, max error relative to the scale of the sum)."""
    if point.schedule:
        ok, worst = True, 0.0
        for g, (setup, (a, b)) in enumerate(zip(job.sched.setups, job.sched.spans)):
            cls, params = job.sched.algorithm_cls, job.sched.algorithm_params
            xs = [x[g] for x in inputs]
            ref = cls.reference(xs, setup, params, [s[g] for s in states])
            good, err = _compare(ref, xs, [to_dense(r[g], b - a) for r in results], cls.tolerance_for(setup, params))
            ok, worst = ok and good, max(worst, err)
        return ok, worst
    cls, params, setup = point.algorithm_cls, point.params_model(), point.setup(0)
    return _compare(cls.reference(inputs, setup, params, states), inputs, results, cls.tolerance_for(setup, params))


def _compare(ref, inputs, results, tol) -> tuple[bool, float]:
    """Max error relative to the scale of the sum: the largest of max
    |reference| and max_j sum_i |x_i[j]|, so that rounding in a sum whose
    terms cancel is not mistaken for a wrong result."""
    ref = np.asarray(ref, dtype=np.float64)
    magnitude = np.zeros(ref.shape)
    for x in inputs:
        x = np.asarray(x)
        if x.shape == ref.shape:
            magnitude += np.abs(x)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, float(magnitude.max(initial=0.0)), 1e-30)
    worst = 0.0
    for res in results:
        res = np.asarray(res, dtype=np.float64)
        if res.shape != ref.shape:
            return False, float("inf")
        if res.size:
            worst = max(worst, float(np.max(np.abs(res - ref))) / scale)
    return worst <= tol, worst


def check_results(point: Point, inputs: list, results: list, states: list) -> tuple[bool, float]:
    """:func:`check` for a bare collective, from raw inputs and results (arrays, tensors, COO)."""
    n = point.workload["n"]
    return check(point, None, [to_dense(x, n) for x in inputs], [to_dense(r, n) for r in results], states)


def _breakdown(stats_finish: list, busy: list) -> dict:
    """The slowest rank's iteration split into device work by kind and the
    time its device waited for communication (OMGS-SGD section V.E)."""
    r = int(np.argmax(stats_finish))
    b = busy[r]
    device = b["forward"] + b["backward"] + b["compute"]
    return {"t_forward_s": b["forward"], "t_backward_s": b["backward"], "t_sparsify_s": b["compute"],
            "t_comm_nonoverlap_s": max(0.0, stats_finish[r] - device), **_cpu(busy)}


def _collective_breakdown(stats_finish: list, busy: list) -> dict:
    """A bare collective's slowest rank: device busy time (selection,
    compression, reduction kernels) and the rest of its time (messages and
    waiting for them)."""
    r = int(np.argmax(stats_finish))
    b = busy[r] if r < len(busy) and busy[r] else {}
    device = sum(b.get(k, 0.0) for k in ("forward", "backward", "compute"))
    return {"t_compute_s": device, "t_comm_s": max(0.0, stats_finish[r] - device), **_cpu(busy)}


def _cpu(busy: list) -> dict:
    """``cpu_s``: the CPU seconds of a rank's iteration, the mean over ranks,
    where the backend counts them (a real rank's process CPU, waiting
    included; the simulator's core-seconds where ranks share cores)."""
    cpu = [b["cpu"] for b in busy if b and "cpu" in b]
    return {"cpu_s": float(np.mean(cpu))} if cpu and len(cpu) == len(busy) else {}


def run_point(point: Point, backend: ExperimentBackend, keep_results: bool = False) -> PointOutcome | None:
    """Run one point; the root returns its outcome, other processes None.
    Iteration ``it`` of the loop (its gradient's index) runs the algorithm's
    iteration ``counters[it]`` (:meth:`.period.Cycle.counters`)."""
    t0 = time.perf_counter()
    run_pt = backend.point
    jobs = {r: make_job(run_pt, r) for r in backend.local_ranks}
    cycle = Cycle(next(iter(jobs.values())).periodic_work())
    counters = cycle.counters(point.warmup, point.iterations)
    weights = [0.0] * point.warmup + cycle.weights(counters[point.warmup:])
    pid = point.point_id(backend.name)
    records, trace_rows = [], []
    checking = point.check and backend.values == "full"
    for job in jobs.values():
        job.keep_inputs(checking)
    correct, worst = (True if checking else None), 0.0
    results = None
    gather = backend.gather
    ran: dict = {}   # kind of iteration -> its stats, where iterations repeat
    for it, counter in enumerate(counters):
        kind = cycle.kind(counter)
        if backend.repeats and kind in ran:
            stats = ran[kind]
        else:
            for job in jobs.values():
                job.skip_to(counter)
            stats = backend.iteration(jobs, it)
            if backend.repeats:
                ran[kind] = stats
        finish, sent, msgs, busy = gather(stats.finish_s), gather(stats.bytes_sent), gather(stats.msgs_sent), \
            gather(stats.busy)
        if checking:
            local = list(jobs)
            inputs = gather([jobs[r].check_input() for r in local])
            dense = gather([jobs[r].check_result(res) for r, res in zip(local, stats.results)])
            states = gather([jobs[r].state() for r in local])
            if backend.root:
                ok, err = check(run_pt, jobs[local[0]], inputs, dense, states)
                correct, worst = correct and ok, max(worst, err)
        if backend.trace:
            tr = gather([stats.trace])
            if backend.root:
                trace_rows.extend(dict(zip(TRACE_COLUMNS, (pid, it, t.rank, t.lane, t.phase, t.op, t.peer, t.bytes,
                                                           t.start_s, t.end_s, weights[it])))
                                  for part in tr for t in part)
        if backend.root and it >= point.warmup:
            records.append(IterationRecord(max(finish), list(sent), list(msgs), stats.n_events,
                                           _breakdown(finish, busy) if point.schedule
                                           else _collective_breakdown(finish, busy), counter))
        if it == len(counters) - 1:
            results = stats.results
        # the next iteration draws every rank's gradient anew: holding this one's inputs and results
        # meanwhile doubled the peak (Ok-Topk, P = 1024, sampled values: 1.35 GB, of which gradients 0.34)
        stats = None
        for job in jobs.values():
            job.release()
    if not backend.root:
        return None
    row = summarize(point, backend.name, records, cycle, correct, worst, time.perf_counter() - t0)
    row["values"] = backend.values
    row["iterations_run"] = len(ran) if backend.repeats else len(counters)   # (the others repeat one of them)
    return PointOutcome(row, trace_rows, results if keep_results else None)
