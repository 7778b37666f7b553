"""A helper collective recorded for all P ranks at once (:class:`BulkRun`).

The event engine gathers a helper collective (:class:`~simsparse.ops.Collective`
with a ``bulk`` schedule) until the last rank of its scope has posted it, and
hands it to the evaluator :mod:`simsparse.backends.evaluators` chooses. The
collective's ``bulk`` schedule records on a :class:`BulkRun` what every rank
does: *waves* of messages (what the ranks post at once; each rank then waits
for its messages of the wave) and each rank's kernels, with their values.
Only collectives where every rank's exit waits for every rank's entry are
bulk (allgather, alltoall, host allreduce), so no rank resumes in the past.

An evaluator then times the recording (:mod:`.timing` as arrays or by a
replay in event order, :mod:`.replay_arrays` compiled, :mod:`.waves_ab` and
:mod:`.waves_flow` wave after wave). The run reads what it needs of the
simulation through a :class:`BulkHost`: nothing else of the engine's state.

An exact evaluator's result is the event engine's to the last bit unless
the run says otherwise (``inexact``, by cause):

* ``order``: on the alpha-beta model a message waited behind another one
  ready at the same time, which the event engine might have booked in the
  other order;
* ``outside``: a message was ready while its port or link was busy with
  traffic from outside the collective, or (counted by the network,
  ``bulk_touched``) a later message found a port or link the evaluation
  still held (the gaps between its messages are not kept);
* ``device``: a kernel found its rank's device busy with work issued
  elsewhere, or another program of a rank issued device work before that
  rank left a collective that ran kernels there (the evaluation queued them
  all at once; the events would have queued that work between them).
"""
from __future__ import annotations

import typing

import numpy as np

from ...ops import Payload
from ..protocol import Gathered, freeze
from .timing import BulkTiming


class BulkHost(typing.Protocol):
    """What a :class:`BulkRun` reads of the simulation that gathered it
    (:class:`~simsparse.backends.events.sim.Simulator` is one)."""

    network: object          # the network model (its bulk_* capability)
    protocol: object         # ..protocol.Protocol
    byte_scale: float        # data carried at 1/byte_scale of full size

    def wire_bytes(self, payload: Payload) -> int: ...
    def work_seconds(self, name: str, work) -> float: ...
    def run_kernel(self, name: str, args: tuple, kwargs: dict): ...


class BulkRun(BulkTiming):
    """One collective for all P ranks: what its bulk schedule
    (``Collective.bulk(reqs, run)``) records (:meth:`wave`, :meth:`kernel`),
    then an evaluator times it. After that, ``t`` holds every rank's exit
    time, ``done`` the ranks in the order the event simulation would resume
    them, ``sent``/``msgs`` what each sent, ``device``/``busy`` each rank's
    device, and ``inexact`` what may differ from the events, by cause."""

    def __init__(self, host: BulkHost, entry: np.ndarray, order: list, device: np.ndarray, now: float,
                 pending: float = np.inf):
        self.host, self.P, self.entry, self.order = host, len(entry), entry, order
        #: each rank's device free from (its FIFO, as the engine left it), the engine's time, and the
        #: earliest post to another collective still gathering (no message of it is ready before)
        self.device0, self.now, self.pending = device, now, pending
        #: no message of this or a later collective is ready before this
        self.earliest = float(min(entry.min(), pending))
        self.inexact = {"order": 0, "outside": 0, "device": 0}
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
        return self.host.wire_bytes(payload)

    def sizes(self, nbytes: np.ndarray) -> np.ndarray:
        """Bytes on the wire of data payloads of ``nbytes`` (as :meth:`size`)."""
        s = self.host.byte_scale
        return nbytes if s == 1.0 else np.rint(nbytes * s).astype(np.int64)

    def work_seconds(self, name: str, work) -> float:
        """Device seconds of kernel ``name`` doing ``work`` (for :meth:`timed`)."""
        return self.host.work_seconds(name, work)

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
        value, dt = self.host.run_kernel(name, args, kwargs)
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
