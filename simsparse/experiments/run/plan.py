"""A schedule point's model profile, cost models and merge plan.

The planners (:mod:`simsparse.schedules.planner`) are plain functions of cost
models. This module builds those models for a point, the way the papers
built theirs:

* ``tb``: the model profile's per-tensor backward times on the point's device
  (:mod:`simsparse.compute.models`);
* ``ts(d)``: the device's cost of ``topk`` on d elements (the OMGS paper's
  "TopKPerfModel", Eq. 10; 0 for dense schedules);
* ``tc(d) = alpha + beta d``: a least-squares fit (non-negative) of the
  bucket collective's time on the point's own network at P ranks, from
  microbenchmarks of that collective alone in the simulator (ideal compute)
  at several sizes -- as the OMGS and MG-WFBP papers fitted alpha and beta
  to nccl-tests / MPI measurements on their cluster (OMGS Eq. 11, Fig. 2b).
  They run under the point's own ``evaluation`` (its evaluators: the
  same network model as its iterations, at a fraction of the event
  path's cost at P = 1024); where ``fast`` times the point's collectives
  by an approximation only because its events would take minutes
  (``evaluators.LONG_S``), its microbenchmarks take the same evaluator.
  Each time is a row's ``time_s``: the mean over a period of the
  collective's periodic work (Ok-Topk's exact thresholds and boundaries in
  their share of iterations, :mod:`.period`).

Plans are resolved once per point and cached; the real backend receives the
plan the simulator used, so both run the same buckets.
"""
from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache

import numpy as np
from scipy.optimize import nnls

from ...schedules import PlanCosts
from ...workload import drawn_once
from ..config.point import Point
from .resolve import PLAN_MAX_ELEMS, collective_evaluator, messages, resolve
from .simulate import model_profile_of, simulate


def with_plan(point: Point) -> Point:
    """The point with its schedule's merge plan resolved."""
    if point.schedule is None or point.plan is not None:
        return point
    return replace(point, plan=_plan(_key(point)))


def plan_costs(point: Point) -> PlanCosts:
    """The cost models a planner sees for this point (backward order)."""
    prof = model_profile_of(point)
    sizes, tb = prof.sizes[::-1], prof.t_bwd[::-1]
    cls = point.schedule_cls
    if not cls.needs_costs():
        return PlanCosts(tb, sizes, lambda d: 0.0, lambda d: 0.0, 0.0, prof.t_forward)
    alpha, beta = comm_fit(point)
    device = point.device()
    density = point.workload["density"]
    if cls.accepts == "dense" or point.compute is None:
        ts = _zero
    else:
        def ts(d):  # scalar or numpy array of sizes (the exact planner evaluates all group sizes at once)
            d = np.asarray(d, float)
            k = np.maximum(1.0, density * d)
            out = device.cost_array("topk", d, 4 * d + 8 * k, select=k)
            return float(out) if out.ndim == 0 else out
    return PlanCosts(tb, sizes, ts, lambda d: alpha + beta * d, alpha, prof.t_forward)


def _zero(d: float) -> float:
    return 0.0


def comm_fit(point: Point) -> tuple[float, float]:
    """(alpha, beta per element) of the bucket collective on this network and P."""
    return _comm_fit(json.dumps({"network": point.network, "P": point.P, "algorithm": point.algorithm,
                                 "params": point.params, "density": point.workload["density"],
                                 "dtype": point.workload["dtype"], "seed": point.workload["seed"],
                                 "total": point.workload["n"], "evaluation": _evaluation(point)}, sort_keys=True))


def _evaluation(point: Point) -> str:
    """The evaluation of the point's microbenchmarks: its own, or the
    approximation ``fast`` chose for its collectives where only its events
    were exact and would take too long (they are part of its simulation)."""
    if point.evaluation not in ("fast", "sampled"):
        return point.evaluation
    chain = resolve(point).plan.chain
    if chain is None or not chain.events_s:
        return point.evaluation
    return collective_evaluator(chain, messages(point)[0]).name


@lru_cache(maxsize=256)
def _comm_fit(key: str) -> tuple[float, float]:
    k = json.loads(key)
    top = max(1 << 10, min(k["total"], PLAN_MAX_ELEMS // k["P"]))
    sizes = sorted({int(s) for s in np.geomspace(1 << 10, top, 5)} | {max(k["P"], 1 << 10)})
    times = []
    for n in sizes:
        pt = Point(algorithm=k["algorithm"], P=k["P"], params=k["params"], network=k["network"], compute=None,
                   workload={"n": n, "density": k["density"], "dtype": k["dtype"], "seed": k["seed"]},
                   iterations=1, warmup=0, check=False, evaluation=k["evaluation"])
        with drawn_once():
            times.append(simulate(pt).row["time_s"])
    A = np.column_stack([np.ones(len(sizes)), np.asarray(sizes, float)])
    (alpha, beta), _ = nnls(A, np.asarray(times))
    return float(alpha), float(beta)


def _key(point: Point) -> str:
    return json.dumps({**point.to_dict(), "plan": None, "iterations": 0, "warmup": 0, "check": False,
                       "data_scale": 1.0}, sort_keys=True, default=str)


@lru_cache(maxsize=256)
def _plan(key: str) -> tuple:
    point = Point.from_dict(json.loads(key))
    cls = point.schedule_cls
    plan = tuple(int(g) for g in cls.plan(cls.Params.model_validate(point.schedule_params), plan_costs(point)))
    if sum(plan) != len(point.workload["layers"]):
        raise RuntimeError(f"{cls.name}: plan {plan} does not cover the model's tensors")
    return plan
