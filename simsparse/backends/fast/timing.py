"""Timing a recorded bulk collective (:class:`~simsparse.backends.fast.bulk.BulkRun`).

:meth:`BulkTiming.evaluate` counts what every rank sent, then times the
waves and kernels the schedule recorded, the first way that applies:

* as arrays, wave after wave (:meth:`~BulkTiming._waves`), while every
  message can start when it is ready (``network.bulk_wave``): exact, the
  event simulation's times to the last bit;
* by replaying the messages on a scratch copy of the network with a
  private engine, in the event simulation's order of events
  (:meth:`~BulkTiming._replay`): compiled on the alpha-beta network
  (:mod:`.replay_ab`), in Python elsewhere and as the reference;
* with ``collectives: waves`` on a flow-level network, instead of the
  replay: wave after wave, approximately (:mod:`.waves_flow`).

Cost model: what ``transfer`` gives each message on the network (alpha-beta
ports or max-min flows) and what the simulator's FIFO device gives each
kernel; the exactness flags say where the evaluation may differ
(:mod:`.bulk`).
"""
from __future__ import annotations

import numpy as np

from ...engine import HeapEngine
from ...network.flow_bulk import FlowBulk
from ..protocol import fifo, resumed
from .waves_flow import flow_waves_run


class BulkTiming:
    """The timing half of :class:`~simsparse.backends.fast.bulk.BulkRun`: reads
    its ``waves``, ``steps``, ``during`` and ``entry``; sets ``t``,
    ``device``, ``busy``, ``done``, ``sent``, ``msgs`` and ``exact``."""

    def evaluate(self) -> None:
        sim, P = self.sim, self.P
        self.sent = np.zeros(P, dtype=np.int64)
        self.msgs = np.zeros(P, dtype=np.int64)
        for src, _, nb, _ in self.waves:   # (float sums of integers below 2^53: exact)
            self.sent += np.rint(np.bincount(src, weights=nb, minlength=P)).astype(np.int64)
            self.msgs += np.bincount(src, minlength=P)
        net = sim.network
        # no message of this or a later collective is ready before this one's earliest entry or
        # (other scopes) a rank's post to a collective still gathering; the engine's time is later
        pending = [g.t[g.order].min() for g in sim.gathering.values() if g.order]
        net.bulk_start(P, float(min([self.entry.min(), *pending])))
        if self._waves():
            return
        net.bulk_restart()
        if sim.waves and isinstance(net, FlowBulk):
            flow_waves_run(self)
            return
        self._replay()

    def _reset(self) -> None:
        self.t = self.entry.copy()
        self.device = np.array([rs.device_free for rs in self.sim.ranks])
        self.busy = np.zeros(self.P)
        self.exact = True

    def _device(self, r: int, dts) -> None:
        """Rank r runs kernels of ``dts`` seconds one after another from its
        time on its FIFO device; the program waits for each."""
        t, dev = self.t, self.device
        for dt in dts:
            now = t[r]
            if dev[r] > now:
                self.exact = False   # its device is busy with work issued elsewhere
            end = fifo(dev[r], now, dt)
            if dt > 0:
                self.busy[r] += dt
            if end > now:
                dev[r] = end
                t[r] = resumed(now, end)

    def _waves(self) -> bool:
        """Time the waves as arrays; whether every wave was exact (it stops at
        the first that is not). Ranks that exit at the same time resume in
        the event simulation's order: a rank's wait ends with the arrival
        event of its last message (arrival events in booking order; of one
        message, the sender's handle first), and ranks post a wave in the
        order they resumed from the previous one."""
        self._reset()
        t, net, P = self.t, self.sim.network, self.P
        if not all(net.bulk_wave_possible(src, dst, pos) for src, dst, _, pos in self.waves):
            return False
        before, after = self._kernels_by_wave()
        rkey = np.empty(P)   # the place of each rank's last resumption among the events
        rkey[self.order] = np.arange(P)
        clock = P
        for k, (src, dst, nb, pos) in enumerate(self.waves):
            for r, dts in before[k]:
                self._device(r, dts)
            ready, firm = self.sim.protocol.ready(nb, t[src], t[dst])
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

    def _replay(self) -> None:
        """Time the schedule as the event simulation would: every message a
        ``transfer`` on a scratch copy of the network driven by a private
        engine, each rank posting its next wave when the last message of
        the previous one arrives, kernels on its device. On the alpha-beta
        network a large replay runs compiled (:mod:`.replay_ab`)."""
        self._reset()
        from ...network.alphabeta import AlphaBetaNetwork
        from .replay_ab import compiled
        from .replay_arrays import replay_run
        from .waves_ab import waves_run

        if type(self.sim.network) is AlphaBetaNetwork:
            nm = sum(len(w[0]) for w in self.waves)
            if nm >= self.sim.approx_from:
                waves_run(self)
                return
            if compiled(nm) is not None:
                replay_run(self)
                return
        P, t, sim = self.P, self.t, self.sim
        eng = HeapEngine()
        net = sim.network.bulk_scratch(eng, P)
        pr = sim.protocol
        waves = [(s.tolist(), d.tolist(), nb.tolist()) for s, d, nb, _ in self.waves]
        mine = self._mine()
        left = {key: len(a) + len(b) for key, (a, b) in mine.items()}
        posted: dict = {}
        waiting: dict = {}
        cursor = [0] * P
        steps = self.steps
        flows: list = []   # (src, dst, start, arrival) of every message
        exact = True
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
            nonlocal exact
            exact = net.bulk_transfer(s[i], d[i], nb[i], arrived, firm) and exact

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
        free = sim.network.bulk_replayed(flows)   # (always: it also takes over what the replay booked)
        self.exact = self.exact and exact and free
