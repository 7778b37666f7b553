"""The evaluator table and the differential harness (tests/backends/harness.py).

Every evaluator is forced through the knob (``evaluation: <name>``) on every
algorithm (and the helper collectives' other forms) x protocol variant x P,
and compared with the events: exact evaluators to the bit, approximate ones
within their declared bound, the row naming the evaluator forced. The same
harness on random cases (hypothesis), and the table's own choices."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from simsparse.backends import evaluators as ev
from simsparse.experiments.run.resolve import resolve
from simsparse.experiments.run.runner import simulate_point

from tests.backends.harness import ALGORITHMS, VARIANTS, label, point_of, reference, run_case

FORCED = [name for name in ev.TABLE if name != "events"]
SMALL_P = (1, 2, 3, 5, 8, 13)


@pytest.mark.parametrize("variant", [v if v == "eager" else pytest.param(v, marks=pytest.mark.slow) for v in VARIANTS])
@pytest.mark.parametrize("alg", ALGORITHMS, ids=label)
def test_every_evaluator_keeps_its_claim(alg, variant):   # (the edit-test loop: the eager variant of each)
    """P = 1, 2, 3, 5, 8, 13: every evaluator exact where it says so, within
    its bound where it declares one, or declined with a reason."""
    outcomes = set()
    for P in SMALL_P:
        ref = reference(alg, variant, P)
        for name in FORCED:
            outcome, detail = run_case(alg, variant, P, name, ref)
            outcomes.add((name, outcome))
            assert outcome != "declined" or detail
    assert ("events_simpy", "exact") in outcomes


@pytest.mark.parametrize("alg,variant", [("oktopk", "eager"), ("topkdsa", "rendezvous"), ("ring", "fat_tree"),
                                         ("gaussiank", "window"), ("dsar_split_allgather", "size_bands"),
                                         ("topka", "adaptive")])
@pytest.mark.slow
def test_at_64_ranks(alg, variant):
    ref = reference(alg, variant, 64)
    outcomes = {name: run_case(alg, variant, 64, name, ref)[0] for name in FORCED}
    assert "exact" in outcomes.values()


@settings(max_examples=12, deadline=None)
@given(alg=st.sampled_from(ALGORITHMS), variant=st.sampled_from(list(VARIANTS)), P=st.integers(1, 24),
       name=st.sampled_from(FORCED))
def test_random_cases(alg, variant, P, name):
    run_case(alg, variant, P, name)


def test_a_forced_evaluator_that_cannot_time_the_point_is_refused_up_front():
    p = point_of("oktopk", "fat_tree", 4, "waves_ab")
    with pytest.raises(ev.EvaluationError, match="waves_ab cannot time this point.*port_waves"):
        simulate_point(p)
    with pytest.raises(ev.EvaluationError, match="rounds cannot time this point"):
        simulate_point(point_of("oktopk", "eager", 4, "rounds"))


def test_exact_never_takes_an_approximation_and_fast_only_past_its_threshold():
    """The chain's choice on recorded collectives of a given size: exact
    evaluators fastest first (arrays always tried first), waves_ab in
    ``fast`` only from 2^20 messages (its bound 1 %, the replay's cost past
    a few seconds), never in ``exact``."""
    s = ev.Situation(P=4096, network=frozenset(("arrays", "port_waves", "compiled_replay")))

    class Run:
        def __init__(self, messages):
            self.messages = messages

    names = lambda mode, m: [e.name for e, _ in ev.CollectiveChain(mode, s).choose(Run(m))]   # noqa: E731
    assert names("exact", 1 << 24) == ["arrays", "replay", "replay_py"]
    assert names("fast", 1 << 24) == ["arrays", "waves_ab", "replay", "replay_py"]
    assert names("fast", 1000) == ["arrays", "replay_py", "replay"]   # (the Python replay costs less here)
    assert names("waves_ab", 10) == ["waves_ab"]


def test_fast_takes_a_wide_bound_only_where_the_events_alone_are_exact_and_would_take_minutes():
    """Under adaptive routing only the events are exact. ``fast`` gathers the
    collectives for the flow waves (bound 35 %) only where the events are
    estimated past ``LONG_S``; ``exact`` never; a forced chain as it is."""
    s = ev.Situation(P=1024, network=frozenset(("flow_waves",)))
    long, short = (lambda: ev.LONG_S + 1), (lambda: ev.LONG_S - 1)
    assert ev.plan("fast", s, short).chain is None
    assert ev.plan("exact", s, long).chain is None and ev.plan("fast", s).chain is None
    chain = ev.plan("fast", s, long).chain
    assert chain is not None and chain.events_s == ev.LONG_S + 1

    class Run:
        messages = 10

    assert [e.name for e, _ in chain.choose(Run())] == ["link_load"]   # any size
    lines = dict((line.split()[1], line) for line in ev.explain(ev.plan("fast", s, long)))
    assert "only the events are exact here" in lines["link_load"] and "within 0.35" in lines["link_load"]
    assert "events would take under 60 s" in dict((line.split()[1], line)
                                                   for line in ev.explain(ev.plan("fast", s, short)))["link_load"]
    # one rule: a wide bound needs the events past LONG_S wherever it is met (a collective, a point, a run)
    wide = ev.approximate(0.35, "")
    assert not ev.allowed("fast", wide, ev.LONG_S) and ev.allowed("fast", wide, ev.LONG_S + 1)
    assert not ev.allowed("exact", wide, 1e9)
    assert ev.runtime_ok("fast", {"device": 1}, long) and not ev.runtime_ok("fast", {"device": 1}, short)


def test_a_row_timed_past_the_events_patience_says_its_evaluator_and_bound(monkeypatch):
    """End to end at a small P, with the patience lowered to nothing: the row
    names the approximation and its bound, and lands within it."""
    events = reference("topka", "adaptive", 8).row
    monkeypatch.setattr(ev, "LONG_S", 0.0)
    row = simulate_point(point_of("topka", "adaptive", 8, "fast")).row
    assert row["evaluator"] == "events+link_load" and row["error_bound"] == ev.LinkLoad.BOUND_ADAPTIVE
    assert abs(row["time_s"] - events["time_s"]) <= row["error_bound"] * events["time_s"]


def test_the_estimate_adds_no_run_as_events_where_the_events_take_too_long(monkeypatch):
    """Where the chain was taken because the events take past LONG_S, what
    the run meets is allowed too: it never runs again as events, and the
    estimate does not count that (it did: the Ok-Topk paper's BERT config at
    P = 256 was estimated at 87 s for 27 s)."""
    point = point_of("topka", "adaptive", 8, "fast")
    events_s = resolve(point, expand=True).estimate[0]
    monkeypatch.setattr(ev, "LONG_S", events_s - 0.01)   # the events past it, their collectives alone within
    r = resolve(point)
    seconds, how = r.estimate
    assert r.plan.chain is not None and r.plan.chain.events_s == events_s
    assert how == "events+link_load" and seconds < events_s


def test_the_plan_says_why_each_evaluator_is_taken_or_declined():
    r = resolve(point_of("ring", "adaptive", 8, "fast"))
    assert [e.name for e in r.plan.point] == ["events"] and r.plan.chain is None
    lines = dict((line.split()[1], line) for line in ev.explain(r.plan))
    assert "declined" in lines["rounds"] and "cannot time a wave as arrays" in lines["rounds"]
    assert "only when named" in lines["events_simpy"]
    r = resolve(point_of("ring", "eager", 8, "fast"))
    assert [e.name for e in r.plan.point] == ["rounds", "events"]


def test_an_unknown_mode_names_what_is_allowed():
    with pytest.raises(ev.EvaluationError, match="'fastest' is not allowed; use fast, exact, events"):
        ev.plan("fastest", ev.Situation(P=2))


def test_exact_runs_the_point_again_as_events_where_a_bulk_evaluation_met_ties():
    """TopkDSA's replay meets only ties at P = 8 with a handshake (bound
    0.5 %): ``exact`` gives the events' row and says why, ``fast`` keeps the
    replay within that bound. Ok-Topk's meets traffic from outside its
    collectives at P = 13 (bound 3 %, past fast's 1 %): both give the events'."""
    events = reference("topkdsa", "rendezvous", 8).row
    p = point_of("topkdsa", "rendezvous", 8, "exact")
    exact = simulate_point(p).row
    assert exact["evaluator"] == "events" and "order" in exact["evaluator_note"]
    assert exact["time_s"] == events["time_s"]
    fast = simulate_point(dataclasses.replace(p, evaluation="fast")).row
    assert "replay" in fast["evaluator"] and fast["error_bound"] == ev.RUNTIME_BOUND["order"]
    assert abs(fast["time_s"] - events["time_s"]) <= fast["error_bound"] * events["time_s"]
    events = reference("oktopk", "eager", 13).row
    for mode in ("exact", "fast"):
        row = simulate_point(point_of("oktopk", "eager", 13, mode)).row
        assert row["evaluator"] == "events" and "outside" in row["evaluator_note"] and row["time_s"] == events["time_s"]
