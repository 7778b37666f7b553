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

from bisect import bisect_right
from typing import Callable

import numpy as np


class _Port:
    """Busy intervals of one port, sorted and disjoint."""

    __slots__ = ("starts", "ends", "last")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.last = 0.0  # end of the last busy interval

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


class AlphaBetaNetwork:
    """The contention-free fast path. ``transfer`` is called by the simulator
    when a message may start moving; ``done`` is called when it has arrived."""

    def __init__(self, alpha_s: float, bandwidth_Bps: float):
        if alpha_s < 0 or bandwidth_Bps <= 0:
            raise ValueError("alpha_s must be >= 0 and bandwidth_Bps > 0")
        self.alpha = float(alpha_s)
        self.beta = 1.0 / float(bandwidth_Bps)
        self.env = None

    def reset(self, env, P: int) -> None:
        """Bind to a fresh simulation of ``P`` ranks (idle network) on an
        engine (:mod:`simsparse.engine`)."""
        self.env = env
        self._send = [_Port() for _ in range(P)]
        self._recv = [_Port() for _ in range(P)]

    def transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None]) -> None:
        now = self.env.now
        d = self.alpha + nbytes * self.beta
        a, b = self._send[src], self._recv[dst]
        if a.last <= now and b.last <= now:
            # both ports idle from now on: what they booked before is past
            # and can never delay a later message (every fit starts at now)
            if d > 0:
                e = now + d
                a.starts, a.ends, a.last = [now], [e], e
                b.starts, b.ends, b.last = [now], [e], e
            self.env.at(now + d - now, type(done).__call__, done)   # done() without a wrapper frame
            return
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

    # -- lockstep rounds (simsparse.backends.rounds) --------------------------------------
    def batch_start(self, P: int) -> bool:
        """Begin a bulk evaluation on an idle network of P ranks."""
        self._send_last, self._recv_last = np.zeros(P), np.zeros(P)
        return True

    def batch(self, now, src, dst, nbytes):
        """Arrivals of messages starting at ``now`` (arrays; one per port at
        most), as :meth:`transfer` would give them, or None if a port is
        still busy (then ``transfer`` would queue or backfill)."""
        if (self._send_last[src] > now).any() or (self._recv_last[dst] > now).any():
            return None
        d = self.alpha + nbytes * self.beta
        e = now + d
        held = d > 0   # as in transfer: only a message that takes time books its ports
        self._send_last[src[held]] = e[held]
        self._recv_last[dst[held]] = e[held]
        return now + (e - now)
