"""Algorithm.messages(P, n, k, params) against the event engine's ``msgs_total``.

Every registered algorithm states the point-to-point messages one iteration
sends, all ranks together. Where the count is data-independent it must equal
the simulated one exactly; where it depends on the data the test states the
bound (at most a factor 2). Ok-Topk's periodic work is checked iteration by
iteration from the trace (the row's ``msgs_total`` is a mean over a period):
``messages`` is its ordinary iteration, ``messages_in`` any kind.
"""
from collections import Counter

import pytest

from simsparse.algorithms import ALGORITHMS, Algorithm
from simsparse.algorithms.base import pof2_floor, rd_messages
from simsparse.experiments.run.runner import simulate_point
from simsparse.period import Cycle
from tests.helpers import make_point

PS = (1, 2, 3, 5, 8, 13, 16)
N, DENSITY = 4096, 0.05


def k_of(n, density):
    return max(1, min(n, int(round(density * n))))


def _variants():
    """(algorithm, params, density, how the count compares)."""
    out = [(a, {}, DENSITY, "exact") for a in sorted(ALGORITHMS)]
    out += [(a, {"allgather": "ring"}, DENSITY, "exact") for a in sorted(ALGORITHMS)
            if "allgather" in ALGORITHMS[a].Params.model_fields]
    out += [
        ("oktopk", {"rotation": False}, DENSITY, "exact"),
        ("oktopk", {"balance": "never"}, DENSITY, "exact"),
        ("oktopk", {"count_exchange": True}, DENSITY, "exact"),
        ("oktopk", {"global_exact": "gather"}, DENSITY, "exact"),
        ("oktopk", {"tau": 1, "balanced_boundaries": False}, DENSITY, "exact"),
        ("oktopk", {"threshold_reuse": False, "tau_prime": 1}, DENSITY, "exact"),
        ("oktopk", {"balance": "always"}, DENSITY, "upper"),
        ("topkdsa", {"count_exchange": False}, DENSITY, "exact"),
        ("ssar_split_allgather", {"rotation": True}, DENSITY, "exact"),
        ("dsar_split_allgather", {"rotation": True, "quantize_bits": 4}, DENSITY, "exact"),
        # the value allreduce past MPICH's 2 KiB switch: Rabenseifner
        ("cltk", {}, 0.2, "exact"),
        ("deft", {}, 0.2, "exact"),
        # k = 512 and 513 float32 values: 2048 bytes and just above
        ("cltk", {}, 512 / N, "exact"),
        ("cltk", {}, 513 / N, "exact"),
        # DEFT's union holds about k indices, not exactly k: on the switch it may take either allreduce
        ("deft", {}, 512 / N, "switch"),
    ]
    return out


VARIANTS = _variants()


def _id(v):
    a, params, density, _ = v
    return "-".join([a, *(f"{key}={val}" for key, val in params.items())] + ([f"d{density:g}"] if density != DENSITY else []))


def _point(a, P, params, density):
    return make_point(a, P, n=N, density=density, params=params, iterations=1, warmup=0, evaluation="events")


def test_every_algorithm_counts_its_messages():
    assert len(ALGORITHMS) >= 17
    for name in ALGORITHMS:
        cls = ALGORITHMS[name]
        assert cls.messages.__func__ is not Algorithm.messages.__func__, f"{name} keeps the default count"


def test_default_is_conservative():
    """The default is at least every algorithm's count with default params (and the budget's guess)."""
    for P in (*PS, 32, 100, 1024):
        default = Algorithm.messages(P, N, 205, None)
        assert default >= 2 * P * (P - 1) + 2 * P * max(1, (P - 1).bit_length()) or P == 1
        for name in ALGORITHMS:
            cls = ALGORITHMS[name]
            assert cls.messages(P, N, 205, cls.Params.model_validate({})) <= default, (name, P)


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_messages_match_the_simulator(variant, P):
    a, params, density, how = variant
    cls = ALGORITHMS[a]
    prm = cls.Params.model_validate(params)
    k = k_of(N, density)
    want = cls.messages(P, N, k, prm)
    assert isinstance(want, float)
    if a == "oktopk":
        _check_oktopk(cls, prm, P, params, density, how)
        return
    got = simulate_point(_point(a, P, params, density)).row["msgs_total"]
    if how == "exact":
        assert got == want
    elif how == "switch":
        # recursive doubling or Rabenseifner for the values: they differ by pof2 log2(pof2)
        pof2 = pof2_floor(P)
        assert abs(got - want) <= pof2 * (pof2.bit_length() - 1)
        assert got <= 2 * want and want <= 2 * got
    else:  # pragma: no cover
        raise AssertionError(how)


def _check_oktopk(cls, prm, P, params, density, how):
    """Every iteration the loop runs (one of each kind of the period) against
    ``messages_in`` of its kind, the ordinary one against ``messages``, and
    the row's mean over the period against the counts' mean."""
    k = k_of(N, density)
    out = simulate_point(_point("oktopk", P, params, density), trace=True)
    sends = Counter(t["iteration"] for t in out.trace if t["op"] == "send")
    cycle = Cycle(cls.periodic_work(prm))
    counters = cycle.counters(0, 1)
    every = frozenset(t for t, period in cls.periodic_work(prm).items() if period == 1)
    for pos, t in enumerate(counters):
        kind = cycle.kind(t)
        want, got = cls.messages_in(P, N, k, prm, kind), sends[pos]
        if kind == every:
            assert cls.messages(P, N, k, prm) == want
        if how == "exact" and prm.balance == "never":
            assert got == want, (t, kind)
        elif how == "exact":
            # balance auto: not triggered on uniform coordinates (typical); when it is, up to 2(P-1) more
            assert want <= got <= want + 2 * max(P - 1, 0), (t, kind)
        else:
            # balance always: 2(P-1) is an upper bound of the balancing messages
            assert got <= want <= 2 * got, (t, kind)
    mean = sum(c * cls.messages_in(P, N, k, prm, kind) for kind, c in cycle.count.items()) / cycle.length
    row = out.row["msgs_total"]
    if how == "exact":
        assert mean <= row <= mean + 2 * max(P - 1, 0)
    else:
        assert row <= mean <= 2 * row


def test_oktopk_counts_without_balancing_are_exact():
    """With ``balance: never`` every kind is data-independent: the row's mean equals the counts' mean."""
    cls = ALGORITHMS["oktopk"]
    prm = cls.Params.model_validate({"balance": "never"})
    cycle = Cycle(cls.periodic_work(prm))
    for P in PS:
        row = simulate_point(_point("oktopk", P, {"balance": "never"}, DENSITY)).row["msgs_total"]
        mean = sum(c * cls.messages_in(P, N, k_of(N, DENSITY), prm, kind)
                   for kind, c in cycle.count.items()) / cycle.length
        assert row == pytest.approx(mean, rel=1e-12, abs=0)
        # the ordinary iteration: alltoall and two recursive-doubling allgathers
        assert cls.messages(P, N, 205, prm) == (P * (P - 1) + 2 * rd_messages(P) if P > 1 else 0)
