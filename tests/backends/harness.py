"""The differential harness: every evaluator, forced through the knob
(``evaluation: <name>``), against the events (``evaluation: events``), on
every algorithm and protocol variant.

A case is (algorithm, variant, P). For each evaluator :func:`run_case`
says one of:

* ``exact`` -- the row names the evaluator and its time, bytes, messages
  and every rank's result equal the events' to the bit;
* ``within`` -- an approximate evaluator (or an exact one that met something
  at run time it declares a bound for): bytes, messages and results equal,
  the time within the row's ``error_bound``;
* ``declined`` -- the table refused it up front, or it timed nothing of this
  point (no collective it can time), with the reason.

Anything else fails: an exact claim that is not exact, a time past its
bound, a row naming another evaluator than the one forced.
``tests/backends/test_evaluators.py`` runs a grid of cases;
``scripts/evaluator_table.py`` runs the full grid and writes the table in
``docs/architecture.md``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from simsparse.backends.evaluators import TABLE, EvaluationError
from simsparse.compute.devices import load_profile
from simsparse.experiments.config.point import to_dense
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, net

P100 = load_profile("p100").model_dump()
#: kernel noise bands as `calibrate` fits them (a factor per call, around the median)
NOISE = [{"up_to_s": 1e-3, "ratios": [0.8, 0.9, 1.1, 1.3]}, {"up_to_s": 10.0, "ratios": [0.95, 1.0, 1.05]}]

#: the protocol variants: name -> (network overrides or a preset, compute, point overrides)
VARIANTS = {
    "eager": ({}, None, {}),
    "rendezvous": ({"eager_threshold_B": 256, "rendezvous_rtt_s": 3e-6}, P100, {}),
    "window": ({"eager_threshold_B": 256, "rendezvous_rtt_s": 2e-6, "unexpected_window_B": 1000}, None,
               {"data_scale": 0.5}),
    "size_bands": ({"size_scale": [[64, 1.7], [512, 0.8], [4096, 1.3]]}, P100, {}),
    "fat_tree": ("ib_fdr_fattree", None, {}),
    "adaptive": ("piz_daint_aries", None, {}),
    "shaped": ("testbed_star", None, {}),
    "shared_cores": ({}, {**P100, "shared_cores": 2}, {}),
    "kernel_noise": ({}, {**P100, "kernel_noise": NOISE}, {}),
}

#: every algorithm, and the helper collectives' other forms through their parameters
ALGORITHMS = ["cltk", "deft", "dense_allgather", "dsar_split_allgather", "fft_allgather", "gaussiank", "gtopk",
              "oktopk", "qsgd_allgather", "rabenseifner", "recursive_doubling", "ring", "ssar_recursive_double",
              "ssar_split_allgather", "terngrad_allgather", "topka", "topkdsa",
              ("topka", {"allgather": "ring"}), ("oktopk", {"rotation": False, "bucket_size": 3})]


def label(alg) -> str:
    return alg if isinstance(alg, str) else f"{alg[0]}({', '.join(f'{k}={v}' for k, v in alg[1].items())})"


def point_of(alg, variant: str, P: int, evaluation: str, n: int = 2400):
    """The case's point under knob ``evaluation``."""
    name, params = (alg, {}) if isinstance(alg, str) else alg
    netw, compute, extra = VARIANTS[variant]
    p = make_point(name, P, n=n, density=0.05, params=params, compute=compute, iterations=1, warmup=1, seed=P,
                   evaluation=evaluation)
    network = net(netw) if isinstance(netw, str) else {**p.network, **netw}
    return dataclasses.replace(p, network=network, **extra)


#: the last forced run's row (what it met at run time: ``inexact``)
LAST: dict = {}


def reference(alg, variant: str, P: int):
    """The events' row and results."""
    return simulate_point(point_of(alg, variant, P, "events"), keep_results=True)


def run_case(alg, variant: str, P: int, evaluator: str, ref=None, strict: bool = True) -> tuple[str, str]:
    """(outcome, detail) of ``evaluator`` forced on the case (module docstring);
    AssertionError where it breaks its claim (not ``strict``: ("broken", why))."""
    try:
        return _case(alg, variant, P, evaluator, ref)
    except AssertionError as err:
        if strict:
            raise
        return "broken", str(err)


def _case(alg, variant: str, P: int, evaluator: str, ref) -> tuple[str, str]:
    point = point_of(alg, variant, P, evaluator)
    try:
        got = simulate_point(point, keep_results=True)
    except EvaluationError as err:
        return "declined", str(err).split(": ", 2)[-1]
    row = got.row
    LAST.clear()
    LAST.update(row)
    used = row["evaluator"].split("+")
    if evaluator not in used:
        assert TABLE[evaluator].level == "collective" and used == ["events"], (label(alg), variant, P, evaluator, used)
        return "declined", "the point has no collective it can time"
    assert used in ([evaluator], ["events", evaluator]), (label(alg), variant, P, evaluator, used)
    ref = ref or reference(alg, variant, P)
    a, b = ref.row, row
    where = (label(alg), variant, P, evaluator)
    assert (a["bytes_total"], a["bytes_sent_max"], a["msgs_total"]) == \
        (b["bytes_total"], b["bytes_sent_max"], b["msgs_total"]), where
    if b["values"] == "full":   # (sizes carry no results to compare)
        n = point.workload["n"]
        for x, y in zip(ref.results, got.results):
            np.testing.assert_array_equal(to_dense(x, n), to_dense(y, n), err_msg=str(where))
    bound = float(b["error_bound"])
    err = abs(b["time_s"] - a["time_s"]) / a["time_s"] if a["time_s"] else 0.0
    if bound == 0.0:
        assert (a["time_s"], a["time_max_s"]) == (b["time_s"], b["time_max_s"]), \
            (*where, f"claims exact, error {err:.3g}")
        return "exact", ""
    assert err <= bound, (*where, f"error {err:.3g} past the declared bound {bound:.3g}")
    return "within", f"{err:.4%} of at most {bound:.3g}"
