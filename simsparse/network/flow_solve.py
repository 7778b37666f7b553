"""The flow-level model's solve: max-min rates of the shared flows, on the
links they cross (:class:`~simsparse.network.flow.FlowNetwork` mixes it in).

Cost model: progressive filling (:mod:`.maxmin`) over the flows that share
a link; a flow alone on its links runs at its route's bottleneck, and after
flows only left, a flow slower than the slowest leaver keeps its rate.
"""
from __future__ import annotations

import numpy as np

from . import ack_queue
from .. import jit
from .maxmin import _CLASSIFY, _SOLVE_SHARED, REL_TOL, maxmin_rates


class FlowSolve:
    """Mixed into :class:`~simsparse.network.flow.FlowNetwork`: reads its
    routes, shared-flow arrays and link numbering."""

    def _solve(self, floor: float) -> np.ndarray:
        """Max-min rates of the shared flows. Those alone on all their links get
        their bottleneck without solving. When flows have only left, the
        slowest of them at rate ``floor``, a flow slower than that keeps its
        rate (it crosses no link the leavers' rates could free: a link on
        which it is bottlenecked is saturated below ``floor``), so only the
        others are solved, on what the slow ones leave of each link."""
        self.solves += 1
        if _SOLVE_SHARED is not None and self.ack_eff >= 1.0 and jit.enabled():
            return self._solve_compiled(floor)
        return self._solve_numpy(floor)

    def _solve_compiled(self, floor: float) -> np.ndarray:
        """:meth:`_solve_numpy` compiled (:func:`.maxmin._classify` and
        :func:`.maxmin._solve_shared`): the same operations in the same order,
        the same rates to the last bit, without the dozen numpy calls a
        solve of a few hundred flows spent most of its time in."""
        rt, rid = self._routes, self._rid
        rate, state, nsh, nkept, unnumbered = _CLASSIFY(rt.R, rt.bneck, rid, self._cnt, self._rate, floor,
                                                        self._slot, REL_TOL)
        if nsh:
            if unnumbered:
                self._numbered(rt.R[rid])
            if len(self._loc) < len(self._slot_cap):
                self._loc = np.full(2 * len(self._slot_cap), -1, dtype=np.int64)
            _SOLVE_SHARED(rt.R, rid, state, rate, self._slot, self._slot_cap, self._loc, nsh, nkept, REL_TOL)
        return rate

    def _solve_numpy(self, floor: float) -> np.ndarray:
        """:meth:`_solve` in numpy, with the acknowledgement queues' derating."""
        rt, rid = self._routes, self._rid
        R = rt.R[rid]
        rate = rt.bneck[rid]
        shared = self._cnt[R].max(axis=1) > 1.0
        if floor > 0.0 and self.ack_eff >= 1.0:   # a leaver may empty a queue: all rates may change
            kept = shared & (self._rate < floor * (1.0 - REL_TOL))
            rate[kept] = self._rate[kept]
            shared &= ~kept
        else:
            kept = None
        if not shared.any():
            return rate
        L = self._numbered(R)
        cap = self._slot_cap
        if kept is not None and kept.any():
            used = np.bincount(L[kept].ravel(), weights=np.repeat(rate[kept], R.shape[1]), minlength=len(cap))
            cap = np.maximum(cap - used, 0.0)
        rate[shared] = maxmin_rates(L[shared], cap)
        if self.ack_eff < 1.0:
            sh = np.flatnonzero(shared)
            back_ids = self._reverse(rid[sh])   # first: it may grow the route table (a new array)
            back = self._slot[rt.R[back_ids]]
            less = ack_queue.derated(L[sh], rate[sh], cap, self._slot_port, back, self.ack_eff)
            if less is not None:
                rate[sh] = maxmin_rates(L[sh], less)
        return rate

    def _reverse(self, rids: np.ndarray) -> np.ndarray:
        """The default routes back from each route's destination to its source."""
        rt = self._routes
        out = np.empty(len(rids), dtype=np.intp)
        for i, r in enumerate(rids.tolist()):
            b = rt.rev.get(r)
            if b is None:
                es, ed = rt.ends[r]
                b = rt.rev[r] = self.route_id(ed, es)   # (by pair: found, or added)
            out[i] = b
        return out

    def _numbered(self, R: np.ndarray) -> np.ndarray:
        """``R`` (link ids) in the solver's dense link numbering, numbering
        the links seen for the first time in increasing id order."""
        L = self._slot[R]
        if (L < 0).any():
            new = np.unique(R[L < 0])
            n0 = len(self._slot_cap)
            self._slot[new] = np.arange(n0, n0 + len(new))
            self._slot_cap = np.concatenate((self._slot_cap, self._cap[new]))
            self._slot_port = np.concatenate((self._slot_port, self._port[new]))
            L = self._slot[R]
        return L

