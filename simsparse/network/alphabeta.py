"""Alpha-beta (Hockney) network with per-endpoint send and receive ports.

A message of ``m`` bytes from ``src`` to ``dst`` holds the send port of
``src`` and the receive port of ``dst`` for ``alpha + m * beta`` seconds
(``beta = 1 / bandwidth``). A port serves one message at a time (a NIC
serialises its own messages), so an endpoint may send and receive at once
(full duplex) and ``P - 1`` senders to one receiver take
``(P - 1)(alpha + m beta)``. There is no link contention: this is the fast
path, and the reference for closed-form checks.

Scheduling: when a message becomes ready it takes the *earliest* interval in
which both of its ports are free (backfilling). A message whose receiver is
busy therefore does not block its sender's port for messages to idle
receivers that became ready later -- a NIC keeps several messages in flight
and moves whichever can move, instead of head-of-line blocking in posting
order. Durations are known when a transfer is scheduled, so each message
costs one simulator event.
"""
from __future__ import annotations

import copy
from bisect import bisect_right
from typing import Callable

import numpy as np

from .. import jit
from ..size_scale import log_table


class _Port:
    """Busy intervals of one port, sorted and disjoint; ``bulk``: until when a
    bulk evaluation's messages hold it (:meth:`AlphaBetaNetwork.bulk_replayed`);
    ``lazy``: intervals a bulk evaluation booked, as arrays sorted by start,
    taken into the lists when the port is next used (:meth:`realize`) -- an
    alltoall at P = 4096 books 16.8 M, most of them past by then."""

    __slots__ = ("starts", "ends", "last", "bulk", "lazy")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.last = 0.0  # end of the last busy interval
        self.bulk = 0.0
        self.lazy = None

    def fit(self, t: float, d: float) -> float:
        """Earliest t' >= t with [t', t'+d) free."""
        if t >= self.last:
            return t
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, t) - 1
        if i >= 0 and ends[i] > t:
            t = ends[i]
        i += 1
        while i < len(starts) and starts[i] < t + d:
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def book(self, t: float, d: float, now: float) -> None:
        if d <= 0:
            return
        if t >= self.last:
            self.starts.append(t)
            self.ends.append(t + d)
            self.last = t + d
        else:
            i = bisect_right(self.starts, t)
            self.starts.insert(i, t)
            self.ends.insert(i, t + d)
        if len(self.starts) > 64 and self.ends[0] <= now:  # forget the past now and then
            k = bisect_right(self.ends, now)
            del self.starts[:k], self.ends[:k]

    def hold(self, st: np.ndarray, en: np.ndarray, early: float) -> None:
        """Booked intervals (sorted by start, disjoint from the others), lazily;
        those that end before ``early`` are forgotten (:meth:`realize`)."""
        if self.lazy is not None:
            a, b, e0 = self.lazy
            st, en, early = np.concatenate((a, st)), np.concatenate((b, en)), min(e0, early)
            o = np.argsort(st, kind="stable")
            st, en = st[o], en[o]
        self.lazy = (st, en, early)
        if en[-1] > self.last:
            self.last = float(en[-1])

    def realize(self, now: float = -np.inf) -> None:
        """Take the lazy intervals (if any) into the lists, less those that
        ended before the earliest entry of the evaluation that booked them (as
        its commit would have forgotten them; no later fit starts before it)
        or by ``now`` (no fit starts before it either: an interval that ended
        by then never delays a message, and the last one is kept, so
        ``starts[-1]`` stays). A commit of Ok-Topk's split and reduce at
        P = 4096 books 16.8 M intervals, nearly all past at the next collective."""
        if self.lazy is not None:
            st, en, early = self.lazy
            self.lazy = None
            keep = en > max(early, now)
            if keep.any():
                st, en = st[keep].tolist(), en[keep].tolist()
                if not self.starts or st[0] >= self.starts[-1]:
                    self.starts += st
                    self.ends += en
                else:
                    pairs = sorted(zip(self.starts + st, self.ends + en))
                    self.starts, self.ends = [a for a, _ in pairs], [b for _, b in pairs]
        ends = self.ends
        if len(ends) > 1 and ends[0] <= now:
            k = min(bisect_right(ends, now), len(ends) - 1)
            del self.starts[:k], ends[:k]


class AlphaBetaNetwork:
    """The contention-free fast path. ``transfer`` is called by the simulator
    when a message may start moving; ``done`` is called when it has arrived."""

    def __init__(self, alpha_s: float, bandwidth_Bps: float, size_scale=None):
        if alpha_s < 0 or bandwidth_Bps <= 0:
            raise ValueError("alpha_s must be >= 0 and bandwidth_Bps > 0")
        self.alpha = float(alpha_s)
        self.beta = 1.0 / float(bandwidth_Bps)
        # measured over alpha + m beta per size band (SMPI's piecewise factors): None, or (log sizes, factors)
        self.scale = log_table(size_scale)
        self.env = None

    def duration(self, nbytes):
        """Seconds a message of ``nbytes`` (a number or an array) holds its
        ports: ``(alpha + nbytes beta)``, times the size band's factor where
        the profile has them (interpolated in log size, constant beyond the
        measured sizes). Every path times a message with this one expression."""
        d = self.alpha + nbytes * self.beta
        if self.scale is None:
            return d
        f = np.interp(np.log(np.maximum(nbytes, 1.0)), *self.scale)
        return d * f if isinstance(d, np.ndarray) else d * float(f)

    def reset(self, env, P: int, idle_s: float = 0.0) -> None:
        """Bind to a fresh simulation of ``P`` ranks (idle network) on an
        engine (:mod:`simsparse.engine`); it carries nothing from run to run (``idle_s`` changes nothing)."""
        self.env = env
        self._send = [_Port() for _ in range(P)]
        self._recv = [_Port() for _ in range(P)]
        self.bulk_touched = 0   # messages that found a port a bulk evaluation's messages still held

    def transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None]) -> None:
        now = self.env.now
        d = self.duration(nbytes)
        a, b = self._send[src], self._recv[dst]
        if a.last <= now and b.last <= now:
            # both ports idle from now on: what they booked before is past
            # and can never delay a later message (every fit starts at now)
            if d > 0:
                e = now + d
                a.starts, a.ends, a.last, a.lazy = [now], [e], e, None
                b.starts, b.ends, b.last, b.lazy = [now], [e], e, None
            self.env.at(now + d - now, type(done).__call__, done)   # done() without a wrapper frame
            return
        if a.bulk > now or b.bulk > now:
            self.bulk_touched += 1
        a.realize()
        b.realize()
        t = now
        while True:  # alternate until both ports agree on a start
            t1 = a.fit(t, d)
            t2 = b.fit(t1, d)
            if t2 == t1:
                break
            t = t2
        a.book(t1, d, now)
        b.book(t1, d, now)
        self.env.at(t1 + d - now, type(done).__call__, done)

    # -- bulk evaluation (simsparse.backends.fast.bulk) ---------------------------------------
    # A wave whose ports are each used once and free when its messages are
    # ready is timed as arrays: every message starts when ready, exactly as
    # ``transfer`` would start it. Otherwise the evaluation replays the
    # collective on a scratch copy of this model (``bulk_scratch``), exact
    # unless a message found a port busy with traffic from outside the
    # collective, or (``bulk_touched``) a later message finds one of its
    # ports still held by the collective (its gaps are not kept).

    def capabilities(self, P: int) -> frozenset:
        return frozenset(("arrays", "port_waves", "compiled_replay", "repeatable"))

    def bulk_start(self, P: int, earliest: float = 0.0, keep: bool = True) -> None:
        """Begin a bulk evaluation on the network as it is now; no message of
        it is ready before ``earliest``. ``keep``: hold what it books for the
        messages that come later (:meth:`bulk_commit`); the lockstep rounds,
        which time a whole point, keep nothing (at P = 4096 a ring's bookings
        were 0.9 GB)."""
        self._keep = keep
        for p in self._send + self._recv:
            p.realize(earliest)
        self._S0 = np.array([p.last for p in self._send])   # each port free from, as others left it
        self._R0 = np.array([p.last for p in self._recv])
        # ... and when their last message started: one ready after that was booked after it
        self._S0s = np.array([p.starts[-1] if p.starts else -np.inf for p in self._send])
        self._R0s = np.array([p.starts[-1] if p.starts else -np.inf for p in self._recv])
        self._earliest = earliest
        self.bulk_restart()

    def bulk_restart(self) -> None:
        """Forget what this evaluation timed so far."""
        self._bS, self._bR = self._S0.copy(), self._R0.copy()
        self._pending = []   # (src, dst, start, duration) the arrays booked
        self._rows = []      # (offsets, starts, ends) per port that a wave-after-wave evaluation booked

    def bulk_wave(self, ready, src, dst, nbytes, pos, firm):
        """Arrivals of messages ready at ``ready`` (arrays) if every port is
        used once and free then (exact); else (None, False)."""
        S, R = self._bS, self._bR
        if not self.bulk_wave_possible(src, dst, pos) or (S[src] > ready).any() or (R[dst] > ready).any():
            return None, False
        d = self.duration(nbytes)
        end = ready + d
        held = d > 0   # as in transfer: only a message that takes time books its ports
        S[src[held]], R[dst[held]] = end[held], end[held]
        if self._keep:
            self._pending.append((src[held], dst[held], ready[held], d[held]))
        return ready + (end - ready), True

    def bulk_wave_possible(self, src, dst, pos) -> bool:
        """A wave in which a port serves two messages is never timed as arrays
        (a receiver counted twice; np.unique hashed every wave: 3 of the ring's 5 s at P = 4096)."""
        return not pos.any() and (not len(dst) or np.bincount(dst).max() <= 1)

    def bulk_scratch(self, env, P: int) -> "AlphaBetaNetwork":
        """A copy of this model as it is now, on ``env``, for a replay (``bulk_transfer``)."""
        twin = self._twin = copy.copy(self)
        twin.env = env
        twin._send, twin._recv = [_copy_port(p) for p in self._send], [_copy_port(p) for p in self._recv]
        twin._chain, twin._tied = {}, {}   # per sender: (ready, firm) of its last; (port, ready) -> sender, -1: several
        twin._log = []                     # what it booked: (src, dst, start, duration)
        return twin

    def bulk_transfer(self, src: int, dst: int, nbytes: int, done, firm: bool) -> bool:
        """``transfer`` on a scratch copy (``firm``: booked in posting order
        among its sender's messages ready at the same time); whether the
        booking order cannot differ from the event simulation's: it does not
        wait for its receive port while another sender's message ready at
        the same time is booked there, nor for its send port behind its
        sender's message of the same ready time not booked in posting order."""
        now = self.env.now
        d = self.duration(nbytes)
        a, b = self._send[src], self._recv[dst]
        ok = True
        if a.last <= now and b.last <= now:
            t1 = now
        else:
            own = a.fit(now, d)
            t = now
            while True:   # as in transfer
                t1 = a.fit(t, d)
                t2 = b.fit(t1, d)
                if t2 == t1:
                    break
                t = t2
            if t1 != own:
                ok = self._tied.get((dst, now), src) == src
            elif own != now:
                prev = self._chain.get(src)
                ok = prev is not None and (prev[0] < now or (prev[0] == now and prev[1] and firm))
        if d > 0:
            a.book(t1, d, now)
            b.book(t1, d, now)
            self._log.append((src, dst, t1, d))
        self._chain[src] = (now, firm)
        if self._tied.setdefault((dst, now), src) != src:
            self._tied[(dst, now)] = -1
        self.env.at(t1 + d - now, type(done).__call__, done)
        return ok

    def bulk_replayed(self, flows: list) -> bool:
        """Take over what the replay booked (its messages (src, dst, start,
        arrival)); whether each found its ports as the event simulation
        would: free, or busy with a message of others that started before it
        was ready (so was booked before it). The ports are held until their
        last message's end: a later message that finds one held counts in
        ``bulk_touched``."""
        log = self._twin._log
        self._twin = None
        if not flows:
            return True
        src, dst, start = (np.array(c) for c in list(zip(*flows))[:3])
        return self.bulk_took(src, dst, start, tuple(np.array(c) for c in zip(*log)) if log else None)

    def bulk_took(self, src, dst, start, log, held=None) -> bool:
        """:meth:`bulk_replayed` on arrays: the messages' (src, dst, start)
        and what they booked, (src, dst, start, duration) in booking order;
        ``held``: each port's last end in ``log`` (send ports, then receive
        ports), if the caller has it."""
        if not len(src):
            return True
        free = bool(((self._S0[src] <= start) | (self._S0s[src] < start)).all() and
                    ((self._R0[dst] <= start) | (self._R0s[dst] < start)).all())
        if log is not None and len(log[0]):
            self._booked(log, held)
        return free

    def _booked(self, log, held=None) -> None:
        """Take an evaluation's bookings, (src, dst, start, duration) in
        booking order, for :meth:`bulk_commit`; ``held``: each port's last
        end among them, if the caller has it."""
        s, q, t1, d = log
        self._pending.append((s, q, t1, d))
        P = len(self._send)
        if held is None:
            held = np.full(2 * P, -np.inf)
            np.maximum.at(held, s, t1 + d)
            np.maximum.at(held, P + q, t1 + d)
        self._held(held)

    def bulk_rows(self, off, st, en, held) -> None:
        """Take an evaluation's bookings as each port's intervals (send ports,
        then receive ports: offsets, and starts and ends sorted by start
        within a port), for :meth:`bulk_commit`; ``held``: each port's last end."""
        self._rows.append((off, st, en))
        self._held(held)

    def _held(self, held) -> None:
        """Each port is held by the evaluation until ``held`` (its last end there; -inf: unused)."""
        P = len(self._send)
        for ports, h in ((self._send, held[:P]), (self._recv, held[P:])):
            for p in np.flatnonzero(h > -np.inf).tolist():
                if h[p] > ports[p].bulk:
                    ports[p].bulk = float(h[p])

    def bulk_ports(self):
        """Every port's busy intervals as arrays (send ports, then receive
        ports): offsets, starts, ends and each port's last end."""
        ports = self._send + self._recv
        for p in ports:
            p.realize()
        off = np.zeros(len(ports) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(p.starts) for p in ports])
        st = np.array([x for p in ports for x in p.starts], dtype=np.float64)
        en = np.array([x for p in ports for x in p.ends], dtype=np.float64)
        return off, st, en, np.array([p.last for p in ports], dtype=np.float64)

    def bulk_commit(self, now: float) -> None:
        """Hold what the evaluation timed in the ports (:meth:`_Port.hold`):
        later messages find the ports as in the event simulation (or count
        in ``bulk_touched``)."""
        ports = self._send + self._recv
        for off, st, en in self._rows:
            for p in np.flatnonzero(np.diff(off)).tolist():
                ports[p].hold(st[off[p]:off[p + 1]], en[off[p]:off[p + 1]], self._earliest)
        self._rows = []
        if not self._pending:
            return
        src, dst, start, d = (np.concatenate(c) for c in zip(*self._pending))
        self._pending = []
        end = start + d
        for ports, idx in ((self._send, src), (self._recv, dst)):
            st, en, off = by_port(idx, start, end, len(ports))
            for p in np.flatnonzero(np.diff(off)).tolist():
                ports[p].hold(st[off[p]:off[p + 1]], en[off[p]:off[p + 1]], self._earliest)


#: groupings of fewer bookings than this run in numpy (compiling takes seconds once per installation)
BY_PORT_COMPILED_FROM = 20000


def by_port(port, start, end, n: int):
    """Intervals (``start``, ``end``, booked on ``port`` in booking order)
    grouped by port, each port's sorted by start, ties in booking order:
    (starts, ends, offsets of the n ports). Compiled (a counting sort and an
    insertion sort of nearly sorted runs) for large commits: at P = 4096 a
    commit of Ok-Topk's split and reduce groups 16.8 M bookings twice."""
    if jit.enabled() and len(port) >= BY_PORT_COMPILED_FROM:
        return _by_port_compiled(np.ascontiguousarray(port, dtype=np.int64), start, end, n)
    o = np.argsort(port.astype(np.int16) if n < 2**15 else port, kind="stable")   # a radix sort by port
    port, st, en = port[o], start[o], end[o]
    off = np.zeros(n + 1, dtype=np.int64)
    off[1:] = np.cumsum(np.bincount(port, minlength=n))
    down = np.flatnonzero(np.diff(st) < 0)   # a port's intervals booked out of start order (backfilled)
    for p in np.unique(port[down + 1]).tolist() if len(down) else []:
        a, b = off[p], off[p + 1]
        s = a + np.argsort(st[a:b], kind="stable")
        st[a:b], en[a:b] = st[s], en[s]
    return st, en, off


def _by_port(port, start, end, n):
    off = np.zeros(n + 1, dtype=np.int64)
    for p in port:
        off[p + 1] += 1
    for p in range(n):
        off[p + 1] += off[p]
    fill = off[:-1].copy()
    st, en = np.empty(len(port)), np.empty(len(port))
    for i in range(len(port)):
        p = port[i]
        j = fill[p]
        fill[p] = j + 1
        a, e = start[i], end[i]
        while j > off[p] and st[j - 1] > a:   # after those starting at or before it: stable
            st[j], en[j] = st[j - 1], en[j - 1]
            j -= 1
        st[j], en[j] = a, e
    return st, en, off


_by_port_compiled = jit.njit(_by_port)


def _copy_port(p: _Port) -> _Port:
    p.realize()
    c = _Port()
    c.starts, c.ends, c.last = list(p.starts), list(p.ends), p.last
    return c
