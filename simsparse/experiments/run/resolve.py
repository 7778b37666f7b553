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
  iteration is simulated once and the others take its times, exactly.

The simulator backend, the budget and ``run --explain`` read the result.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...backends import evaluators as ev
from ...period import iterations_run, kinds_run
from ...sampling import point_law, sampled_problem
from ..config.point import Point

#: seconds one full-size value costs to draw (a normal gradient's value with its noise state: about 15 ns,
#: docs/performance.md); ``fast`` samples a point whose full values would take longer than FULL_VALUES_S
VALUE_S = 15e-9
FULL_VALUES_S = 5.0
#: knob values that carry every value (the reference checks every result)
REFERENCE = ("events", "events_simpy")


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
    return ev.Situation(P=point.P, network=network.capabilities(point.P), shared_cores=bool(compute.get("shared_cores")),
                        kernel_noise=bool(compute.get("kernel_noise")), trace=trace,
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
    plan = ev.plan(point.evaluation if point.evaluation != "sampled" else "fast", s)
    if expand:
        plan = ev.Plan(plan.mode, [ev.TABLE["events"]], None, plan.reasons)
    again = repeats(values, s)
    n = iterations_run(point)
    return Resolved(point, values, plan, n, point_law(point) if values == "sampled" else None, s, again,
                    kinds_run(point) if again else n)


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
