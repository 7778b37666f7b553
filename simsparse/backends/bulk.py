"""Collectives evaluated for all P ranks at once: the simulator's bulk path.

A helper collective (:class:`~simsparse.ops.Collective`) with a ``bulk``
schedule is not expanded into messages when the simulator runs in bulk mode
(``collectives: auto``). Each rank that yields it blocks; when the last rank
of the scope has posted it, its schedule runs once for all P ranks and
every rank resumes at its own exit time with its result. Only collectives
where every rank's exit waits for every rank's entry are bulk (allgather,
alltoall, host allreduce), so no rank is resumed in the past.

A schedule is recorded first (:class:`BulkRun`): *waves* of messages (what
the ranks post at once; each rank then waits for its messages of the wave)
and each rank's kernels, with their values. Then it is timed:

* as arrays, wave after wave (``network.bulk_wave``), while every message
  can start when it is ready: its alpha-beta ports free and used once, or
  its flow solo. That is exactly what ``transfer`` gives (the lockstep
  rounds of :mod:`.rounds` are the same test);
* otherwise by replaying the schedule's messages, without rank programs,
  handles or payloads, on a scratch copy of the network driven by a private
  engine (``network.bulk_scratch``, ``bulk_transfer``): each rank posts its
  next wave when the last message of the previous one arrives, its kernels
  on its device, in the event simulation's order of events.

The result is *exact*, the event simulation's times to the last bit, when
the network says so for every message (on the alpha-beta model no message
waited behind another one that the event simulation could have booked in
the other order, i.e. ready at the same time), no message was ready while
its port or link was busy with traffic from outside the collective, the
kernels found the rank's device idle, and no message of the event
simulation later finds a port or link the evaluation still held
(``bulk_touched``: the gaps between its messages are not kept). Otherwise
it is an approximation, and the run says so: ``IterationStats.collectives``
is ``events`` (nothing ran in bulk), ``bulk`` (exact) or ``bulk~``
(approximate), and so does the row's ``collectives`` column. A traced run
expands its collectives (a trace holds every message).
"""
from __future__ import annotations

import numpy as np

from ..engine import HeapEngine
from ..ops import Dense, Payload


def _freeze(a):
    """A read-only copy of a writable array; read-only arrays are shared."""
    if not a.flags.writeable:
        return a
    c = a.copy()
    c.setflags(write=False)
    return c


def freeze(p: Payload) -> Payload:
    """The payload as the event path delivers it: read-only, shared."""
    if type(p) is Dense:
        return p if not p.values.flags.writeable else Dense(_freeze(p.values))
    return p.map(_freeze)


class Gathering:
    """The ranks that have posted one collective (of type ``kind``) so far,
    when, and in which order (``order``: ranks in the order they posted)."""

    __slots__ = ("kind", "progs", "reqs", "t", "order")

    def __init__(self, P: int, kind: type):
        self.kind, self.progs, self.reqs, self.t, self.order = kind, [None] * P, [None] * P, np.zeros(P), []

    def add(self, rank: int, prog, req, now: float) -> bool:
        """Rank ``rank`` posted; whether every rank has."""
        self.progs[rank], self.reqs[rank], self.t[rank] = prog, req, now
        self.order.append(rank)
        return len(self.order) == len(self.progs)


def gather(sim, prog, req) -> None:
    """Rank ``prog.ctx.rank`` posts bulk collective ``req`` (its scope's
    next); the last rank to post it has it evaluated."""
    ctx = prog.ctx
    key = (ctx.sid, ctx.nbulk)
    ctx.nbulk += 1
    g = sim.gathering.get(key)
    if g is None:
        g = sim.gathering[key] = Gathering(len(sim.ranks), type(req))
    elif type(req) is not g.kind:
        raise RuntimeError(f"rank {ctx.rank} posted {type(req).__name__} where other ranks posted another "
                           f"collective (every rank must post the same collectives in the same order)")
    if g.add(ctx.rank, prog, req, sim.env.now):
        del sim.gathering[key]
        _evaluate(sim, g)


def _evaluate(sim, g: Gathering) -> None:
    """Run a collective's bulk schedule for all ranks, account what each
    sent and computed, and resume each at its exit, to the last bit, in the
    order the event simulation would."""
    now = sim.env.now
    run = BulkRun(sim, g.t, g.order)
    results = g.kind.bulk(g.reqs, run)
    run.evaluate()
    sim.network.bulk_commit(now)
    exits = run.t
    sim.bulk_runs += 1
    if not run.exact or exits.min() < now:
        sim.bulk_inexact += 1
    sent, msgs, busy = run.sent.tolist(), run.msgs.tolist(), run.busy.tolist()
    for r, rs in enumerate(sim.ranks):
        rs.bytes_sent += sent[r]
        rs.msgs_sent += msgs[r]
        if busy[r]:
            rs.busy["compute"] += busy[r]
            rs.device_free = max(rs.device_free, float(run.device[r]))
    for r in run.done:
        sim.env.at_time(float(exits[r]), sim._resume, (g.progs[r], results[r]))


class BulkRun:
    """One collective for all P ranks: what its bulk schedule
    (``Collective.bulk(reqs, run)``) records (:meth:`wave`, :meth:`kernel`),
    then :meth:`evaluate` times it. After that, ``t`` holds every rank's exit
    time, ``done`` the ranks in the order the event simulation would resume
    them, ``sent``/``msgs`` what each sent, ``exact`` whether it is exact."""

    def __init__(self, sim, entry: np.ndarray, order: list):
        self.sim, self.P, self.entry, self.order = sim, len(entry), entry, order
        self.waves: list = []                        # (src, dst, nbytes, pos), messages in posting order
        # the ranks' steps as recorded: chunks of (ranks, kind, values) arrays, kind 0 a wave (value:
        # its id) or 1 a kernel (seconds); single kernels since the last chunk as (ranks, seconds) lists
        self._chunks: list = []
        self._single: tuple = ([], [])
        self._flat = None                            # flat_steps, once asked for
        self._steps = (None, None)                   # (the flat_steps it came from, steps)
        self._dlog: list = []                        # kernels between posting a wave and waiting: (rank, wave,
        self._dsingle: tuple = ([], [], [])          # seconds) arrays per timed_all, single calls since the last
        self.open = np.full(self.P, -1)              # per rank: its last step if a wave (it waits for it), else -1
        self._during: dict | None = None
        self.kernels = False

    @staticmethod
    def freeze(payload: Payload) -> Payload:
        return freeze(payload)

    def size(self, payload: Payload) -> int:
        """Bytes on the wire, as ``isend`` counts them."""
        return self.sim.wire_bytes(payload)

    def sizes(self, nbytes: np.ndarray) -> np.ndarray:
        """Bytes on the wire of data payloads of ``nbytes`` (as :meth:`size`)."""
        s = self.sim.byte_scale
        return nbytes if s == 1.0 else np.rint(nbytes * s).astype(np.int64)

    def work_seconds(self, name: str, work) -> float:
        """Device seconds of kernel ``name`` doing ``work`` (for :meth:`timed`)."""
        return self.sim.work_seconds(name, work)

    def wave(self, src, dst, nbytes, pos=None) -> None:
        """Messages src[i] -> dst[i] of nbytes[i] that every rank taking part
        posts at once (its sends in the order of ``pos``, default one each)
        after its previous wave and kernels; then it waits for them."""
        src, dst = np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32)   # (P^2 of them in an alltoall)
        if not len(src):
            return
        k = len(self.waves)
        pos = np.zeros(len(src), dtype=np.int32) if pos is None else np.asarray(pos, dtype=np.int32)
        self.waves.append((src, dst, np.asarray(nbytes, dtype=np.int64), pos))
        part = np.zeros(self.P, dtype=bool)   # the ranks taking part (np.unique hashes P^2 messages)
        part[src] = True
        part[dst] = True
        ranks = np.flatnonzero(part).astype(np.int32)
        self.open[ranks] = k
        self._chunk(ranks, 0, np.full(len(ranks), float(k)))

    def _flush_single(self) -> None:
        if self._dsingle[0]:
            rs, ws, ds = self._dsingle
            self._dlog.append((np.array(rs, dtype=np.int32), np.array(ws, dtype=np.int32), np.array(ds, dtype=float)))
            self._dsingle = ([], [], [])

    @property
    def during_log(self) -> tuple:
        """The kernels run between posting a wave and waiting for it, in the order recorded: arrays of
        their ranks, waves (-1: no wave open) and seconds (arrays: P^2 / 4 of them in Ok-Topk's split
        and reduce, 62 MB as Python lists at P = 2048)."""
        self._flush_single()
        if len(self._dlog) != 1:
            self._dlog = [tuple(np.concatenate(c) for c in zip(*self._dlog))] if self._dlog else \
                [(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))]
        return self._dlog[0]

    @property
    def during(self) -> dict:
        """(rank, wave) -> the seconds of the kernels it runs between posting that wave and waiting for it."""
        if self._during is None:
            self._during = {}
            for r, k, dt in zip(*(a.tolist() for a in self.during_log)):
                if k >= 0:
                    self._during.setdefault((r, k), []).append(dt)
        return self._during

    def kernel(self, rank: int, name: str, args: tuple, kwargs: dict, during: bool = False):
        """Rank ``rank`` runs a kernel after its last wave (``during``: after
        posting it, before waiting for it); returns the kernel's value."""
        value, dt = self.sim.run_kernel(name, args, kwargs)
        self.timed(rank, dt, during)
        return value

    def timed(self, rank: int, dt: float, during: bool = False) -> None:
        """Rank ``rank`` runs a kernel of ``dt`` device seconds whose value the
        schedule computes itself (as :meth:`kernel` would place it)."""
        if during:
            rs, ws, ds = self._dsingle
            rs.append(rank)
            ws.append(int(self.open[rank]))   # -1: no wave
            ds.append(dt)
            self._during = None
        else:
            self._single[0].append(rank)
            self._single[1].append(float(dt))
            self._flat = None
            self.open[rank] = -1
        self.kernels = True

    def timed_all(self, dts, during: bool = False) -> None:
        """:meth:`timed` for every rank r with ``dts[r]``, in rank order (one
        call instead of P: Ok-Topk's split and reduce makes P x buckets)."""
        if during:
            self._flush_single()
            self._dlog.append((np.arange(self.P, dtype=np.int32), self.open.astype(np.int32),
                               np.asarray(dts, dtype=float)))
            self._during = None
        else:
            self._chunk(np.arange(self.P, dtype=np.int32), 1, np.asarray(dts, dtype=float))
            self.open[:] = -1
        self.kernels = True

    def _chunk(self, ranks, kind: int, values) -> None:
        """Record a step for each of ``ranks`` (after the single kernels recorded before it)."""
        self._flush_steps()
        self._chunks.append((ranks, kind, values))
        self._flat = None

    def _flush_steps(self) -> None:
        rs, vs = self._single
        if rs:
            self._chunks.append((np.array(rs, dtype=np.int32), 1, np.array(vs, dtype=float)))
            self._single = ([], [])

    def flat_steps(self):
        """Every rank's steps in the order recorded, rank after rank, as
        arrays: kinds (uint8: 0 a wave, 1 a kernel), values (the wave's id or
        the kernel's seconds) and each rank's count. A wave of an alltoall
        is a step of each of P ranks: kept as arrays, not P list appends."""
        if self._flat is None:
            self._flush_steps()
            ch = self._chunks
            if not ch:
                return np.zeros(0, np.uint8), np.zeros(0), np.zeros(self.P, dtype=np.int64)
            ranks = np.concatenate([c[0] for c in ch])
            kinds = np.repeat(np.array([c[1] for c in ch], dtype=np.uint8), [len(c[0]) for c in ch])
            vals = np.concatenate([c[2] for c in ch])
            o = np.argsort(ranks.astype(np.int16) if self.P < 2**15 else ranks, kind="stable")
            self._flat = (kinds[o], vals[o], np.bincount(ranks, minlength=self.P))
        return self._flat

    @property
    def steps(self) -> list:
        """Per rank: its steps as a list, a wave's id (int) or a kernel's seconds (float);
        built once per recording (the wave path and then the Python replay may both read it)."""
        flat = self.flat_steps()
        if self._steps[0] is not flat:
            kinds, vals, count = flat
            out, a = [], 0
            for n in count.tolist():
                out.append([int(v) if k == 0 else v for k, v in zip(kinds[a:a + n].tolist(), vals[a:a + n].tolist())])
                a += n
            self._steps = (flat, out)
        return self._steps[1]

    # -- timing ------------------------------------------------------------------------
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
        self._replay()

    def _reset(self) -> None:
        self.t = self.entry.copy()
        self.device = np.array([rs.device_free for rs in self.sim.ranks])
        self.busy = np.zeros(self.P)
        self.exact = True

    def _device(self, r: int, dts) -> None:
        """Rank r runs kernels of ``dts`` seconds one after another from its
        time, as the simulator's device does (FIFO; the program waits and
        goes on at ``now + (end - now)``, the engine's time of its resumption)."""
        t, dev = self.t, self.device
        for dt in dts:
            now = t[r]
            if dev[r] > now:
                self.exact = False   # its device is busy with work issued elsewhere
            start = dev[r] if dev[r] > now else now
            end = start + dt
            if dt > 0:
                self.busy[r] += dt
            if end > now:
                dev[r] = end
                t[r] = now + (end - now)

    def _ready(self, src, dst, nbytes, post_s, post_r):
        """When each message may move (eager or within the receiver's
        unexpected window: when sent; rendezvous: when both sides have
        posted), plus the start-up of a message past the eager threshold, and
        whether the event simulation books it in posting order among its
        sender's ties."""
        sim = self.sim
        gated = nbytes > sim.window
        ready = np.where(gated, np.maximum(post_s, post_r), post_s) if gated.any() else post_s
        if sim.rdv_rtt > 0:
            ready = np.where(nbytes > sim.eager, ready + sim.rdv_rtt, ready)
        return ready, ~gated | (post_r <= post_s)

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
            ready, firm = self._ready(src, dst, nb, t[src], t[dst])
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
        from ..network.alphabeta import AlphaBetaNetwork
        from .replay_ab import compiled, replay_run

        if type(self.sim.network) is AlphaBetaNetwork and compiled(sum(len(w[0]) for w in self.waves)) is not None:
            replay_run(self)
            return
        P, t, sim = self.P, self.t, self.sim
        eng = HeapEngine()
        net = sim.network.bulk_scratch(eng, P)
        rtt, eager, window = sim.rdv_rtt, sim.eager, sim.window
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
                for i in recvs:   # a rendezvous send posted before moves now (plus the handshake)
                    if nb[i] > window and (s[i], k) in posted:
                        eng.at(rtt, lambda _, k=k, i=i: move(k, i, False)) if rtt > 0 else move(k, i, False)
                for i in sends:
                    if nb[i] <= eager:
                        move(k, i, True)
                    elif nb[i] <= window or (d[i], k) in posted:   # buffered by the receiver, or rendezvous
                        eng.at(rtt, lambda _, k=k, i=i: move(k, i, True)) if rtt > 0 else move(k, i, True)
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
