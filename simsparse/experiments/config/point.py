"""One experiment point: everything a backend needs to run it, as plain data.

A point is fully resolved (network preset files read, device profile loaded)
so it can be sent as JSON to ``mpiexec`` workers, and hashed into a stable
``point_id`` used to resume interrupted sweeps.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ...algorithms import Setup, get_algorithm
from ...compute.devices import DeviceProfile, make_device
from ...network.spec import NETWORK_SPECS
from ...workload import Workload


@dataclass(frozen=True)
class Point:
    algorithm: str
    P: int
    workload: dict
    network: dict
    params: dict = field(default_factory=dict)
    compute: dict | None = None  # None = ideal device
    iterations: int = 3
    warmup: int = 1
    check: bool = True
    #: the simulator carries data at this fraction of n and scales bytes and
    #: compute work back up (1: full size); the real backend always runs full size
    data_scale: float = 1.0
    #: a training iteration: a registered schedule whose buckets communicate
    #: with ``algorithm``; the model is ``workload["model"]``
    schedule: str | None = None
    schedule_params: dict = field(default_factory=dict)
    batch_size: int | None = None
    #: the schedule's merge plan (group lengths in backward order), resolved
    #: before the point runs (derived from the point, so not part of its id)
    plan: tuple | None = None
    #: how the simulator times the point (simsparse.backends.evaluators): "fast" (the default), "exact",
    #: "events" (the reference), "sampled" (fast, with sampled values wherever the algorithm allows), or one
    #: evaluator's name; part of the id unless "fast"
    evaluation: str = "fast"
    #: the software stack of a training point (schedules.stack.Stack as a dict; empty: none)
    stack: dict = field(default_factory=dict)
    #: a training point whose algorithm is its schedule's default (the config
    #: listed none): shown in the table; the same run (not part of the id)
    algorithm_default: bool = False

    # -- identity ----------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Point":
        if d.get("plan") is not None:
            d = {**d, "plan": tuple(d["plan"])}
        return cls(**d)

    def point_id(self, backend: str) -> str:
        d = self.to_dict()
        d.pop("plan")
        d.pop("algorithm_default")
        if backend != "sim" or self.evaluation == "fast":
            d.pop("evaluation")   # ids of points at the default stay as before
        if backend != "sim" or self.data_scale == 1.0:
            d.pop("data_scale")  # the real backend always runs full size; ids of full-size points stay as before
        if not self.stack:  # ids of points without a stack stay as before
            d.pop("stack")
        if self.schedule is None:  # ids of bare-collective points stay as before
            for key in ("schedule", "schedule_params", "batch_size"):
                d.pop(key)
        blob = json.dumps({"backend": backend, **d}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    # -- builders ------------------------------------------------------------
    @property
    def algorithm_cls(self):
        return get_algorithm(self.algorithm)

    @property
    def schedule_cls(self):
        from ...schedules import get_schedule

        return get_schedule(self.schedule)

    @property
    def model(self) -> str | None:
        return self.workload.get("model")

    def params_model(self):
        return self.algorithm_cls.Params.model_validate(self.params)

    def workload_obj(self) -> Workload:
        return Workload(**self.workload)

    def at_scale(self) -> tuple["Point", float]:
        """The point the simulator runs (workload shrunk by ``data_scale``) and
        the factor by which its bytes and compute work are scaled back up."""
        if self.data_scale >= 1:
            return self, 1.0
        w = self.workload_obj().scaled(self.data_scale)
        wd = {**self.workload, "n": w.n, "layers": list(w.layers) if w.layers else None, "model": None}
        return replace(self, workload=wd), self.workload["n"] / w.n

    def network_spec(self):
        return NETWORK_SPECS[self.network.get("model", "alphabeta")].model_validate(self.network)

    def device(self):
        return make_device(None if self.compute is None else DeviceProfile.model_validate(self.compute))

    def setup(self, rank: int) -> Setup:
        w = self.workload
        layers = w.get("layers")
        return Setup(rank=rank, P=self.P, n=w["n"], density=w["density"], dtype=w["dtype"],
                     layers=tuple(layers) if layers else None)

    def instances(self) -> list:
        """One algorithm instance per rank (they keep per-rank state)."""
        cls, params = self.algorithm_cls, self.params_model()
        return [cls(self.setup(r), params) for r in range(self.P)]

    def schedule_for(self, rank: int):
        """Rank's schedule instance (it keeps one algorithm instance per bucket)."""
        if self.plan is None:
            raise RuntimeError("the point's merge plan is not resolved (experiments.run.plan.with_plan)")
        cls = self.schedule_cls
        w = self.workload
        from ...schedules.stack import Stack

        return cls(rank, self.P, tuple(w["layers"]), w["density"], w["dtype"], self.plan, self.algorithm_cls,
                   self.params_model(), Stack.model_validate(self.stack) if self.stack else None)

    # -- description -----------------------------------------------------------
    def label_columns(self) -> dict:
        """The columns of a results row that describe this point."""
        spec = self.network_spec()
        cols = {
            "schedule": self.schedule or "",
            "model": self.model or "",
            "batch_size": self.batch_size if self.batch_size is not None else "",
            "algorithm": self.algorithm,
            "params": json.dumps(self.params, sort_keys=True) if self.params else "",
            "P": self.P,
            "n": self.workload["n"],
            "density": self.workload["density"],
            "k": self.setup(0).k,
            "dtype": self.workload["dtype"],
            "seed": self.workload["seed"],
            "network": spec.label(),
            "compute": "ideal" if self.compute is None else self.compute.get("name", "custom"),
            "iterations": self.iterations,
            "warmup": self.warmup,
            "data_scale": self.data_scale,
        }
        for key, val in self.network.items():
            if isinstance(val, (int, float, str, bool)) and key not in ("name", "source"):
                cols[f"net_{key}"] = val
        for key, val in self.workload.items():  # the gradient source's knobs (overlap, drift, ...)
            if isinstance(val, (int, float, str, bool)) and key not in ("n", "density", "dtype", "seed", "model"):
                cols[f"wl_{key}"] = val
        if self.algorithm_default:
            cols["algorithm_default"] = True
        if self.schedule_params:
            cols["schedule_params"] = json.dumps(self.schedule_params, sort_keys=True)
        if self.stack:
            cols["stack"] = ", ".join(k for k, v in self.stack.items() if v)
        return cols


def to_dense(result, n: int) -> np.ndarray:
    """A rank's result as a dense numpy vector (accepts arrays, tensors, COO)."""
    from ...ops import COO

    if isinstance(result, COO):
        out = np.zeros(n)
        out[_np(result.indices)] += _np(result.values)
        return out
    return _np(result)


def to_host(x):
    """Arrays, tensors and payloads as host numpy (payloads keep their type)."""
    from ...ops import Payload

    if isinstance(x, Payload):
        return x.map(_np)
    return _np(x)


def _np(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "detach"):  # torch tensor
        return a.detach().cpu().numpy()
    return np.asarray(a)
