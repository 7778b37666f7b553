"""The simulator backend: all ranks of a point in this process (a point whose
schedule plan is resolved; :mod:`.runner` resolves it)."""
from __future__ import annotations

import gc
import json
from dataclasses import replace

from ...backends.evaluators import TABLE, runtime_bound, runtime_ok
from ...backends.events.sim import Simulator, TrainingModel
from ...backends.fast.rounds import run_rounds
from ...compute.kernels import phantom
from ...compute.sampled import BelowFloor
from ...sampling import SampledModel, learnt_floors, sampled_gradient, within_floors
from ...compute.models import ModelProfile, model_profile
from .budget import BASE_B, KEEP_PATHS_MAX_B, declined, kept_paths_B, memory_B, point_estimate
from .loop import run_point
from .resolve import Resolved, resolve
from ..results.metrics import PointOutcome
from ..config.point import Point


#: a point estimated to carry more than this beyond the process's own (budget.memory_B) is followed by a
#: full garbage collection
GC_AFTER_B = 256 << 20


def model_profile_of(point: Point) -> ModelProfile:
    """The point's model costs on its device (the ideal device without ``compute``)."""
    prof = None if point.compute is None else point.device().profile
    return model_profile(point.model, point.batch_size, prof)


class Inexact(Exception):
    """An iteration's bulk evaluation met what the knob does not allow
    (``evaluators.runtime_ok``): the point runs again, every collective as
    its messages."""

    def __init__(self, inexact: dict):
        super().__init__(inexact)
        self.inexact = inexact


class SimBackend:
    """All P ranks in this process, at the point's ``data_scale`` (reduced
    data; bytes and compute work scaled back up), timed as ``resolved`` says."""

    name = "sim"
    root = True

    def __init__(self, resolved: Resolved, network, trace: bool = False, max_seconds: float | None = None,
                 widen: tuple | None = None):
        point = resolved.point
        spec = point.network_spec()
        small, byte_scale = point.at_scale()
        self.point, self.trace, self.resolved = small, trace, resolved
        self.local_ranks = range(point.P)
        self.plan = resolved.plan
        engine = "simpy" if self.plan.point[-1].name == "events_simpy" else "lean"
        self.sim = Simulator(network, point.device(), **spec.protocol(), trace=trace, byte_scale=byte_scale,
                             engine=engine, collectives=self.plan.chain)
        #: the evaluators that timed the point (names), and the largest bound they declared
        self.used: dict = {}
        self.bound = 0.0
        #: what its exact collective evaluators met at run time, by cause (evaluators.RUNTIME_BOUND)
        self.met: dict = {}
        self.workload = small.workload_obj()
        self.values = resolved.values
        #: each kind of iteration simulated once, the others its repeats (resolve.repeats)
        self.repeats = resolved.repeats
        #: size-only: every rank's gradient is a phantom (no values generated, carried or checked)
        self.size_only = self.values == "sizes"
        #: sampled gradients that drift or feed back errors: the iterations' joint law (sampling.paths)
        self.law = resolved.law
        #: sampled: per iteration, a factor on the entries its floor admits (None: as the algorithm asks)
        self.widen = widen
        #: sampled paths: each rank's, drawn at its first iteration and kept to its last (where that fits)
        self.kept = {} if self.law is not None and kept_paths_B(point) <= KEEP_PATHS_MAX_B else None
        if self.values == "full":   # every rank's noise state kept from one iteration to the next
            self.workload.hold_states(point.P)
        self.model = None
        self.rounds = point.algorithm_cls.rounds if self.plan.point[0].name == "rounds" else None
        self.max_seconds = max_seconds
        if point.schedule:
            prof = model_profile_of(point)
            self.model = TrainingModel(prof.t_forward, prof.t_bwd, tuple(small.workload["layers"]), prof.noise)

    def _timed(self, stats, point_evaluator: str):
        """Keep who timed an iteration, and what its bulk evaluations met."""
        self.used[point_evaluator] = True
        for name in stats.evaluated:
            self.used[name] = True
        if not runtime_ok(self.resolved.mode, stats.inexact, self._events_s):
            raise Inexact(stats.inexact)
        chain = self.plan.chain
        self.bound = max(self.bound, runtime_bound(stats.inexact), *(chain.bounds.values() if chain else ()))
        for cause, n in stats.inexact.items():
            self.met[cause] = self.met.get(cause, 0) + n
        return stats

    def _events_s(self) -> float:
        """The point's estimated seconds as events (every collective as its messages)."""
        p = self.resolved.point
        return point_estimate(p, self.trace, resolve(p, self.sim.network, self.trace, expand=True)).seconds

    @property
    def evaluator(self) -> str:
        """The row's ``evaluator``: every evaluator that timed some of the point, in the table's order."""
        return "+".join(name for name in TABLE if name in self.used)

    @staticmethod
    def gather(values):
        return list(values)

    def iteration(self, jobs, it):
        events = self.plan.point[-1].name
        if self.size_only:
            grads = [phantom(self.workload.n, self.workload.dtype)] * self.point.P
            if self.rounds is not None:
                P = self.point.P
                stats = run_rounds(self.sim, P, self.rounds(P, self.workload.n), self.workload.dtype)
                if stats is not None:
                    stats.results = grads
                    return self._timed(stats, "rounds")
                declined(self.resolved.point, self.max_seconds)   # the budget counted the rounds, not the events
                self.rounds = None   # a message would wait: the same happens every iteration
        elif self.values == "sampled" and self.model is not None:   # each bucket drawn when the schedule packs it
            cls, buckets = self.point.algorithm_cls, next(iter(jobs.values())).sched.buckets
            grads = [SampledModel(self.workload, r, it, buckets, cls.sampling.margin_for, self.law, self.widen, self.kept)
                     for r in self.local_ranks]
        elif self.values == "sampled":
            margin = self.point.algorithm_cls.sampling.margin_for(self.workload.k)
            draw = [_drawn(jobs[r], self.workload, r, it, margin, self.law, self.widen, self.kept)
                    for r in self.local_ranks]
            return self._timed(self._sampled(it, lambda: self.sim.run(draw)), events)
        else:
            grads = self.workload.grads(self.point.P, it)
        if self.model is not None:
            programs = [jobs[r].program() for r in self.local_ranks]
            stats = self._sampled(it, lambda: self.sim.run(programs, self.model, grads))
        else:
            stats = self.sim.run([jobs[r].program(g) for r, g in zip(self.local_ranks, grads)])
        return self._timed(stats, events)

    @staticmethod
    def _sampled(it: int, run):
        """``run()``, a selection below a sampled floor marked with the iteration."""
        try:
            return run()
        except BelowFloor as err:
            err.iteration = it
            raise


def _drawn(job, workload, rank: int, it: int, margin: float, law, widen, kept):
    """Rank ``rank``'s program, drawing its sampled gradient when the rank
    starts: no list holds every rank's gradient, so each is freed once its
    program stops reading it (Ok-Topk after its local selection; at
    P = 4096 the ranks' sampled gradients are 0.7 GB)."""
    return lambda ctx: job.program(sampled_gradient(workload, rank, it, margin, law=law, widen=widen, kept=kept))(ctx)


#: a sampled point of more ranks whose algorithm carries thresholds between iterations under error
#: feedback (``Algorithm.sampling.floors_learnt``) first runs at this many, to learn its floors
PILOT_P = 4


def simulate(point: Point, trace: bool = False, keep_results: bool = False,
             max_seconds: float | None = None) -> PointOutcome:
    """Simulate a point whose schedule plan (if any) is resolved, as
    :func:`~.resolve.resolve` decides. A sampled point runs again while a
    selection reaches below a floor (:func:`~simsparse.sampling.within_floors`;
    the row's ``sampled_widen`` says by how much), from the floors a pilot
    at ``PILOT_P`` ranks learnt where that is to be expected (the Ok-Topk
    paper's BERT config at P = 256: a failed first run was 43 % of the
    point)."""
    network = point.network_spec().build()
    resolved = resolve(point, network, trace)
    out, backend, widen = _timed_run(resolved, network, trace, keep_results, max_seconds, _pilot(resolved))
    out.row["evaluator"] = backend.evaluator
    out.row["error_bound"] = backend.bound
    out.row["inexact"] = " ".join(f"{k}:{n}" for k, n in sorted(backend.met.items()))
    if backend.values == "sampled":
        out.row["sampled_widen"] = "" if widen is None else " ".join(f"{w:.3g}" for w in widen)
    # The rank programs, their contexts and the simulator refer to each other: freed only by the cyclic
    # collector, which counts objects, not bytes, so a point's every gradient and state (GBs) outlived it
    # into the next point (the Ok-Topk paper's BERT config at P = 256: peak 12.2 GB in one process, 6.7 GB
    # for its largest point alone). A point that carries much is collected before the next one allocates
    # (a full collection takes about 0.2 s here: as long as a small point).
    del backend
    if memory_B(point, "sim", trace, caches=False) - BASE_B > GC_AFTER_B:   # (the caches outlive the point)
        gc.collect()
    return out


def _timed_run(resolved: Resolved, network, trace: bool, keep_results: bool, max_seconds, widen: tuple | None):
    """:func:`_attempts`; where a bulk evaluation met what the knob does not allow, again with every
    collective as its messages (the row's ``evaluator_note`` says why)."""
    try:
        return _attempts(resolved, network, trace, keep_results, max_seconds, widen)
    except Inexact as err:
        again = resolve(resolved.point, network, trace, expand=True)
        out, backend, widen = _attempts(again, network, trace, keep_results, max_seconds, widen)
        out.row["evaluator_note"] = ("ran again as events: a bulk evaluation met " +
                                     ", ".join(f"{k} ({n})" for k, n in err.inexact.items()))
        return out, backend, widen


def _attempts(resolved: Resolved, network, trace: bool, keep_results: bool, max_seconds, widen: tuple | None):
    """Run the point (sampled: :func:`~simsparse.sampling.within_floors`); (outcome, backend, floors' factors)."""
    backends = []

    def run(widen):
        backends[:] = [SimBackend(resolved, network, trace, max_seconds, widen)]
        return run_point(resolved.point, backends[0], keep_results)

    out, widen = within_floors(run, widen, resolved.iterations)
    return out, backends[0], widen


def _pilot(resolved: Resolved) -> tuple | None:
    """The floors' factors a pilot of the point at ``PILOT_P`` ranks ended
    with, where the algorithm learns its floors, else None (its draws are
    the pilot ranks' own: the main run draws from streams salted by what the
    pilot learnt)."""
    point = resolved.point
    if resolved.values != "sampled" or point.P <= PILOT_P or resolved.law is None \
            or not point.algorithm_cls.sampling.floors_learnt(point.params_model()):
        return None
    pilot = replace(point, P=PILOT_P, evaluation="sampled")
    network = pilot.network_spec().build()
    key = json.dumps(pilot.to_dict(), sort_keys=True, default=str)   # (every field: the same pilot, the same floors)
    return learnt_floors(key, lambda: _timed_run(resolve(pilot, network), network, False, False, None, None)[2])
