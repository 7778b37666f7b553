"""How a point is timed: the one table.

A point is timed by a *point evaluator*, and each helper collective the
event engine gathers (allgather, alltoall, host allreduce: every rank's exit
waits for every rank's entry) by a *collective evaluator*. Every evaluator
answers :meth:`Evaluator.can_time` with a :class:`Verdict`: ``exact`` (the
event engine's times, bytes and results to the last bit), ``approximate``
with its declared bound (relative error of the iteration time, measured by
the differential harness, ``tests/backends/test_evaluators.py``), or ``no``
with the reason. The table (:data:`TABLE`, fastest first) and the knob
decide, here and nowhere else:

* ``events`` -- the reference: every message through the event engine,
  every value carried and checked;
* ``exact`` -- the fastest evaluators equal to the events to the bit;
* ``fast`` (the default) -- as ``exact``, and an approximate evaluator where
  its bound for that collective is at most :data:`FAST_BOUND` and the exact
  one would cost more than :data:`FEW_SECONDS`, or, whatever its declared
  bound, where the exact path would take longer than :data:`LONG_S` (the
  budget's estimate: a point that would otherwise be refused or take
  minutes; its row says the bound, and ``exact`` refuses it instead);
* an evaluator's name -- that one, forced (the harness; diagnosis).

Networks declare what they allow (``NetworkModel.capabilities``), devices
whether ranks share cores or kernels are noisy (:class:`Situation`); nothing
here checks a concrete class. An exact collective evaluator may still meet,
at run time, something that could order events differently from the engine
(``BulkRun.inexact``, by cause); :data:`RUNTIME_BOUND` declares each
cause's measured bound, and the run takes the events instead where that is
past what the knob allows (:func:`runtime_ok`).

The per-message costs (:meth:`Evaluator.seconds`) are what the budget
estimates a point's wall time from (``experiments/run/budget.py``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from .. import jit

EXACT, APPROXIMATE, NO = "exact", "approximate", "no"

#: ``fast`` takes an approximate evaluator only within this relative bound on the iteration time
FAST_BOUND = 0.01
#: ... and only where the exact evaluator of the collective would take longer than this (seconds)
FEW_SECONDS = 1.0
#: where the exact path would take longer than this (seconds, the budget's estimate), ``fast`` takes an
#: approximation whatever its declared bound, and the row says the bound: under adaptive routing no exact
#: evaluator but the events times a collective, and the events' own time moves by up to 37 % with the
#: routing seed (benchmarks/bench_flow_waves.py --seeds 5), so no 1 % bound can be declared there
LONG_S = 60.0
#: the modes of the knob ``evaluation`` (or an evaluator's name: :data:`TABLE`)
MODES = ("fast", "exact", "events")
#: evaluators taken out of the table, and the one that times the same thing
RETIRED = {"waves_flow": "link_load (the same waves; each flow timed from its links' loads, not a max-min solve)"}


@dataclass(frozen=True)
class Verdict:
    """What an evaluator says of a point or a collective."""

    kind: str          # EXACT, APPROXIMATE or NO
    bound: float = 0.0  # the declared relative bound on the iteration time (APPROXIMATE)
    why: str = ""

    def __bool__(self) -> bool:
        return self.kind != NO

    def __str__(self) -> str:
        head = {EXACT: "exact", APPROXIMATE: f"approximate, within {self.bound:.3g}", NO: "no"}[self.kind]
        return f"{head}: {self.why}" if self.why else head


def exact(why: str = "") -> Verdict:
    return Verdict(EXACT, 0.0, why)


def approximate(bound: float, why: str) -> Verdict:
    return Verdict(APPROXIMATE, float(bound), why)


def no(why: str) -> Verdict:
    return Verdict(NO, 0.0, why)


@dataclass(frozen=True)
class Situation:
    """What the table reads of a point, resolved once (``experiments/run/resolve.py``)."""

    P: int
    #: what the network allows (``NetworkModel.capabilities``)
    network: frozenset = frozenset()
    #: ranks share a host's cores (a kernel's end depends on the other ranks' work)
    shared_cores: bool = False
    #: each kernel call's time is drawn around its median (each rank's own draws)
    kernel_noise: bool = False
    #: a kernel call's time depends on the rank's previous request (``back_to_back_scale``)
    kernel_history: bool = False
    #: every message is recorded (a trace holds what the events do)
    trace: bool = False
    #: the algorithm has lockstep rounds (``Algorithm.rounds``) and the point carries sizes only
    rounds: bool = False
    #: a training schedule: other programs of a rank run beside its collectives
    schedule: bool = False
    #: the algorithm's name, for the messages
    algorithm: str = ""

    def gathers(self) -> str | None:
        """Why no collective can be gathered for a bulk evaluation, or None."""
        if self.trace:
            return "the run is traced (a trace holds every message)"
        if self.shared_cores:
            return "ranks share cores (a kernel's end depends on the other ranks' work)"
        if self.kernel_noise:
            return "kernel times are drawn per call (each rank's own draws)"
        if self.kernel_history:
            return "a kernel call right after one of the same kernel has its own time (back_to_back_scale)"
        return None


class Evaluator:
    """One way of timing a point (``level`` "point") or a gathered helper
    collective ("collective")."""

    name = ""
    level = "point"
    #: one line for the table in the docs and ``run --explain``
    summary = ""
    #: wall seconds per simulated message (the budget's estimate), and per collective it times
    per_message_s = 0.0
    per_call_s = 0.0
    #: chosen by ``exact`` and ``fast`` (False: only when forced by name)
    automatic = True

    def can_time(self, s: Situation, run=None) -> Verdict:   # pragma: no cover - interface
        raise NotImplementedError

    def seconds(self, messages: float) -> float:
        """Wall seconds this evaluator takes for a collective (or point) of ``messages`` messages."""
        return self.per_call_s + self.per_message_s * messages

    def time(self, run) -> bool:
        """Time the recorded collective ``run`` (a :class:`~.fast.bulk.BulkRun`);
        False if it declines at run time."""
        raise NotImplementedError   # pragma: no cover - point evaluators are run by the experiment layer


# -- point evaluators ----------------------------------------------------------------------

class Rounds(Evaluator):
    name = "rounds"
    summary = "a value-free dense allreduce as lockstep rounds of numpy operations (fast/rounds.py)"
    #: the ring of 1M (bench_scale): 0.12 and 0.065 us a message at P = 1024 and 4096 on alpha-beta, 0.18 at 1024
    #: on the fat tree
    per_message_s = 0.1e-6
    per_call_s = 30e-6

    def can_time(self, s, run=None):
        if not s.rounds:
            return no("the algorithm has no lockstep rounds, or the point carries values")
        if s.schedule:
            return no("a training schedule runs other work beside the collective")
        if "arrays" not in s.network:
            return no("the network cannot time a wave as arrays")
        why = s.gathers()
        if why:
            return no(why)
        return exact("every round's messages start when ready; where one would wait, the events run instead")


class Events(Evaluator):
    name = "events"
    summary = "the event engine on the lean heap: every rank program, message by message (events/)"
    per_message_s = 30e-6

    def can_time(self, s, run=None):
        return exact("the reference")


class EventsSimPy(Events):
    name = "events_simpy"
    summary = "the event engine on SimPy's own core: the lean heap's reference"
    per_message_s = 60e-6
    automatic = False

    def can_time(self, s, run=None):
        return exact("SimPy's engine, the same events")


# -- collective evaluators -----------------------------------------------------------------

class _Collective(Evaluator):
    level = "collective"
    needs = "arrays"

    def can_time(self, s, run=None):
        why = s.gathers()
        if why:
            return no(why)
        if self.needs not in s.network:
            return no(f"the network does not declare '{self.needs}'")
        return self.verdict(s, run)

    #: why an exact evaluator is exact (None: :meth:`verdict` decides)
    exact_because: str | None = None
    #: what times a run: ``module:function`` under ``simsparse.backends``, the function taking the run
    runs = ""

    def verdict(self, s, run) -> Verdict:
        return exact(self.exact_because)

    def time(self, run) -> bool:
        module, _, path = self.runs.partition(":")
        fn = importlib.import_module(f"simsparse.backends.{module}")
        for name in path.split("."):
            fn = getattr(fn, name)
        return fn(run)


class Arrays(_Collective):
    name = "arrays"
    summary = "waves of messages as numpy arrays while each starts when ready (fast/timing.py)"
    per_message_s = 0.3e-6
    per_call_s = 50e-6
    exact_because = "every message starts when ready; where one would wait, the next evaluator takes the collective"
    runs = "fast.timing:BulkTiming.arrays"


class WavesAB(_Collective):
    name = "waves_ab"
    needs = "port_waves"
    summary = "wave after wave, each message booked on its alpha-beta ports in recorded order (fast/waves_ab.py)"
    runs = "fast.waves_ab:waves_run"
    per_message_s = 0.35e-6
    per_call_s = 1e-3
    #: the bound from this many messages on (benchmarks/bench_approx.py: within 1 % of the exact replay on
    #: Ok-Topk's split and reduce from P = 16 to 1024), and below it (the differential harness's grid: up
    #: to 19.5 %, Ok-Topk without rotation at P = 64 with rendezvous: ranks run waves apart)
    LARGE = 1 << 20
    BOUND_LARGE, BOUND_SMALL = 0.01, 0.2

    def verdict(self, s, run):
        if run is not None and run.messages >= self.LARGE:
            return approximate(self.BOUND_LARGE, f"{run.messages:,} messages, at least {self.LARGE:,}")
        return approximate(self.BOUND_SMALL, f"below {self.LARGE:,} messages ranks may run waves apart")


class LinkLoad(_Collective):
    """Wave after wave on the flow-level model, each flow timed from its links'
    loads. The grid of benchmarks/bench_flow_waves.py (four networks, Ok-Topk,
    TopkDSA and an unrotated alltoallv, P = 16 to 256) gives median 0.20 %,
    at most 10.5 % (an unrotated alltoallv at P = 16 under UGAL). A max-min
    solve per batch of a wave's starts and ends (the evaluator it replaced)
    gave 0.24 and 8.6 % there and the same largest errors on the harness's
    grid, in 1.18x the wall time at P = 256."""

    name = "link_load"
    needs = "flow_waves"
    summary = ("wave after wave on the flow-level model, each flow timed by its busiest link's load, no solve "
               "(fast/waves_flow.py)")
    runs = "fast.waves_flow:load_waves_run"
    per_message_s = 1.8e-6
    per_call_s = 1e-3
    #: the differential harness's grid (scripts/evaluator_table.py): on a fat tree up to 13.4 % (a dense
    #: allgather at P = 5: the waves see only their own flows, where folded ranks overlap them); under
    #: Piz Daint's adaptive routing up to 33 % (routes chosen on a wave's load, not at each start; the
    #: events' own time moves by as much with the routing seed: benchmarks/bench_flow_waves.py)
    BOUND_STATIC, BOUND_ADAPTIVE = 0.15, 0.35
    sharing = "each flow ends when its busiest link, shared fairly on its own, lets it: one pass a wave"

    def verdict(self, s, run):
        if "arrays" in s.network:
            return approximate(self.BOUND_STATIC, f"static routes; {self.sharing}")
        return approximate(self.BOUND_ADAPTIVE, f"adaptive routes chosen on the wave's load, not at each start; "
                                                f"{self.sharing}")


class Replay(_Collective):
    name = "replay"
    needs = "compiled_replay"
    summary = "the replay in event order, compiled with numba (fast/replay_ab.py, fast/replay_arrays.py)"
    runs = "fast.replay_arrays:replay_run"
    per_message_s = 1.25e-6
    #: its compiling amortised (about 20 s once per installation, then cached): the Python replay is
    #: cheaper below about 20,000 messages (0.3 s for those)
    per_call_s = 0.275

    def verdict(self, s, run):
        if not jit.AVAILABLE:   # pragma: no cover - numba is a core dependency
            return no("numba is not installed")
        return exact("the Python replay's events, compiled: the same times, order and flags")


class ReplayPy(_Collective):
    name = "replay_py"
    summary = "every message a transfer on a scratch copy of the network, in event order (fast/timing.py)"
    runs = "fast.timing:BulkTiming.replay"
    exact_because = "the event engine's order of events, without rank programs"
    per_message_s = 15e-6
    per_call_s = 20e-6


#: every evaluator, fastest first within its level
TABLE: dict[str, Evaluator] = {e.name: e for e in (Rounds(), Events(), EventsSimPy(), Arrays(), WavesAB(), LinkLoad(),
                                                   Replay(), ReplayPy())}
POINT = [e for e in TABLE.values() if e.level == "point"]
COLLECTIVE = [e for e in TABLE.values() if e.level == "collective"]

#: what an exact collective evaluator met at run time that the event engine could order otherwise
#: (``BulkRun.inexact``), and its declared bound, from the differential harness's grid
#: (scripts/evaluator_table.py): order, up to 0.37 % (Ok-Topk's replay without rotation at P = 64, where
#: the events book tied messages in another order); outside, up to 2.5 % (DEFT at P = 64 with a receive
#: window: its collectives meet the last one's traffic). device: a kernel queued behind a collective's
#: reductions, which the events would have run between them, moved OMGS-SGD over Ok-Topk by 8.7 %
#: (P = 8) and a contrived exchange by 11 % (tests/backends/test_bulk.py)
RUNTIME_BOUND = {"order": 0.005, "outside": 0.03, "device": 0.12}


def allowed(mode: str, verdict: Verdict, exact_s: float) -> bool:
    """Whether ``mode`` takes an evaluator that says ``verdict`` where the
    exact alternative would take ``exact_s`` seconds: the one rule for
    collectives (:class:`CollectiveChain`), points (:func:`plan`) and what a
    run meets (:func:`runtime_ok`)."""
    if not verdict:
        return False
    if verdict.kind == EXACT:
        return True
    return mode == "fast" and exact_s > (FEW_SECONDS if verdict.bound <= FAST_BOUND else LONG_S)


def runtime_ok(mode: str, inexact: dict, events_s) -> bool:
    """Whether ``mode`` keeps a run whose exact evaluators met ``inexact``
    (cause -> count), or takes the events instead; ``events_s()``: the
    events' estimated seconds."""
    if mode in TABLE:   # forced: its row says what it met
        return True
    bound = runtime_bound(inexact)
    if not bound:
        return True
    if mode == "exact":
        return False
    return bound <= FAST_BOUND or allowed(mode, approximate(bound, "met at run time"), events_s())


def runtime_bound(inexact: dict) -> float:
    return max([RUNTIME_BOUND[c] for c, n in inexact.items() if n], default=0.0)


class CollectiveChain:
    """Times each gathered collective by the first evaluator ``mode`` allows
    (:meth:`time`, what the event engine calls), and keeps the verdicts."""

    def __init__(self, mode: str, s: Situation, events_s: float = 0.0):
        self.mode, self.s = mode, s
        #: the point's estimated seconds as events: the exact alternative where no exact collective
        #: evaluator can time the point (:func:`plan`)
        self.events_s = events_s
        forced = TABLE.get(mode)
        self.evaluators = [forced] if forced is not None else [e for e in COLLECTIVE if e.automatic]
        #: evaluator name -> the largest bound it declared here
        self.bounds: dict = {}

    def choose(self, run) -> list:
        """The evaluators to try on ``run``, in order: exact ones fastest first, an
        approximate one first where the mode allows it (the arrays always first:
        they cost least, and decline at once where they cannot)."""
        verdicts = [(e, e.can_time(self.s, run)) for e in self.evaluators]
        if self.mode in TABLE:
            return [(e, v) for e, v in verdicts if v]
        exacts = [(e, v) for e, v in verdicts if v and v.kind == EXACT]
        first = [(e, v) for e, v in exacts if e.name == "arrays"]
        rest = sorted([(e, v) for e, v in exacts if e.name != "arrays"], key=lambda ev: ev[0].seconds(run.messages))
        exact_s = rest[0][0].seconds(run.messages) if rest else self.events_s
        approx = sorted([(e, v) for e, v in verdicts if v.kind == APPROXIMATE and allowed(self.mode, v, exact_s)],
                        key=lambda ev: ev[0].seconds(run.messages))
        if not rest:   # only the events are exact: every approximation allowed, fastest first
            return first + approx
        return first + approx[:1] + rest

    def time(self, host, kind, reqs, entry, order, device, now, pending):
        """Record the collective for all ranks and time it: (evaluator name, run, results)."""
        from .fast.bulk import BulkRun
        run = BulkRun(host, entry, order, device, now, pending)
        results = kind.bulk(reqs, run)
        run.count()
        for e, v in self.choose(run):
            if e.time(run):
                if v.kind == APPROXIMATE:
                    self.bounds[e.name] = max(self.bounds.get(e.name, 0.0), v.bound)
                return e.name, run, results
            host.network.bulk_restart()
        raise EvaluationError(f"evaluation: {self.mode}: no evaluator could time a {kind.__name__} of "
                              f"{self.s.algorithm or 'this algorithm'} at P = {self.s.P}"
                              + (" (it declined at run time: a message would wait for a busy port or link)"
                                 if self.mode in TABLE else ""))


class EvaluationError(Exception):
    """The knob asks for what no evaluator can give this point."""


@dataclass
class Plan:
    """How a point is timed: the point evaluators to try in order, and the
    collectives' chain (None: every collective as its messages)."""

    mode: str
    point: list
    chain: CollectiveChain | None
    reasons: list = field(default_factory=list)   # (evaluator, verdict) for every evaluator, for --explain


def plan(mode: str, s: Situation, events_s=None) -> Plan:
    """The plan for a point in situation ``s`` under knob ``mode`` (one of
    :data:`MODES` or an evaluator's name); :class:`EvaluationError` where
    a forced evaluator cannot time it. ``events_s()``: the point's estimated
    seconds as events, asked only where ``fast`` could gather its collectives
    for approximate evaluators alone (:func:`allowed`)."""
    if mode not in MODES and mode not in TABLE:
        raise EvaluationError(f"evaluation: {mode!r} is not allowed; use {', '.join(MODES)} or one evaluator: "
                              f"{', '.join(TABLE)}")
    reasons = [(e, e.can_time(s)) for e in TABLE.values()]
    forced = TABLE.get(mode)
    if forced is not None:
        v = forced.can_time(s)
        if not v:
            raise EvaluationError(f"evaluation: {mode} cannot time this point ({s.algorithm}, P = {s.P}): {v.why}")
        if forced.level == "point":
            return Plan(mode, [forced], None, reasons)
        return Plan(mode, [TABLE["events"]], CollectiveChain(mode, s), reasons)
    if mode == "events":
        return Plan(mode, [TABLE["events"]], None, reasons)
    verdict = {e.name: v for e, v in reasons}
    point = [e for e in POINT if e.automatic and verdict[e.name]]
    # a gathered collective cannot go back to its messages (its ranks posted in the past): gather only
    # where an exact evaluator that never declines (a replay) stands behind the others
    fallback = any(verdict[e.name].kind == EXACT for e in COLLECTIVE if e.automatic and e.name != "arrays")
    chain = CollectiveChain(mode, s) if fallback else None
    if chain is None and mode == "fast" and events_s is not None:
        # no exact evaluator but the events: approximate ones that never decline, if the events take too long
        approx = [verdict[e.name] for e in COLLECTIVE if e.automatic and verdict[e.name].kind == APPROXIMATE]
        if approx and allowed(mode, max(approx, key=lambda v: v.bound), t := events_s()):
            chain = CollectiveChain(mode, s, t)
    return Plan(mode, point, chain, reasons)


def explain(p: Plan) -> list[str]:
    """Why each evaluator is taken or declined for a point (``run --explain``)."""
    lines = []
    point = [e.name for e in p.point]
    chain = [e.name for e in p.chain.evaluators] if p.chain else []
    for e, v in p.reasons:
        if not v:
            mark = "declined"
        elif e.name in point:
            mark = "times the point" if e.name == point[0] else "times it where the one above declines at run time"
        elif e.name in chain and v.kind == APPROXIMATE and p.mode == "fast" and p.chain.events_s:
            mark = (f"in the chain, cheapest first: only the events are exact here, and they would take about "
                    f"{p.chain.events_s:.3g} s, over {LONG_S:g} s")
        elif e.name in chain and v.kind == APPROXIMATE and p.mode == "fast":
            mark = (f"in the chain, where its bound for a collective is at most {FAST_BOUND:.0%} and the exact "
                    f"evaluators would take over {FEW_SECONDS:g} s, or any bound over {LONG_S:g} s")
        elif e.name in chain and (v.kind == EXACT or p.mode in TABLE):
            mark = "in the chain of gathered collectives (cheapest first)"
        elif e.level == "collective" and not chain:
            mark = "not used (no collective is gathered: " + (
                "every one runs as its messages)" if p.mode != "fast" else
                f"no replay stands behind, and the events would take under {LONG_S:g} s)")
        elif not e.automatic:
            mark = "not used (only when named)"
        else:
            mark = f"not used by '{p.mode}'"
        lines.append(f"{e.level:>10} {e.name:<13} {mark}; {v}")
    return lines


def chain_for(mode: str, network, P: int, **situation) -> CollectiveChain:
    """The collectives' chain of ``mode`` for P ranks on ``network`` (a
    simulator built by hand: ``Simulator(network, collectives=chain_for(...))``)."""
    return CollectiveChain(mode, Situation(P=P, network=network.capabilities(P), **situation))
