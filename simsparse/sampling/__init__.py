"""Sampled gradients (``values: sampled``): each rank draws only the
entries it could select, exactly in distribution, at O(k) instead of O(n).

* :mod:`.gradient`: one iteration's gradient, the entries above a floor;
* :mod:`.paths`: several iterations where gradients drift or errors feed
  back (each coordinate's path);
* :class:`SampledModel`: a training iteration's buckets, each a vector of
  its own;
* :func:`sampled_problem`: why a point cannot be sampled;
* :func:`within_floors`: a run again with a floor widened while a selection
  reaches below one, and :func:`learnt_floors`, the floors a pilot learnt.
"""
from __future__ import annotations

import gc
import math

import numpy as np

from ..compute.sampled import BelowFloor, Sampled, SampledPart
from ..period import iterations_run
from .draws import salt_of, selected
from .gradient import sampled_gradient as _one_iteration
from .law import PathLaw, path_law, path_problem
from .paths import path_gradient

__all__ = ["SAMPLED_ATTEMPTS", "SampledModel", "learnt_floors", "point_law", "sampled_gradient", "sampled_problem",
           "widened", "within_floors"]


def sampled_gradient(workload, rank: int, iteration: int, margin: float = 4.0,
                     layers: tuple | None = None, law: PathLaw | None = None,
                     widen: tuple | None = None, kept: dict | None = None) -> Sampled:
    """Rank's gradient at ``iteration`` as the entries reaching the floor;
    ``layers``: only the span (first, end) of whole layers, as a vector of
    its own (its own floor and draws); ``law``: the iterations' joint law
    where gradients drift or errors feed back (:mod:`.paths`); ``widen``:
    per iteration, a factor on the entries its floor admits (a point run
    again after a selection reached below a floor: :func:`widened`), drawn
    from streams of their own; ``kept``: where the paths wait between a
    rank's iterations (:func:`.paths.path_gradient`)."""
    if law is not None:
        return path_gradient(workload, rank, iteration, margin, layers, law, widen, kept)
    if widen is None:
        return _one_iteration(workload, rank, iteration, margin, layers)
    # (one floor for every iteration: a static gradient is the same one at each)
    return _one_iteration(workload, rank, iteration, margin * max(widen), layers, salt_of(widen))


def sampled_problem(point) -> str | None:
    """Why a point cannot run with ``values: sampled``, or None (dense
    collectives run on sizes, as with ``values: auto``)."""
    cls = point.algorithm_cls
    if cls.value_free:
        return None
    if cls.sampling is None:
        return (f"{point.algorithm} reads every value of its input (not only the largest ones), which a sampled "
                f"gradient does not carry; use evaluation: exact (full values)")
    workload = point.workload_obj()
    if workload.source is not None:
        return "gradients replayed from files (workload.source) cannot be sampled"
    return path_problem(workload, error_feedback(point), iterations_run(point))


def error_feedback(point) -> bool:
    """Whether the point's algorithm feeds back its residual."""
    return bool(getattr(point.params_model(), "error_feedback", False))


def point_law(point) -> PathLaw | None:
    """The joint law a point's sampled gradients are drawn with over the
    iterations it simulates (:func:`.law.path_law`), or None."""
    return path_law(point.workload_obj(), error_feedback(point), iterations_run(point))


class SampledModel:
    """A rank's sampled gradient in a training iteration, cut as the
    schedule's plan cuts it: each bucket (a span of whole tensors) is drawn
    as a vector of its own, with the floor of its own k, when the schedule
    takes it (O(k) per bucket, every bucket independent: its coordinates
    are). Sliced by tensor as the simulator hands out gradients: a tensor
    that is a bucket alone comes as its :class:`Sampled`, a tensor of a
    larger bucket as a :class:`SampledPart` that ``concat`` packs with the
    others (:meth:`join`). ``buckets``: (first, end) tensor indices;
    ``margin_for(k)``: the algorithm's sampling margin at a bucket's k;
    ``widen``, ``kept``: as :func:`sampled_gradient`'s, for every bucket."""

    def __init__(self, workload, rank: int, iteration: int, buckets, margin_for, law: PathLaw | None = None,
                 widen: tuple | None = None, kept: dict | None = None):
        offs = np.concatenate([[0], np.cumsum(workload.layers)]).astype(np.int64).tolist()
        self.workload, self.rank, self.iteration, self.margin_for, self.law = workload, rank, iteration, margin_for, law
        self.widen, self.kept = widen, kept
        self.spans = {(offs[lo], offs[hi]): (lo, hi) for lo, hi in buckets}
        self.dtype = np.dtype(workload.dtype)

    def __getitem__(self, where: slice):
        a, b = where.start, where.stop
        if (a, b) in self.spans:
            return self._draw(a, b)
        return SampledPart(self, a, b, self.dtype)

    def tensors(self, spans) -> list:
        """``[self[a:b] for a, b in spans]``, in one call (a bucket's tensors)."""
        own, dtype = self.spans, self.dtype
        return [self._draw(a, b) if (a, b) in own else SampledPart(self, a, b, dtype) for a, b in spans]

    def join(self, parts) -> Sampled:
        """The bucket that ``parts`` (in order, side by side) make up."""
        a, b = parts[0].start, parts[-1].end
        if any(p.owner is not self or p.end != q.start for p, q in zip(parts, parts[1:])) or (a, b) not in self.spans:
            raise ValueError(f"concat of sampled tensors {[(p.start, p.end) for p in parts]}: not one bucket of "
                             f"the plan {sorted(self.spans)}")
        return self._draw(a, b)

    def _draw(self, a: int, b: int) -> Sampled:
        margin = self.margin_for(selected(self.workload.density, b - a))
        return sampled_gradient(self.workload, self.rank, self.iteration, margin, self.spans[(a, b)], self.law,
                                self.widen, self.kept)


#: a selection that reached below a floor: the most times a point is run (each run widens the floors)
SAMPLED_ATTEMPTS = 4


def widened(widen: tuple | None, err, T: int) -> tuple:
    """The factors of the next run after ``err`` (a :class:`BelowFloor` at
    ``err.iteration``): that iteration's floor admits the entries the query
    needed plus eight standard deviations of that count (a binomial one),
    in proportion to what it carried, at least 1.25 times as many as
    before (twice where the need is unknown); the later iterations' at least
    as many (a residual that grew keeps growing: one run, not one per
    iteration)."""
    w = list(widen or (1.0,) * T)
    t = min(err.iteration, T - 1)
    if err.needed is None or not err.have:
        w[t] *= 2.0
    else:
        need = err.needed + 8.0 * math.sqrt(err.needed) + 10.0
        w[t] *= max(1.25, need / err.have)
    return tuple(w[:t + 1] + [max(x, w[t]) for x in w[t + 1:]])


def within_floors(run, widen: tuple | None, T: int):
    """``run(widen)``, again with the floor of the iteration a selection
    reached below widened (:func:`widened`; ``T``: the iterations a run
    draws), at most :data:`SAMPLED_ATTEMPTS` times: (its value, the factors
    it ran with). The floors only decide which entries are drawn: any floor
    the selections stay above gives the same distribution."""
    for _ in range(SAMPLED_ATTEMPTS - 1):
        try:
            return run(widen), widen
        except BelowFloor as err:
            if err.iteration is None:
                raise
            widen = widened(widen, err, T)
            gc.collect()   # (the failed run's gradients and states before the next draws them)
    return run(widen), widen


#: the floors the pilots of this process learnt, by their point: a P sweep runs one pilot
_PILOTS: dict = {}


def learnt_floors(key: str, pilot):
    """The factors the pilot ``pilot()`` (a run at a few ranks, returning the
    factors it ended with) learnt, run once per ``key`` in this process."""
    if key not in _PILOTS:
        if len(_PILOTS) >= 64:
            _PILOTS.clear()
        _PILOTS[key] = pilot()
    return _PILOTS[key]
