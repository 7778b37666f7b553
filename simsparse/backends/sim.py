"""The simulator backend: drives rank programs as SimPy processes.

Each rank's generator runs in its own SimPy process. Posting operations is
instantaneous; the network model moves messages; ``compute`` runs the numpy
kernel and advances that rank's clock by the device model's cost.

MPI semantics modelled:

* matching is by (source, destination, tag) in posting order, as MPI's
  non-overtaking rule gives (no wildcards);
* a message of at most ``eager_threshold_B`` bytes starts moving when the send
  is posted (eager); a larger one starts when both send and receive are posted
  (rendezvous), plus ``rendezvous_rtt_s`` for the RTS/CTS handshake;
* a send completes when its data has arrived, a receive when its data has
  arrived and it has been posted. Payload arrays are copied when a send is
  posted, so a sender may reuse its buffers; the copy is read-only and is
  shared, not copied again, when a receiver forwards it (an allgather moves
  each block once in memory, not once per hop). Received arrays are
  therefore read-only: rank programs copy before writing, as with inputs.
* kernels marked ``memo`` (decompress-and-sum of received blocks) run once
  per iteration for identical read-only inputs; every calling rank is still
  charged the device cost.

Requests that take no simulated time (an all-complete waitall, a zero-cost
kernel) do not create SimPy events, which keeps large runs cheap.
"""
from __future__ import annotations

import functools
import gc
import hashlib
import inspect
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from ..compute.devices import Device, IdealDevice
from ..compute.kernels import Work, get_kernel
from ..ops import Bundle, Compute, ContextBase, Handle, Payload, Waitall, Waitany


def _freeze(a):
    """A read-only copy of a writable array; read-only arrays are shared."""
    if not a.flags.writeable:
        return a
    c = a.copy()
    c.setflags(write=False)
    return c


@functools.lru_cache(maxsize=None)
def _signature(fn):
    return inspect.signature(fn)


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(a)).cast("B"), digest_size=16).digest()


def _memo_key(obj, digests: dict):
    """Hashable content key of kernel arguments, or None when not memoisable.
    Arrays are keyed by a digest of their bytes; read-only arrays (shared
    received data, which the simulator never writes) are hashed once and
    remembered by identity in ``digests``."""
    if isinstance(obj, np.ndarray):
        if obj.flags.writeable:
            return ("a", _digest(obj), obj.dtype.str, obj.shape)
        hit = digests.get(id(obj))
        if hit is None or hit[0] is not obj:
            hit = digests[id(obj)] = (obj, _digest(obj))  # keeps obj alive, so its id stays unique
        return ("a", hit[1], obj.dtype.str, obj.shape)
    if isinstance(obj, (list, tuple)):
        parts = tuple(_memo_key(o, digests) for o in obj)
        return None if any(p is None for p in parts) else ("l", parts)
    if isinstance(obj, Payload):
        arrays = tuple(_memo_key(a, digests) for a in obj.arrays())
        if any(a is None for a in arrays):
            return None
        return ("p", type(obj).__name__, arrays, repr(obj.meta()))
    if isinstance(obj, (int, float, str, bool, type(None), np.generic)):
        return ("s", obj)
    return None


def _scaled_nbytes(p: Payload, s: float) -> int:
    """Wire size of a payload carried at reduced size: data scaled by s,
    host metadata (Scalars) as is."""
    if isinstance(p, Bundle):
        return sum(_scaled_nbytes(q, s) for q in p.parts)
    return p.nbytes if p.HOST else int(round(p.nbytes * s))


def events_scheduled(env: simpy.Environment) -> int:
    """Events SimPy has scheduled so far (its event-id counter)."""
    return next(env._eid)


class _Message:
    __slots__ = ("src", "dst", "tag", "payload", "nbytes", "send", "recv", "started", "arrived")

    def __init__(self, src, dst, tag, payload, nbytes, send):
        self.src, self.dst, self.tag = src, dst, tag
        self.payload, self.nbytes, self.send = payload, nbytes, send
        self.recv = None
        self.started = False
        self.arrived = False


@dataclass
class IterationStats:
    """What one simulated iteration produced."""

    finish_s: list            # per rank: time its program returned
    results: list             # per rank: the program's return value
    bytes_sent: list          # per rank
    msgs_sent: list           # per rank
    n_events: int
    trace: list = field(default_factory=list)  # (rank, phase, op, peer, bytes, start_s, end_s)

    @property
    def time_s(self) -> float:
        return max(self.finish_s) if self.finish_s else 0.0


class SimContext(ContextBase):
    """The per-rank handle a rank program sees in the simulator."""

    def __init__(self, sim: "Simulator", rank: int, size: int):
        super().__init__(rank, size)
        self.sim = sim
        self.byte_scale = sim.byte_scale

    def now(self) -> float:
        return self.sim.env.now

    def isend(self, dst, payload, tag=0):
        self._check_peer(dst)
        sim = self.sim
        nb = payload.nbytes if sim.byte_scale == 1.0 else _scaled_nbytes(payload, sim.byte_scale)
        h = Handle("send", dst, tag, nb, sim.env.now, self._phase)
        sim.bytes_sent[self.rank] += nb
        sim.msgs_sent[self.rank] += 1
        sim._post_send(_Message(self.rank, dst, tag, payload.map(_freeze), nb, h))
        return h

    def irecv(self, src, tag=0):
        self._check_peer(src)
        h = Handle("recv", src, tag, 0, self.sim.env.now, self._phase)
        self.sim._post_recv(src, self.rank, tag, h)
        return h


class Simulator:
    """Runs one iteration of P rank programs on a network and device model."""

    def __init__(self, network, device: Device | None = None, eager_threshold_B: int = 65536,
                 rendezvous_rtt_s: float = 0.0, trace: bool = False, byte_scale: float = 1.0):
        self.network = network
        self.device = device or IdealDevice()
        self.ideal = isinstance(self.device, IdealDevice)
        self.eager = int(eager_threshold_B)
        self.rdv_rtt = float(rendezvous_rtt_s)
        self.trace_on = trace
        #: data carried at 1/byte_scale of full size: data bytes and compute
        #: work count byte_scale times (host metadata, Scalars, counts as is)
        self.byte_scale = float(byte_scale)

    # -- one iteration ------------------------------------------------------
    def run(self, programs) -> IterationStats:
        """``programs[r]`` is rank r's generator factory: ``f(ctx) -> generator``."""
        P = len(programs)
        self.env = env = simpy.Environment()
        self.network.reset(env, P)
        self.bytes_sent = [0] * P
        self.msgs_sent = [0] * P
        self.channels = {}
        self.memo = {}     # memo kernels' results by content key
        self.digests = {}  # id -> (read-only array, digest)
        self.trace = []
        self.finish = [0.0] * P
        self.results = [None] * P
        for r, make in enumerate(programs):
            ctx = SimContext(self, r, P)
            env.process(self._drive(ctx, make(ctx)))
        # The cyclic garbage collector's full passes grow with the number of live
        # generators and handles; a large run spends up to half its time there.
        # Rank programs create (almost) no reference cycles, so pause it.
        gc_on = gc.isenabled()
        gc.disable()
        try:
            env.run()
        finally:
            if gc_on:
                gc.enable()
        return IterationStats(self.finish, self.results, self.bytes_sent, self.msgs_sent,
                              events_scheduled(env), self.trace)

    def _drive(self, ctx, gen):
        env = self.env
        rank = ctx.rank
        value = None
        while True:
            try:
                req = gen.send(value)
            except StopIteration as stop:
                self.results[rank] = stop.value
                self.finish[rank] = env.now
                return
            t = type(req)
            if t is Waitall:
                hs = req.handles
                pending = [h for h in hs if not h.done]
                if pending:
                    yield self._wait(pending, len(pending))
                value = [h.value for h in hs]
            elif t is Compute:
                k = get_kernel(req.kernel)
                value = self._memo_call(k, req) if k.memo else k.numpy(*req.args, **req.kwargs)
                if self.ideal:
                    dt = 0.0
                else:
                    w = k.work(value, *req.args, **req.kwargs)
                    if self.byte_scale != 1.0:
                        w = Work(w.elems * self.byte_scale, w.bytes * self.byte_scale)
                    dt = self.device.cost(req.kernel, w)
                if self.trace_on:
                    self.trace.append((rank, ctx._phase, "compute:" + req.kernel, -1, 0, env.now, env.now + dt))
                if dt > 0:
                    yield env.timeout(dt)
            elif t is Waitany:
                hs = req.handles
                if not hs:
                    raise ValueError(f"rank {rank}: waitany on an empty list")
                if not any(h.done for h in hs):
                    yield self._wait(hs, 1)
                i = next(i for i, h in enumerate(hs) if h.done)
                value = (i, hs[i].value)
            else:
                raise TypeError(f"rank {rank} yielded {req!r}; expected ctx.waitall/waitany/compute")

    def _memo_call(self, k, req):
        # by name, and with ``like`` (which only lends its dtype) replaced by that dtype
        bound = _signature(k.numpy).bind(*req.args, **req.kwargs).arguments
        args = tuple((n, ("like", v.dtype.str) if n == "like" else v) for n, v in bound.items())
        key = _memo_key((k.name, args), self.digests)
        if key is None:
            return k.numpy(*req.args, **req.kwargs)
        out = self.memo.get(key)
        if out is None:
            out = k.numpy(*req.args, **req.kwargs)
            if isinstance(out, np.ndarray):
                out.setflags(write=False)
            elif isinstance(out, Payload):
                out = out.map(_freeze)
            self.memo[key] = out
        return out

    def _wait(self, handles, need):
        ev = self.env.event()
        state = [need]

        def tick():
            state[0] -= 1
            if state[0] == 0:
                ev.succeed()

        for h in handles:
            if h._waiters is None:
                h._waiters = [tick]
            else:
                h._waiters.append(tick)
        return ev

    # -- point-to-point -----------------------------------------------------
    def _channel(self, key):
        ch = self.channels.get(key)
        if ch is None:
            ch = self.channels[key] = (deque(), deque())  # unmatched sends, unmatched recvs
        return ch

    def _post_send(self, msg: _Message):
        sends, recvs = self._channel((msg.src, msg.dst, msg.tag))
        if recvs:
            msg.recv = recvs.popleft()
            self._start(msg)
        else:
            sends.append(msg)
            if msg.nbytes <= self.eager:
                self._start(msg)

    def _post_recv(self, src, dst, tag, h):
        sends, recvs = self._channel((src, dst, tag))
        if sends:
            msg = sends.popleft()
            msg.recv = h
            if msg.arrived:
                self._complete(h, msg.payload, msg.nbytes, dst)
            elif not msg.started:
                self._start(msg)
        else:
            recvs.append(h)

    def _start(self, msg: _Message):
        msg.started = True
        rendezvous = msg.nbytes > self.eager
        if rendezvous and self.rdv_rtt > 0:
            self.env.timeout(self.rdv_rtt).callbacks.append(
                lambda _e: self.network.transfer(msg.src, msg.dst, msg.nbytes, lambda: self._arrive(msg)))
        else:
            self.network.transfer(msg.src, msg.dst, msg.nbytes, lambda: self._arrive(msg))

    def _arrive(self, msg: _Message):
        msg.arrived = True
        self._complete(msg.send, None, msg.nbytes, msg.src)
        if msg.recv is not None:
            self._complete(msg.recv, msg.payload, msg.nbytes, msg.dst)

    def _complete(self, h: Handle, value, nbytes, owner):
        h.done = True
        h.value = value
        if self.trace_on:
            self.trace.append((owner, h.phase, h.kind, h.peer, nbytes, h.post_s, self.env.now))
        ws = h._waiters
        if ws:
            h._waiters = None
            for w in ws:
                w()

