"""A point resolved once, into what its run needs.

:func:`resolve` reads a :class:`~..config.point.Point` and decides, here and
nowhere else below it:

* the values it carries (:func:`values_of`): ``sizes`` where the
  algorithm's time and bytes follow from sizes alone (dense allreduces: the
  same times, no check), ``sampled`` where the algorithm reads only its
  input's largest entries and the knob asks or allows it (``fast``, or an
  evaluator named, on a point whose full values would cost more than
  :data:`FULL_VALUES_S`), else ``full``;
* how it is timed: the evaluator table's :class:`~simsparse.backends.evaluators.Plan`
  for the point's :class:`~simsparse.backends.evaluators.Situation`;
* the iterations it runs (whole periods of the algorithm's periodic work)
  and, sampled, the iterations' joint law;
* whether its iterations repeat (:func:`repeats`): then each kind of
  iteration is simulated once and the others take its times, exactly;
* the wall seconds its simulation will take (:attr:`Resolved.estimate`):
  the algorithm's messages per collective call (``Algorithm.messages``),
  per bucket of a training iteration (``Schedule.buckets``), in every
  iteration simulated, at the seconds per message of the evaluators the
  table chose, and the seconds its values take to draw; calibrated on
  ``benchmarks/bench_scale.py``'s rows. ``fast`` reads the events' own
  estimate to decide whether an approximation beyond 1 % may time it
  (``evaluators.allowed``).

The simulator backend, the budget and ``run --explain`` read the result.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ...backends import evaluators as ev
from ...compute.noise import draws_noise
from ...period import iterations_run, kinds_run
from ...sampling import point_law, sampled_problem
from ..config.point import Point

#: seconds one full-size value costs to draw (a normal gradient's value with its noise state: about 15 ns,
#: docs/performance.md); ``fast`` samples a point whose full values would take longer than FULL_VALUES_S
VALUE_S = 15e-9
FULL_VALUES_S = 5.0
#: knob values that carry every value (the reference checks every result)
REFERENCE = ("events", "events_simpy")
#: wall seconds a simulated point costs beyond its collectives and values: its set-up, loop and row
POINT_S = 0.02
#: wall seconds per rank and collective call where the collective is gathered: the rank program's steps
#: around it (posting, resuming, its kernels' bookkeeping)
RANK_CALL_S = 25e-6
#: wall seconds to draw one sampled entry (a value above the floor and its index; VALUE_S: a full one):
#: Gaussiank of 1M at P = 1024 and 4096 on aries_alphabeta, where the draws are most of the run (bench_scale)
SAMPLED_VALUE_S = 45e-9
#: a schedule's plan microbenchmarks: sizes from 2^10 elements while P d stays under this many elements
#: (the simulator carries their real data; :mod:`.plan`)
PLAN_MAX_ELEMS = 1 << 25
#: the event engine's wall seconds per message on a flow-level network against the alpha-beta model's (the
#: max-min solves: Ok-Topk of BERT on Piz Daint at P = 64 and 256, 60 to 130 us a message, bench_scale)
FLOW_EVENTS_FACTOR = 2.5


def values_of(point: Point) -> str:
    """What the simulator carries for ``point``: "sizes", "full" or "sampled"."""
    cls = point.algorithm_cls
    mode = point.evaluation
    if mode in REFERENCE:
        return "full"
    if cls.value_free:
        return "sizes"
    if mode == "sampled":
        return "sampled"
    # fast, or an evaluator forced by name (it decides the timing, not the values)
    if (mode == "fast" or mode in ev.TABLE) and full_values_s(point) > FULL_VALUES_S \
            and sampled_problem(point) is None:
        return "sampled"
    return "full"


def full_values_s(point: Point) -> float:
    """Seconds the point's full values would take to draw: every rank's
    gradient at the carried size, in every iteration it runs."""
    n = point.workload["n"] * point.data_scale
    return point.P * n * iterations_run(point) * VALUE_S


def situation(point: Point, network, trace: bool = False) -> ev.Situation:
    """What the evaluator table reads of ``point`` on its built ``network``."""
    compute = point.compute or {}
    cls = point.algorithm_cls
    noise = draws_noise(compute)
    history = any((kc or {}).get("back_to_back_scale") for kc in (compute.get("kernels") or {}).values())
    return ev.Situation(P=point.P, network=network.capabilities(point.P), shared_cores=bool(compute.get("shared_cores")),
                        kernel_noise=noise, kernel_history=history, trace=trace,
                        rounds=cls.rounds is not None and values_of(point) == "sizes",
                        schedule=point.schedule is not None, algorithm=point.algorithm)


def repeats(values: str, s: ev.Situation) -> bool:
    """Whether every iteration of one kind (the same periodic work due) times
    exactly as the first one did: nothing in it differs from one iteration to
    the next. That holds with size-only values (no gradient drawn; the
    algorithms that allow them keep no state), a network that starts each run
    from the same state (``repeatable``), kernels timed at their medians (no
    noise drawn per call) and no trace (it records each iteration)."""
    return values == "sizes" and "repeatable" in s.network and not s.kernel_noise and not s.trace


@dataclass
class Resolved:
    """What a point's simulation needs, decided once."""

    point: Point
    values: str
    plan: ev.Plan
    iterations: int
    law: object = None       # sampling.PathLaw where sampled gradients drift or feed back errors
    situation: ev.Situation | None = None
    #: each kind of iteration is simulated once (:func:`repeats`), ``simulated`` of the ``iterations``
    repeats: bool = False
    simulated: int = 0

    @property
    def mode(self) -> str:
        return self.point.evaluation

    @cached_property
    def estimate(self) -> tuple[float, str]:
        """(wall seconds, the evaluators they assume): what simulating the point will take."""
        point, plan = self.point, self.plan
        M, calls = messages(point)
        first = plan.point[0]
        flow = "port_waves" not in self.situation.network   # (a flow-level network: max-min solves)
        events = ev.TABLE[plan.point[-1].name].seconds(M) * (FLOW_EVENTS_FACTOR if flow else 1.0)
        if first.name == "rounds":
            per_call, how = first.seconds(M), "rounds"
        elif plan.chain is not None:   # the chain chooses per gathered collective, each of at most P (P - 1)
            # messages (one per ordered pair of ranks): at least M / that many of them in a call
            each = min(M, point.P * (point.P - 1)) or M
            chosen = collective_evaluator(plan.chain, each)
            per_call = (chosen.seconds(each) * M / each if each else 0.0) + point.P * RANK_CALL_S   # (P = 1: none)
            how = f"events+{chosen.name}"
        else:
            per_call, how = events, plan.point[-1].name
        work = self.simulated * calls
        seconds = POINT_S + work * per_call + values_seconds(point, self)
        if first.name != "rounds" and plan.chain is not None and not plan.chain.events_s \
                and work * events <= ev.LONG_S:   # it may run again as events (evaluators.runtime_ok; not where
            # the chain was taken because the events take too long: what the run meets is then allowed too)
            seconds += work * events
            how += f" (or events, {work * events:.2g} s)"
        if point.schedule:   # the plan's microbenchmarks: the bucket collective alone at five sizes
            seconds += 5 * per_call
        return seconds, how


def resolve(point: Point, network=None, trace: bool = False, expand: bool = False) -> Resolved:
    """Resolve ``point`` (on ``network``, built from its spec if not given);
    ``expand``: every collective as its messages (a run whose bulk
    evaluation met what the knob does not allow, again)."""
    if network is None:
        network = point.network_spec().build()
    values = values_of(point)
    if values == "sampled" and point.evaluation == "sampled":
        problem = sampled_problem(point)
        if problem:
            raise ev.EvaluationError(f"evaluation: sampled with {point.algorithm}: {problem}")
    s = situation(point, network, trace)
    again = repeats(values, s)
    n = iterations_run(point)
    law = point_law(point) if values == "sampled" else None

    def resolved(plan):
        return Resolved(point, values, plan, n, law, s, again, kinds_run(point) if again else n)

    mode = point.evaluation if point.evaluation != "sampled" else "fast"
    events = resolved(ev.Plan(mode, [ev.TABLE["events"]], None))
    if expand:
        return events

    return resolved(ev.plan(mode, s, lambda: events.estimate[0]))


def messages(point: Point) -> tuple[float, int]:
    """(messages of one collective call, calls an iteration): the algorithm's
    count (``Algorithm.messages``), a training iteration one call a bucket
    (``Schedule.buckets``)."""
    cls, w = point.algorithm_cls, point.workload
    calls = 1
    if point.schedule:
        sched = point.schedule_cls
        calls = len(point.plan) if point.plan else \
            sched.buckets(sched.Params.model_validate(point.schedule_params), tuple(w["layers"]))
    n = max(1, w["n"] // calls)
    k = max(1, int(round(w["density"] * n)))
    return cls.messages(point.P, n, k, point.params_model()), calls


def collective_evaluator(chain, M: float):
    """The evaluator the chain would time a collective of M messages with
    (the arrays aside: they may decline)."""

    class Recorded:
        messages = M

    chosen = [e for e, _ in chain.choose(Recorded()) if e.name != "arrays"]
    return chosen[0] if chosen else chain.evaluators[0]


def values_seconds(point: Point, r: Resolved) -> float:
    """Seconds the point's values take to draw, every rank and iteration."""
    if r.values == "full":
        return full_values_s(point)
    if r.values == "sampled":
        k = max(1.0, point.workload["density"] * point.workload["n"] * point.data_scale)
        margin = point.algorithm_cls.sampling.margin_for(k)
        return point.P * k * margin * r.iterations * SAMPLED_VALUE_S * (1 + (r.law.T if r.law else 0))
    return 0.0


def explain(point: Point, trace: bool = False) -> list[str]:
    """``run --explain``: the values carried and why each evaluator is taken or declined."""
    r = resolve(point, trace=trace)
    why = {"sizes": "the algorithm's times and bytes follow from sizes alone",
           "full": "every value (checked against the numpy reference where the config asks)",
           "sampled": "the entries above a floor near the top k, exact in distribution"}[r.values]
    if r.values == "full" and point.evaluation == "fast" and point.algorithm_cls.sampling is not None:
        why += f"; sampled where they would take over {FULL_VALUES_S:g} s to draw (these: {full_values_s(point):.2g} s)"
    lines = [f"values: {r.values} ({why})"]
    if r.repeats:
        lines.append(f"iterations: {r.simulated} of {r.iterations} simulated; the others repeat one of the same "
                     f"kind exactly (size-only values, a repeatable network, no kernel noise)")
    return [*lines, *ev.explain(r.plan)]
