"""Flow-level network model: every message is a flow on a fixed route whose
rate is its max-min fair share of the links it crosses.

Timeline of a message of m bytes posted (handed to :meth:`FlowNetwork.transfer`)
at time t, on a route with link latencies summing to L (LogGP names, Alexandrov
et al. 1995):

1. **send overhead** ``o_s``: the message enters the network at
   ``t0 = t + o_s``, or later if the sending endpoint's previous message
   entered less than the **gap** ``g`` before (``t0 >= previous t0 + g``);
2. **bandwidth phase**: from t0 its bytes drain at the max-min fair rate
   along the route, recomputed whenever the set of active flows changes;
3. **latency**: the last byte arrives ``L`` after it left, and the receiver
   spends ``o_r``; then ``done()`` is called.

So a single flow on an idle network takes exactly
``o_s + m / min(link bandwidth) + L + o_r``: the alpha-beta cost with
``alpha = o_s + L + o_r`` and ``beta = 1 / bottleneck``. Latency is paid
after the bandwidth phase, i.e. a flow holds bandwidth from the moment it is
injected (cut-through: the network is a pipe L long), and contending flows
share only the bandwidth phase.

Rates are recomputed at most once per simulated timestamp: starts and ends
are batched by one "tick" event scheduled at the current time with a SimPy
priority after every ordinary event of that time. Each active flow keeps its
rate and the time it will finish at that rate. A tick retires the flows that
have finished, admits the new ones and, if the set of flows sharing a link
changed, turns every flow's end time back into remaining bytes
(rate x time left), solves max-min fairness again (:func:`maxmin_rates`,
vectorised progressive filling) and sets new end times; then it schedules the
next tick at the earliest end or start. A flow alone on all its links (a ring
step, a pairwise exchange on a non-blocking network) gets its route's
bottleneck rate, and starting or ending it changes no other flow's rate, so
it needs no solve.
"""
from __future__ import annotations

import heapq
import random
from typing import Callable

import numpy as np
from simpy.events import NORMAL, Event

TICK_PRIORITY = NORMAL + 1   # after every ordinary event of the same timestamp
REL_TOL = 1e-9               # bottleneck shares this close are equal
END_TOL = 1e-12              # flows ending within now * END_TOL of a tick end at it


def maxmin_rates(routes: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling (Bertsekas and Gallager,
    *Data Networks*, section 6.5.2).

    ``routes`` is flows x hops of link ids padded with the last link id
    (``len(cap) - 1``), whose capacity must be ``inf``. Each round raises all
    unfrozen flows by the smallest remaining fair share of any link
    (remaining capacity / unfrozen flows on it), and freezes the flows that
    cross a link saturated by that raise. Rounds = distinct bottleneck levels;
    each is a few numpy operations over the flows x hops array (the link
    space is first compacted to the links in use when that is smaller)."""
    F = routes.shape[0]
    rate = np.empty(F)
    if F == 0:
        return rate
    if len(cap) > 2 * routes.size:
        ids, inv = np.unique(np.append(routes.ravel(), len(cap) - 1), return_inverse=True)
        routes, cap = inv[:-1].reshape(routes.shape), cap[ids]
    nl = len(cap)
    cnt = np.bincount(routes.ravel(), minlength=nl).astype(np.float64)
    cnt[-1] = 0.0
    capr = cap.copy()
    todo = np.arange(F)
    R = routes
    level = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        while True:
            share = (capr[R] / cnt[R]).min(axis=1)
            delta = share.min()
            hit = share <= delta * (1.0 + REL_TOL)
            level += delta
            if hit.all():
                rate[todo] = level
                return rate
            rate[todo[hit]] = level
            capr -= delta * cnt
            cnt -= np.bincount(R[hit].ravel(), minlength=nl)
            cnt[-1] = 0.0
            keep = ~hit
            R, todo = R[keep], todo[keep]


class _Routes:
    """Routes between endpoints of one machine, as rows of a padded array."""

    def __init__(self, machine, n_links: int):
        self.machine = machine
        self.dummy = n_links
        self.R = np.full((64, 8), n_links, dtype=np.int32)
        self.lat = np.zeros(64)
        self.bneck = np.zeros(64)   # the route's smallest link bandwidth
        self.n = 0
        self.ids: dict = {}
        self._lat_of, self._bw_of = machine.topo.lat_arr, machine.topo.bw_arr

    def add(self, links: list[int]) -> int:
        i = self.n
        if i == len(self.R):
            self.R = np.vstack([self.R, np.full_like(self.R, self.dummy)])
            self.lat = np.concatenate([self.lat, np.zeros(len(self.lat))])
            self.bneck = np.concatenate([self.bneck, np.zeros(len(self.bneck))])
        if len(links) > self.R.shape[1]:
            self.R = np.hstack([self.R, np.full((len(self.R), len(links) - self.R.shape[1]), self.dummy, np.int32)])
        self.R[i, :len(links)] = links
        self.lat[i] = float(self._lat_of[links].sum()) if links else 0.0
        self.bneck[i] = float(self._bw_of[links].min()) if links else np.inf
        self.n += 1
        return i


class FlowNetwork:
    """The flow-level model the simulator drives (``reset`` / ``transfer``).

    ``machine_for(P)`` builds the :class:`~.node.Machine` for P ranks and
    ``place(machine, P)`` gives every rank's endpoint; both are called once
    per P and kept. ``seed`` drives random routing choices (Valiant)."""

    def __init__(self, machine_for: Callable, place: Callable, send_overhead_s: float = 0.0,
                 recv_overhead_s: float = 0.0, gap_s: float = 0.0, seed: int = 0, describe: str = "flow"):
        self._machine_for, self._place = machine_for, place
        self.o_s, self.o_r, self.gap = float(send_overhead_s), float(recv_overhead_s), float(gap_s)
        self.seed = seed
        self._describe = describe
        self._per_P: dict[int, tuple] = {}
        self.env = None

    # -- setup -------------------------------------------------------------------
    def machine(self, P: int):
        """The machine, every rank's endpoint, link capacities (+ padding link)
        and the route table for P ranks (built once)."""
        got = self._per_P.get(P)
        if got is None:
            m = self._machine_for(P)
            eps = [int(e) for e in self._place(m, P)]
            cap = np.append(m.topo.bw_arr, np.inf)
            got = self._per_P[P] = (m, eps, cap, _Routes(m, m.topo.n_links))
        return got

    def reset(self, env, P: int) -> None:
        """Bind to a fresh simulation of P ranks on an idle network."""
        self.env = env
        m, self._ep, self._cap, self._routes = self.machine(P)
        self._m = m
        self._adaptive = m.adaptive
        self._cnt = np.zeros(len(self._cap))    # active flows per link (the padding link stays 0)
        self._load = np.zeros(len(self._cap))   # flows per link incl. those about to start (adaptive routing)
        self._rng = random.Random(self.seed)
        self._nic_free: dict[int, float] = {}
        # active flows, as parallel arrays
        self._rid = np.zeros(0, dtype=np.intp)   # route id
        self._rate = np.zeros(0)                 # bytes/s
        self._end = np.zeros(0)                  # when the last byte leaves at this rate
        self._dones = np.zeros(0, dtype=object)
        self._new: list = []        # (route id, bytes, done) starting at the next tick
        self._later: list = []      # heap of (start time, seq, route id, bytes, done)
        self._seq = 0
        self._tick_at = None        # time of the pending valid tick
        self._gen = 0
        self.solves = 0
        self.ticks = 0

    def route_id(self, es: int, ed: int, key=None) -> int:
        """Row of the route from endpoint es to endpoint ed (cached)."""
        rt = self._routes
        ck = (es, ed, key)
        rid = rt.ids.get(ck)
        if rid is None:
            rid = rt.ids[ck] = rt.add(self._m.route(es, ed, key))
        return rid

    # -- the interface the simulator calls --------------------------------------------
    def transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None]) -> None:
        es, ed = self._ep[src], self._ep[dst]
        rt = self._routes
        if self._adaptive:
            rid = self.route_id(es, ed, self._m.select(es, ed, self._load, self._rng))
            self._load[rt.R[rid]] += 1.0
        else:
            rid = rt.ids.get((es, ed, None))
            if rid is None:
                rid = self.route_id(es, ed)
        now = self.env.now
        t0 = now + self.o_s
        if self.gap > 0.0:
            t0 = max(t0, self._nic_free.get(es, 0.0))
            self._nic_free[es] = t0 + self.gap
        if nbytes <= 0:
            self.env.timeout(t0 - now + rt.lat[rid] + self.o_r).callbacks.append(lambda _e: done())
        elif t0 > now:
            self._seq += 1
            heapq.heappush(self._later, (t0, self._seq, rid, nbytes, done))
            self._want_tick(t0)
        else:
            self._new.append((rid, nbytes, done))
            self._want_tick(now)

    def describe(self) -> str:
        return self._describe

    # -- event handling ---------------------------------------------------------------
    def _want_tick(self, t: float) -> None:
        if self._tick_at is not None and self._tick_at <= t:
            return
        self._gen += 1
        self._tick_at = t
        ev = Event(self.env)
        ev._ok = True
        ev._value = self._gen
        ev.callbacks.append(self._on_tick)
        self.env.schedule(ev, TICK_PRIORITY, t - self.env.now)

    def _on_tick(self, ev) -> None:
        if ev._value != self._gen:
            return  # superseded by an earlier tick
        self._tick_at = None
        self.ticks += 1
        now = self.env.now
        resolve = False
        if len(self._end):
            fin = self._end <= now * (1.0 + END_TOL)
            if fin.any():
                resolve = self._retire(fin, now)
        later, new = self._later, self._new
        while later and later[0][0] <= now:
            new.append(heapq.heappop(later)[2:])
        if new:
            self._new = []
            resolve = self._admit(new, now) or resolve
        if resolve and len(self._end):
            rem = (self._end - now) * self._rate
            self._rate = self._solve()
            self._end = now + rem / self._rate
        nxt = float(self._end.min()) if len(self._end) else None
        if later and (nxt is None or later[0][0] < nxt):
            nxt = later[0][0]
        if nxt is not None:
            self._want_tick(nxt)

    def _admit(self, new: list, now: float) -> bool:
        """Start flows at their route's bottleneck rate. True if one of them
        shares a link (then every rate must be solved again)."""
        k = len(new)
        rids = np.fromiter((x[0] for x in new), dtype=np.intp, count=k)
        size = np.fromiter((x[1] for x in new), dtype=np.float64, count=k)
        dones = np.empty(k, dtype=object)
        dones[:] = [x[2] for x in new]
        rt, cnt = self._routes, self._cnt
        Rn = rt.R[rids]
        np.add.at(cnt, Rn, 1.0)
        cnt[-1] = 0.0
        rate = rt.bneck[rids]
        self._rid = np.concatenate((self._rid, rids))
        self._rate = np.concatenate((self._rate, rate))
        self._end = np.concatenate((self._end, now + size / rate))
        self._dones = np.concatenate((self._dones, dones))
        return bool(cnt[Rn].max() > 1.0)

    def _solve(self) -> np.ndarray:
        """Max-min rates of the active flows; those alone on all their links
        get their bottleneck without solving."""
        self.solves += 1
        rt, rid = self._routes, self._rid
        R = rt.R[rid]
        rate = rt.bneck[rid]
        shared = self._cnt[R].max(axis=1) > 1.0
        if shared.any():
            rate[shared] = maxmin_rates(R[shared], self._cap)
        return rate

    def _retire(self, fin: np.ndarray, now: float) -> bool:
        """Drop finished flows and call their ``done`` after latency + o_r.
        True if one of them shared a link (the others' rates change)."""
        idx = np.flatnonzero(fin)
        rids = self._rid[idx]
        rt, cnt = self._routes, self._cnt
        Rf = rt.R[rids]
        shared = bool(cnt[Rf].max() > 1.0)
        np.subtract.at(cnt, Rf, 1.0)
        cnt[-1] = 0.0
        if self._adaptive:
            np.subtract.at(self._load, Rf, 1.0)
        arrive = rt.lat[rids] + self.o_r
        fired = self._dones[idx].tolist()
        keep = ~fin
        self._rid, self._rate, self._end, self._dones = \
            self._rid[keep], self._rate[keep], self._end[keep], self._dones[keep]
        lo, hi = arrive.min(), arrive.max()
        groups = {float(lo): fired} if lo == hi else _group(arrive.tolist(), fired)
        for delay, ds in groups.items():
            if delay <= 0.0:
                _fire(ds)
            else:
                self.env.timeout(delay).callbacks.append(lambda _e, ds=ds: _fire(ds))
        return shared


def _group(keys: list, items: list) -> dict:
    out: dict = {}
    for k, x in zip(keys, items):
        out.setdefault(k, []).append(x)
    return out


def _fire(dones: list) -> None:
    for d in dones:
        d()
