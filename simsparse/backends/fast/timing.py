"""Timing a recorded bulk collective (:class:`~simsparse.backends.fast.bulk.BulkRun`):
the two evaluators that need no compiled code.

* :meth:`BulkTiming.arrays` -- wave after wave as numpy arrays, while every
  message can start when it is ready (``network.bulk_wave``: its
  alpha-beta ports free and used once, or its flow solo); exact, the event
  engine's times to the last bit, or it declines;
* :meth:`BulkTiming.replay` -- every message a ``transfer`` on a scratch
  copy of the network driven by a private engine, in the event engine's
  order of events; exact (the reference the compiled replay and the waves
  are checked against).

Cost model: what ``transfer`` gives each message on the network (alpha-beta
ports or max-min flows) and what the FIFO device gives each kernel
(:mod:`..protocol`); ``inexact`` counts where the result may differ from the
events (:mod:`.bulk`).
"""
from __future__ import annotations

import numpy as np

from ...engine import HeapEngine
from ..protocol import run_kernel


class BulkTiming:
    """The timing half of :class:`~simsparse.backends.fast.bulk.BulkRun`: reads
    its ``waves``, ``steps``, ``during`` and ``entry``; sets ``t``,
    ``device``, ``busy``, ``done``, ``sent``, ``msgs`` and ``inexact``."""

    def count(self) -> None:
        """What every rank sends (bytes, messages), and the network readied
        for an evaluation from the earliest time a message of it may be ready."""
        P = self.P
        self.sent = np.zeros(P, dtype=np.int64)
        self.msgs = np.zeros(P, dtype=np.int64)
        for src, _, nb, _ in self.waves:   # (float sums of integers below 2^53: exact)
            self.sent += np.rint(np.bincount(src, weights=nb, minlength=P)).astype(np.int64)
            self.msgs += np.bincount(src, minlength=P)
        self.host.network.bulk_start(P, self.earliest)

    @property
    def messages(self) -> int:
        return sum(len(w[0]) for w in self.waves)

    def _reset(self) -> None:
        self.t = self.entry.copy()
        self.device = self.device0.copy()
        self.busy = np.zeros(self.P)
        self.inexact = {"order": 0, "outside": 0, "device": 0}

    def _device(self, r: int, dts) -> None:
        """Rank r runs kernels of ``dts`` seconds one after another from its
        time on its FIFO device; the program waits for each."""
        for dt in dts:   # (a device busy with work issued elsewhere: see the module docstring of .bulk)
            self.inexact["device"] += run_kernel(self.t, self.device, self.busy, r, dt)

    def arrays(self) -> bool:
        """Time the waves as arrays; whether every wave was exact (it stops at
        the first that is not, and the evaluation declines). Ranks that exit at the same time resume in
        the event simulation's order: a rank's wait ends with the arrival
        event of its last message (arrival events in booking order; of one
        message, the sender's handle first), and ranks post a wave in the
        order they resumed from the previous one."""
        self._reset()
        t, net, P = self.t, self.host.network, self.P
        if not all(net.bulk_wave_possible(src, dst, pos) for src, dst, _, pos in self.waves):
            return False
        before, after = self._kernels_by_wave()
        rkey = np.empty(P)   # the place of each rank's last resumption among the events
        rkey[self.order] = np.arange(P)
        clock = P
        for k, (src, dst, nb, pos) in enumerate(self.waves):
            for r, dts in before[k]:
                self._device(r, dts)
            ready, firm = self.host.protocol.ready(nb, t[src], t[dst])
            arrival, exact = net.bulk_wave(ready, src, dst, nb, pos, firm)
            if arrival is None:
                return False
            for r, dts in after[k]:
                self._device(r, dts)
            booked = np.empty(len(src))
            booked[np.lexsort((pos, rkey[src], ready))] = clock + np.arange(len(src))   # booking order
            clock += len(src)
            ends = np.concatenate((src, dst))
            when = np.concatenate((arrival, arrival))
            place = np.concatenate((2 * booked, 2 * booked + 1))   # the sender's handle completes first
            o = np.lexsort((place, when))   # the last event last
            waited = when[o] >= t[ends[o]]
            np.maximum.at(t, ends, arrival[np.arange(len(ends)) % len(src)])
            rkey[ends[o][waited]] = place[o][waited]
        for r, dts in before[len(self.waves)]:
            self._device(r, dts)
        self.done = np.lexsort((rkey, t)).tolist()
        return True

    def _kernels_by_wave(self):
        """Per wave: (rank, kernel seconds) run before posting it, and during it."""
        n = len(self.waves)
        before, after = [[] for _ in range(n + 1)], [[] for _ in range(n)]
        if not self.kernels:
            return before, after
        for r, items in enumerate(self.steps):
            pending = []
            for it in items:
                if type(it) is int:
                    if pending:
                        before[it].append((r, pending))
                        pending = []
                    dur = self.during.get((r, it))
                    if dur:
                        after[it].append((r, dur))
                else:
                    pending.append(it)
            if pending:
                before[n].append((r, pending))
        return before, after

    def _mine(self):
        """Per (rank, wave): its sends in posting order and its receives."""
        mine: dict = {}
        for k, (src, dst, _, pos) in enumerate(self.waves):
            s, d = src.tolist(), dst.tolist()
            order = np.lexsort((src, pos)).tolist()
            for i in order:
                mine.setdefault((s[i], k), ([], []))[0].append(i)
            for i in order:
                mine.setdefault((d[i], k), ([], []))[1].append(i)
        return mine

    def replay(self) -> bool:
        """Time the schedule as the event engine would: every message a
        ``transfer`` on a scratch copy of the network driven by a private
        engine, each rank posting its next wave when the last message of
        the previous one arrives, kernels on its device."""
        self._reset()
        P, t, host = self.P, self.t, self.host
        eng = HeapEngine()
        net = host.network.bulk_scratch(eng, P)
        pr = host.protocol
        waves = [(s.tolist(), d.tolist(), nb.tolist()) for s, d, nb, _ in self.waves]
        mine = self._mine()
        left = {key: len(a) + len(b) for key, (a, b) in mine.items()}
        posted: dict = {}
        waiting: dict = {}
        cursor = [0] * P
        steps = self.steps
        flows: list = []   # (src, dst, start, arrival) of every message
        ties = 0
        self.done = []

        def move(k, i, firm):
            s, d, nb = waves[k]
            start = eng.now

            def arrived():
                flows.append((s[i], d[i], start, eng.now))
                for r in (s[i], d[i]):
                    key = (r, k)
                    left[key] -= 1
                    if not left[key] and waiting.get(key):
                        waiting[key] = False
                        eng.soon(go, r)
            nonlocal ties
            ties += not net.bulk_transfer(s[i], d[i], nb[i], arrived, firm)

        def go(r):   # rank r goes on at the engine's time: kernels, then its next wave
            t[r] = eng.now
            items = steps[r]
            while cursor[r] < len(items):
                it = items[cursor[r]]
                cursor[r] += 1
                if type(it) is not int:
                    if kernel(r, it, go):
                        return
                    continue
                k, key = it, (r, it)
                posted[key] = eng.now
                sends, recvs = mine[key]
                s, d, nb = waves[k]
                for i in recvs:   # a send held for this receive moves now (plus the handshake)
                    if pr.gated(nb[i]) and (s[i], k) in posted:
                        wait = pr.handshake(nb[i])
                        eng.at(wait, lambda _, k=k, i=i: move(k, i, False)) if wait > 0 else move(k, i, False)
                for i in sends:
                    if not pr.gated(nb[i]) or (d[i], k) in posted:   # within the window, or its receive is posted
                        wait = pr.handshake(nb[i])
                        eng.at(wait, lambda _, k=k, i=i: move(k, i, True)) if wait > 0 else move(k, i, True)
                if not settle(r, key, list(self.during.get(key, ()))):
                    return
            self.done.append(r)   # the collective returns

        def kernel(r, dt, then) -> bool:   # True if the program waits for it (an event resumes it)
            self._device(r, (dt,))
            if t[r] > eng.now:
                eng.at(self.device[r] - eng.now, then, r)
                return True
            return False

        def settle(r, key, dts) -> bool:   # the kernels between posting and waiting, then the wait; True: go on now
            while dts:
                if kernel(r, dts.pop(0), lambda r: resume(r, key, dts)):
                    return False
            if left[key]:
                waiting[key] = True
                return False
            return True   # everything arrived: the waitall returns at once

        def resume(r, key, dts):   # one of those kernels ended
            if settle(r, key, dts):
                go(r)

        for r in self.order:
            eng.at(float(self.entry[r]), go, r)
        eng.run()
        free = host.network.bulk_replayed(flows)   # (always: it also takes over what the replay booked)
        self.inexact["order"] += ties
        self.inexact["outside"] += not free
        return True
