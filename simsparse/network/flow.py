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

A flow whose links carry no other flow when it starts is *solo*: it runs at
its route's bottleneck, its end is known, and it costs one event (its
arrival), as on the alpha-beta path. A flow that finds a link busy is
*shared* and makes the solo flows it meets shared too. Shared-flow rates are
recomputed at most once per simulated timestamp: starts and ends are batched
by one "tick" event scheduled at the current time with a SimPy priority after
every ordinary event of that time. A tick retires the shared flows that have
finished, admits new ones and, if the set of flows sharing a link changed,
turns every end time back into remaining bytes (rate x time left), solves
max-min fairness again (:func:`.maxmin.maxmin_rates`, progressive filling)
and sets new end times; then it schedules the next tick at the earliest end
or start.
"""
from __future__ import annotations

import heapq
import random
from typing import Callable

import numpy as np

from ..engine import NORMAL
from .flow_bulk import BUSY, FlowBulk, Held
from .flow_solve import FlowSolve
from .maxmin import END_TOL

TICK_PRIORITY = NORMAL + 1   # after every ordinary event of the same timestamp


class _Routes:
    """Routes between endpoints of one machine, as rows of a padded array."""

    def __init__(self, machine, n_links: int):
        self.machine = machine
        self.dummy = n_links
        self.R = np.full((64, 8), n_links, dtype=np.int32)
        self.lat = np.zeros(64)
        self.bneck = np.zeros(64)   # the route's smallest link bandwidth
        self.n = 0
        self.ids: dict = {}                # (es, ed, key) -> the id of an adaptive route
        self.links: list[tuple] = []       # per route: its link ids
        self.ends: list[tuple[int, int]] = []   # per route: its endpoints
        self.rev: dict[int, int] = {}      # route id -> the default route back (its acknowledgements' path)
        self.tail: list[float] = []        # per route: latency, as a list for fast scalar access
        self.rate: list[float] = []        # per route: bottleneck bandwidth, likewise
        self.pair: dict[int, int] = {}     # es * endpoints + ed -> the default route's id
        self.watch: list[tuple] = []       # per route: its links whose load adaptive routing reads
        self._lat_of, self._bw_of = machine.topo.lat_arr, machine.topo.bw_arr
        kind = machine.fabric.watch_kind if machine.adaptive else None
        kinds = (kind,) if isinstance(kind, str) else tuple(kind or ())   # one kind or several
        #: per link: whether adaptive routing reads its load (a list, and the same as an array), or None
        self._watched, self.watched = machine.topo.links_of_kind(kinds) if kinds else (None, None)

    def add(self, links: list[int], ends: tuple[int, int] = (-1, -1)) -> int:
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
        self.watch.append(tuple(x for x in links if self._watched[x]) if self._watched else ())
        self.links.append(tuple(links))
        self.ends.append(ends)
        self.tail.append(float(self.lat[i]))
        self.rate.append(float(self.bneck[i]))
        self.n += 1
        return i


class _Solo:
    """A flow alone on all its links: it runs at its route's bottleneck from
    ``start`` to ``end`` and fires ``done`` at ``end + latency + o_r`` unless
    another flow joins one of its links first (then it is ``moved`` to the
    shared set with the bytes it has left)."""

    __slots__ = ("rid", "size", "start", "end", "rate", "done", "moved")

    def __init__(self, rid, size, start, rate, done):
        self.rid, self.size, self.start, self.rate, self.done = rid, size, start, rate, done
        self.end = start + size / rate
        self.moved = False


class FlowNetwork(FlowBulk, FlowSolve):
    """The flow-level model the simulator drives (``reset`` / ``transfer``).

    ``machine_for(P)`` builds the :class:`~.node.Machine` for P ranks and
    ``place(machine, P)`` gives every rank's endpoint; both are called once
    per P and kept. ``seed`` drives random routing choices (Valiant).

    Flows are *solo* or *shared*. A flow whose links carry no other flow when
    it starts is solo: its end is known, so it costs one event (its arrival),
    like the alpha-beta fast path. A link holds either one solo flow or any
    number of shared ones: a flow that finds its links busy is shared, and
    turns the solo flows on its links into shared ones (with the bytes they
    have left). Shared flows are the parallel arrays the ticks advance and
    the max-min solver rates."""

    def __init__(self, machine_for: Callable, place: Callable, send_overhead_s: float = 0.0,
                 recv_overhead_s: float = 0.0, gap_s: float = 0.0, seed: int = 0, burst_B: float = 0.0,
                 ack_queue_efficiency: float = 1.0):
        self._machine_for, self._place = machine_for, place
        self.o_s, self.o_r, self.gap = float(send_overhead_s), float(recv_overhead_s), float(gap_s)
        #: links are token buckets of this depth (payload bytes): see :meth:`_head_start`
        self.burst = float(burst_B)
        #: share of a queued switch port's rate its TCP flows keep when their acknowledgements wait in one (.ack_queue)
        self.ack_eff = float(ack_queue_efficiency)
        self.seed = seed
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
            port = np.append(m.topo.from_switch, False)   # a switch's output port
            got = self._per_P[P] = (m, eps, cap, _Routes(m, m.topo.n_links), port)
        return got

    def reset(self, env, P: int, idle_s: float = 0.0) -> None:
        """Bind to a fresh simulation of P ranks on an idle network. Token
        buckets carry over from the last run of the same P (the next
        iteration of a point), refilled over ``idle_s`` more: see :meth:`_carry`."""
        carried = self._carry(P, idle_s)
        self.env = env
        m, self._ep, self._cap, self._routes, self._port = self.machine(P)
        self._ep_a = np.asarray(self._ep, dtype=np.int64)   # (the bulk waves index it by rank arrays)
        self._m = m
        self._n_ep = m.n_endpoints
        self._adaptive = m.adaptive
        n = len(self._cap)
        self._own: list = [None] * n            # per link: its solo flow (maybe finished), BUSY or None
        self._cnt = np.zeros(n)                 # per link: shared flows (the padding link stays 0)
        # links that carried shared flows, numbered densely as they first do: the
        # solver works in this small space (a few thousand of Piz Daint's 50,918)
        self._slot = np.full(n, -1, dtype=np.intp)   # link -> its number, -1 if none yet
        self._slot_cap = np.zeros(0)                 # number -> capacity
        self._slot_port = np.zeros(0, dtype=bool)    # number -> a switch's output port
        self._loc = np.zeros(0, dtype=np.int64)       # scratch of the compiled solve (maxmin._solve_shared)
        self._load = [0] * n                    # flows per watched link incl. those about to start (adaptive)
        self._routed = 0                        # adaptive flows in flight: none, every _load is 0
        self._rng = random.Random(self.seed)
        self._nic_free: dict[int, float] = {}
        # shared flows, as parallel arrays
        self._rid = np.zeros(0, dtype=np.intp)   # route id
        self._rate = np.zeros(0)                 # bytes/s
        self._end = np.zeros(0)                  # when the last byte leaves at this rate
        self._dones = np.zeros(0, dtype=object)
        self._new: list = []        # (route id, bytes, done) to start at the next tick
        self._later: list = []      # heap of (start time, seq, route id, bytes, done)
        self._seq = 0
        self._tick_at = None        # time of the pending valid tick
        self._gen = 0
        self.solves = 0
        self.ticks = 0
        self.bulk_touched = 0       # flows that found a link a bulk evaluation still held
        if self.burst:              # per link: a token bucket's level _tb_v at time _tb_t (full at the start)
            self._tb_t, self._tb_v = np.zeros(n), np.full(n, self.burst) if carried is None else carried
        self._P = P

    def _carry(self, P: int, idle_s: float = 0.0):
        """Every link's token-bucket level at the end of the last run of P
        ranks, refilled over ``idle_s`` after it, or None (no run yet: full
        buckets). Iterations of a point run back to back on a real network,
        so an iteration finds the buckets the previous one left, refilled
        over the pause between them: with the real backend's common start
        (``DeviceProfile.start_pause_s``, at least 2 ms) the testbed's 18 KB
        buckets at 100 Mb/s are full again, and every iteration's first
        20 KB send of a ring at P = 2 took 275 to 480 us, its second 1.3 to
        1.6 ms (tuned P = 2 star, the five iterations of n = 1e4); a barrier
        alone (a few hundred microseconds, a few KB at 100 Mb/s) leaves them
        nearly as they were."""
        if not self.burst or self.env is None or getattr(self, "_P", None) != P:
            return None
        with np.errstate(invalid="ignore"):   # (the padding link: no time at infinite capacity, a full bucket)
            refill = (np.maximum(self.env.now - self._tb_t, 0.0) + idle_s) * self._cap
        return np.minimum(self.burst, self._tb_v + np.nan_to_num(refill, nan=self.burst))

    def route_id(self, es: int, ed: int, key=None) -> int:
        """Row of the route from endpoint es to endpoint ed (cached): the
        default (non-adaptive) one by pair (``pair``), another by ``key``."""
        rt = self._routes
        if key is None:
            ck = es * self._n_ep + ed
            rid = rt.pair.get(ck)
            if rid is None:
                rid = rt.pair[ck] = rt.add(self._m.route(es, ed), (es, ed))
            return rid
        ck = (es, ed, key)
        rid = rt.ids.get(ck)
        if rid is None:
            rid = rt.ids[ck] = rt.add(self._m.route(es, ed, key), (es, ed))
        return rid

    # -- the interface the simulator calls --------------------------------------------
    def transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None]) -> None:
        es, ed = self._ep[src], self._ep[dst]
        rt = self._routes
        if self._adaptive:
            rid = self.route_id(es, ed, self._m.select(es, ed, self._load, self._rng))
            for x in rt.watch[rid]:
                self._load[x] += 1
            self._routed += 1
        else:
            rid = rt.pair.get(es * self._n_ep + ed)
            if rid is None:
                rid = self.route_id(es, ed)
        now = self.env.now
        t0 = now + self.o_s
        if self.gap > 0.0:
            t0 = max(t0, self._nic_free.get(es, 0.0))
            self._nic_free[es] = t0 + self.gap
        if nbytes <= 0:
            self.env.at(t0 - now + rt.tail[rid] + self.o_r, self._arrive_pair, (rid, done))
        elif not self._solo(rid, nbytes, t0, done, now):
            if t0 > now:
                self._seq += 1
                heapq.heappush(self._later, (t0, self._seq, rid, nbytes, done))
                self._want_tick(t0)
            else:
                self._new.append((rid, nbytes, done))
                self._want_tick(now)


    # -- solo flows ---------------------------------------------------------------------
    def _solo(self, rid: int, size: float, start: float, done, now: float) -> bool:
        """Start a solo flow if its links are free; False if they are not."""
        own = self._own
        links = self._routes.links[rid]
        horizon = now * (1.0 + END_TOL)
        for x in links:
            g = own[x]
            if g is not None:
                if g.end > horizon:   # a running solo flow, or BUSY with shared flows
                    return False
                own[x] = None         # a solo flow whose bytes have all left: the link is free
        rt = self._routes
        if self.burst:
            size = self._head_start(links, size, start, rt.rate[rid])
        f = _Solo(rid, size, start, rt.rate[rid], done)
        for x in links:
            own[x] = f
        self.env.at(f.end + rt.tail[rid] + self.o_r - now, self._solo_arrive, f)
        return True

    def _head_start(self, links: list[int], size: float, start: float, rate: float) -> float:
        """The bytes of a solo flow left after its links' token buckets let
        the rest pass at once (a shaper such as Linux's tbf on an emulated
        link: after an idle period up to ``burst`` bytes leave without
        waiting for the rate). A bucket refills at its link's rate while the
        link is idle, up to ``burst``; a flow drains it, and a link that
        carried shared flows is left empty. Records every link's level at the
        flow's end."""
        cap, t, v, b = self._cap, self._tb_t, self._tb_v, self.burst
        level = [min(b, v[x] + (start - t[x]) * cap[x]) for x in links]
        rest = max(0.0, size - min(level))
        end = start + rest / rate
        for x, lv in zip(links, level):
            v[x] = min(b, max(0.0, lv - size + (end - start) * cap[x]))
            t[x] = end
        return rest

    def _drained(self, x: int) -> None:
        """Link x is free again after carrying shared flows: its bucket is empty now."""
        if self.burst:
            self._tb_t[x], self._tb_v[x] = self.env.now, 0.0

    def _solo_arrive(self, f) -> None:
        if not f.moved:   # _arrive, inlined (once per message)
            if self._adaptive:
                load = self._load
                for x in self._routes.watch[f.rid]:
                    load[x] -= 1
                self._routed -= 1
            f.done()

    def _unsolo(self, links: list[int], now: float, into: list) -> None:
        """Turn the running solo flows on ``links`` into shared flows: those
        already started go to ``into`` with the bytes they have left, the
        others back to the queue of later starts."""
        own = self._own
        horizon = now * (1.0 + END_TOL)
        for x in links:
            g = own[x]
            if g is None or g is BUSY:
                continue
            if type(g) is Held:   # a bulk evaluation's flows: this one runs beside them unseen
                own[x] = None
                self.bulk_touched += 1
                continue
            for y in self._routes.links[g.rid]:
                if own[y] is g:
                    own[y] = None
            if g.end <= horizon:
                continue
            g.moved = True
            if g.start <= now:
                into.append((g.rid, g.size - (now - g.start) * g.rate, g.done))
            else:
                self._seq += 1
                heapq.heappush(self._later, (g.start, self._seq, g.rid, g.size, g.done))

    def _arrive_pair(self, rid_done) -> None:
        self._arrive(*rid_done)

    def _arrive(self, rid: int, done) -> None:
        if self._adaptive:
            for x in self._routes.watch[rid]:
                self._load[x] -= 1
            self._routed -= 1
        done()

    # -- shared flows: event handling -----------------------------------------------------
    def _want_tick(self, t: float) -> None:
        if self._tick_at is not None and self._tick_at <= t:
            return
        self._gen += 1
        self._tick_at = t
        self.env.at(t - self.env.now, self._on_tick, self._gen, TICK_PRIORITY)

    def _on_tick(self, gen) -> None:
        if gen != self._gen:
            return  # superseded by an earlier tick
        self._tick_at = None
        self.ticks += 1
        now = self.env.now
        floor = np.inf   # flows slower than every shared flow that left keep their rates
        if len(self._end):
            fin = self._end <= now * (1.0 + END_TOL)
            if fin.any():
                floor = self._retire(fin, now)
        later, new = self._later, self._new
        while later and later[0][0] <= now:
            new.append(heapq.heappop(later)[2:])
        if new:
            self._new = []
            if self._admit(new, now):
                floor = 0.0
        if floor < np.inf and len(self._end):
            rem = (self._end - now) * self._rate
            self._rate = self._solve(floor)
            self._end = now + rem / self._rate
        nxt = float(self._end.min()) if len(self._end) else None
        if later and (nxt is None or later[0][0] < nxt):
            nxt = later[0][0]
        if nxt is not None:
            self._want_tick(nxt)

    def _admit(self, new: list, now: float) -> bool:
        """Start flows: solo where their links are free, else shared (making
        the solo flows they meet shared too). True if the shared set changed
        in a way that needs a new solve."""
        links, cnt, own = self._routes.links, self._cnt, self._own
        shared: list = []
        i = 0
        while i < len(new):   # _unsolo may append
            rid, size, done = new[i]
            i += 1
            if not self._solo(rid, size, now, done, now):
                self._unsolo(links[rid], now, new)
                shared.append((rid, size, done))
                for x in links[rid]:
                    cnt[x] += 1.0
                    own[x] = BUSY
        if not shared:
            return False
        k = len(shared)
        rids = np.fromiter((x[0] for x in shared), dtype=np.intp, count=k)
        size = np.fromiter((x[1] for x in shared), dtype=np.float64, count=k)
        dones = np.empty(k, dtype=object)
        dones[:] = [x[2] for x in shared]
        rt = self._routes
        Rn = rt.R[rids]
        rate = rt.bneck[rids]
        self._rid = np.concatenate((self._rid, rids))
        self._rate = np.concatenate((self._rate, rate))
        self._end = np.concatenate((self._end, now + size / rate))
        self._dones = np.concatenate((self._dones, dones))
        return bool(cnt[Rn].max() > 1.0)

    def _retire(self, fin: np.ndarray, now: float) -> float:
        """Drop finished shared flows and call their ``done`` after latency +
        o_r. Returns the lowest rate of those that shared a link (inf if none
        did: then no other rate changes)."""
        idx = np.flatnonzero(fin)
        if len(idx) == 1:
            return self._retire_one(int(idx[0]), fin)
        rids = self._rid[idx]
        rt, cnt = self._routes, self._cnt
        Rf = rt.R[rids]
        mixed = cnt[Rf].max(axis=1) > 1.0
        floor = float(self._rate[idx][mixed].min()) if mixed.any() else np.inf
        np.subtract.at(cnt, Rf, 1.0)
        cnt[-1] = 0.0
        own = self._own
        for x in np.unique(Rf[cnt[Rf] == 0.0]).tolist():
            if own[x] is BUSY:
                own[x] = None
                self._drained(x)
        arrive = rt.lat[rids] + self.o_r
        fired = list(zip(rids.tolist(), self._dones[idx].tolist()))
        keep = ~fin
        self._rid, self._rate, self._end, self._dones = \
            self._rid[keep], self._rate[keep], self._end[keep], self._dones[keep]
        lo, hi = arrive.min(), arrive.max()
        groups = {float(lo): fired} if lo == hi else _group(arrive.tolist(), fired)
        for delay, fs in groups.items():
            if delay <= 0.0:
                self._fire(fs)
            else:
                self.env.at(delay, self._fire, fs)
        return floor

    def _retire_one(self, i: int, fin: np.ndarray) -> float:
        """:meth:`_retire` of the one shared flow ``i`` (most ticks end one
        flow), in plain Python over its route's links."""
        rt, cnt, own = self._routes, self._cnt, self._own
        rid = int(self._rid[i])
        links = rt.links[rid]
        floor = float(self._rate[i]) if any(cnt[x] > 1.0 for x in links) else np.inf
        for x in links:
            cnt[x] -= 1.0
        for x in links:
            if cnt[x] == 0.0 and own[x] is BUSY:
                own[x] = None
                self._drained(x)
        fired = [(rid, self._dones[i])]
        keep = ~fin
        self._rid, self._rate, self._end, self._dones = \
            self._rid[keep], self._rate[keep], self._end[keep], self._dones[keep]
        delay = rt.tail[rid] + self.o_r
        if delay <= 0.0:
            self._fire(fired)
        else:
            self.env.at(delay, self._fire, fired)
        return floor

    def _fire(self, flows: list) -> None:
        for rid, done in flows:
            self._arrive(rid, done)


def _group(keys: list, items: list) -> dict:
    out: dict = {}
    for k, x in zip(keys, items):
        out.setdefault(k, []).append(x)
    return out
