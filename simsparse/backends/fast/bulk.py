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
and each rank's kernels, with their values. Then it is timed
(:mod:`.bulk_timing`):

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
(``bulk_touched``: the gaps between its messages are not kept), and no
other program of a rank issues device work before that rank's exit from a
collective that ran kernels there (the evaluation queued them all at once;
the event simulation would have queued that work between them:
``_Rank.bulk_until``). Otherwise
it is an approximation, and the run says so: ``IterationStats.collectives``
is ``events`` (nothing ran in bulk), ``bulk`` (exact) or ``bulk~``
(approximate), and so does the row's ``collectives`` column. A traced run
expands its collectives (a trace holds every message).
"""
from __future__ import annotations

import numpy as np

from ...ops import Payload
from ..protocol import Gathered, freeze
from .timing import BulkTiming


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
            rs.bulk_until = max(rs.bulk_until, float(exits[r]))
    for r in run.done:
        sim.env.at_time(float(exits[r]), sim._resume, (g.progs[r], results[r]))


class BulkRun(BulkTiming):
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

    @staticmethod
    def gathered(blocks) -> Gathered:
        """``blocks`` (frozen) as the one tuple every rank gets (:class:`Gathered`)."""
        return Gathered(blocks)

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
