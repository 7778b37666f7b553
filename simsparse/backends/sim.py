"""The simulator backend: drives rank programs as SimPy processes.

Each rank's generator runs in its own SimPy process. Posting operations is
instantaneous; the network model moves messages; ``compute`` runs the numpy
kernel and advances that rank's clock by the device model's cost.

MPI semantics modelled:

* matching is by (source, destination, tag) in posting order, as MPI's
  non-overtaking rule gives (no wildcards);
* a message of at most ``eager_threshold_B`` bytes starts moving when the send
  is posted (eager); a larger one starts when both send and receive are posted
  (rendezvous), plus ``rendezvous_rtt_s`` for the RTS/CTS handshake -- unless
  it fits the ``unexpected_window_B`` that the transport buffers at the
  receiver (TCP sockets: the receive window): then it moves when sent and
  pays only the start-up;
* a send completes when its data has arrived, a receive when its data has
  arrived and it has been posted. Payload arrays are copied when a send is
  posted, so a sender may reuse its buffers; the copy is read-only and is
  shared, not copied again, when a receiver forwards it (an allgather moves
  each block once in memory, not once per hop). Received arrays are
  therefore read-only: rank programs copy before writing, as with inputs.
* kernels marked ``memo`` (decompress-and-sum of received blocks) run once
  per iteration for identical read-only inputs; every calling rank is still
  charged the device cost.

Concurrency inside a rank (spawned programs, :mod:`.driver`): every rank has
one device, a FIFO in issue order -- a compute, forward or backward request
starts when the device has finished everything issued before it on that rank,
and the issuing program resumes when it ends. ``forward`` and ``grad_ready``
are charged from the model's per-tensor times (:class:`TrainingModel`);
``grad_ready(i)`` runs the backward of every tensor from the last one not yet
computed down to ``i`` (backward order is reverse registration order) and
returns the rank's gradient of tensor ``i``.

Requests that take no simulated time (an all-complete waitall, a zero-cost
kernel on an idle device) do not create SimPy events, which keeps large runs
cheap. A program blocked on messages resumes through one zero-delay event,
never from inside the network model's callbacks.

Helper collectives are expanded into their messages, or with ``bulk`` (the
default) evaluated for all ranks at once where they have a bulk schedule and
the network a bulk path (:mod:`.bulk`), unless the run is traced (a trace
holds every message); which path ran is in ``IterationStats.collectives``.
"""
from __future__ import annotations

import functools
import gc
import hashlib
import inspect
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from ..compute.cores import core_pools
from ..compute.devices import Device, IdealDevice
from ..compute.kernels import KERNELS, Work, get_kernel
from ..compute.message_path import MessagePath
from ..compute.noise import KernelNoise
from ..engine import make_engine
from ..network.model import NetworkModel
from ..ops import Bundle, ContextBase, Dense, Handle, Payload, TraceRecord
from .bulk import Gathered, _freeze, gather
from .waves_ab import APPROX_FROM
from .driver import BLOCKED, Driver, IterationStats, post


@functools.lru_cache(maxsize=None)
def _signature(fn):
    return inspect.signature(fn)


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(a)).cast("B"), digest_size=16).digest()


#: a remembered key of more parts than this is kept as a digest of its text: a bulk allgather's
#: tuple of P blocks made every memo lookup hash P keys (0.6 ms each at P = 4096)
_DIGEST_PARTS = 16


def _memo_key(obj, digests: dict):
    """Hashable content key of kernel arguments, or None when not memoisable.
    Arrays are keyed by a digest of their bytes; read-only arrays (shared
    received data, which the simulator never writes) are hashed once and
    remembered by identity in ``digests``, and so are the keys of payloads
    and tuples made only of read-only data (a bulk allgather gives every
    rank one such tuple)."""
    return _key(obj, digests)[0]


def _key(obj, digests: dict):
    """(key, whether it can be remembered by the object's identity)."""
    if isinstance(obj, np.ndarray):
        if obj.flags.writeable:
            return ("a", _digest(obj), obj.dtype.str, obj.shape), False
        hit = digests.get(id(obj))
        if hit is None or hit[0] is not obj:
            hit = digests[id(obj)] = (obj, ("a", _digest(obj), obj.dtype.str, obj.shape))  # keeps obj alive
        return hit[1], True
    if isinstance(obj, (tuple, Payload)):
        hit = digests.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1], True
        if type(obj) is Gathered:   # every rank holds this very tuple of read-only blocks
            key = ("g", id(obj))
            digests[id(obj)] = (obj, key)   # (keeps it alive: the id stays its own)
            return key, True
    if isinstance(obj, (list, tuple)):
        parts = [_key(o, digests) for o in obj]
        if any(k is None for k, _ in parts):
            return None, False
        key, fixed = ("l", tuple(k for k, _ in parts)), all(f for _, f in parts) and isinstance(obj, tuple)
    elif isinstance(obj, Payload):
        parts = [_key(a, digests) for a in obj.arrays()]
        if any(k is None for k, _ in parts):
            return None, False
        key, fixed = ("p", type(obj).__name__, tuple(k for k, _ in parts), repr(obj.meta())), all(f for _, f in parts)
    elif isinstance(obj, (int, float, str, bool, type(None), np.generic)):
        return ("s", obj), True
    else:
        return None, False
    if fixed:
        if len(parts) > _DIGEST_PARTS:   # one digest, hashed once, instead of a tuple of P keys hashed per lookup
            key = ("d", hashlib.blake2b(repr(key).encode(), digest_size=16).digest())
        digests[id(obj)] = (obj, key)
    return key, fixed


def _scaled_nbytes(p: Payload, s: float) -> int:
    """Wire size of a payload carried at reduced size: data scaled by s,
    host metadata (Scalars) as is."""
    if isinstance(p, Bundle):
        return sum(_scaled_nbytes(q, s) for q in p.parts)
    return p.nbytes if p.HOST else int(round(p.nbytes * s))


#: a rank blocked this long stops polling (Simulator._poll): a deadlocked run's event queue still empties
POLL_MAX_S = 3600.0


#: the kernel's network stack is charged in pieces of at least this many payload bytes, at most STACK_PIECES
STACK_PIECE_B, STACK_PIECES = 1 << 16, 64


def _polled(_) -> None:
    """A poll's CPU is done: the rank goes on waiting."""


class _Wait:
    """A program blocked until ``need`` more of ``handles`` complete (all of
    them for a waitall, one for a waitany)."""

    __slots__ = ("prog", "handles", "need", "any")

    def __init__(self, prog, handles, need, any_):
        self.prog, self.handles, self.need, self.any = prog, handles, need, any_


class _Message(Handle):
    """A message from posting to arrival; it is also the send's handle (one
    object per message) and, called, its arrival (the network model's
    ``done``: no closure per message). ``peer`` is the destination, ``wtag``
    the tag on the wire (scoped)."""

    __slots__ = ("sim", "src", "wtag", "payload", "recv", "started", "arrived")

    def __init__(self, sim, src, dst, tag, wtag, payload, nbytes, post_s, phase, lane):
        self.kind, self.peer, self.tag, self.nbytes = "send", dst, tag, nbytes
        self.done, self.value, self._waiters = False, None, None
        self.post_s, self.phase, self.lane = post_s, phase, lane
        self.sim, self.src, self.wtag, self.payload = sim, src, wtag, payload
        self.recv = None
        self.started = False
        self.arrived = False

    def __call__(self) -> None:
        self.arrived = True
        sim, h = self.sim, self.recv
        if sim.trace_on or sim.on_cpu or sim.path is not None:
            sim._complete(self, None, self.nbytes, self.src)
            if h is not None:
                sim._arrived(h, self.payload, self.nbytes, self.peer)
            return
        self.done = True   # _complete without the trace (every message passes here)
        sim._notify(self)
        if h is not None:
            h.done = True
            h.value = self.payload
            sim._notify(h)


@dataclass(frozen=True)
class TrainingModel:
    """What ``forward`` and ``grad_ready`` cost on every rank's device, and
    where each tensor's gradient lies in the rank's flat gradient vector.
    ``t_backward`` and ``sizes`` are in registration order."""

    t_forward: float
    t_backward: tuple
    sizes: tuple

    @property
    def offsets(self) -> list:
        return list(np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(int)) if self.sizes else []


class _Rank:
    """Per-rank state shared by the rank's programs: device, streams, counters."""

    __slots__ = ("rank", "device_free", "streams", "bytes_sent", "msgs_sent", "busy", "next_bwd", "ready_at",
                 "core_q", "waking", "unseen")

    def __init__(self, rank: int, n_tensors: int):
        self.rank = rank
        self.device_free = 0.0
        self.streams = {}
        self.bytes_sent = 0
        self.msgs_sent = 0
        self.busy = {"forward": 0.0, "backward": 0.0, "compute": 0.0}
        self.next_bwd = 0                       # tensors (in backward order) whose backward was issued
        self.ready_at = [0.0] * n_tensors       # backward order: when each gradient is ready
        self.core_q: deque = deque()            # with shared cores: device work not yet run, in issue order
        self.waking = 0                         # with shared cores and a trace: its completed waits not yet woken
        self.unseen: list = []                  # likewise: (handle, bytes, when) completed, its driver not yet told


class SimContext(ContextBase):
    """The per-rank handle a rank program sees in the simulator."""

    # slots, not a dict: a large run touches every rank's context each step,
    # and the smaller it is the more of them stay in cache
    __slots__ = ("rank", "size", "_phase", "sim", "r", "byte_scale", "scope", "sid", "lane", "spawned", "streams",
                 "program", "parent_program", "nbulk")

    def __init__(self, sim: "Simulator", rs: _Rank, size: int, scope: tuple = (), sid: int = 0, lane: str = "main"):
        super().__init__(rs.rank, size, rs.streams, scope, sid, lane)
        self.sim, self.r = sim, rs
        self.byte_scale = sim.byte_scale
        self.nbulk = 0   # bulk collectives this program posted: the next one's place in its scope

    def now(self) -> float:
        return self.sim.env.now

    def isend(self, dst, payload, tag=0):
        if not 0 <= dst < self.size or dst == self.rank:
            self._check_peer(dst)
        sim, rs = self.sim, self.r
        if type(payload) is Dense:   # the common case (sim.wire_bytes and freeze, inlined): no new payload if read-only
            v = payload.values
            nb = v.nbytes if sim.byte_scale == 1.0 else int(round(v.nbytes * sim.byte_scale))
            if v.flags.writeable:
                payload = Dense(_freeze(v))
        else:
            nb = payload.nbytes if sim.byte_scale == 1.0 else _scaled_nbytes(payload, sim.byte_scale)
            payload = payload.map(_freeze)
        rs.bytes_sent += nb
        rs.msgs_sent += 1
        msg = _Message(sim, self.rank, dst, tag, self.wire_tag(tag), payload, nb, sim.env.now, self._phase, self.lane)
        if sim.path is not None:   # serialised on the rank's core first (compute.message_path), then posted
            sim.on_core(self.rank, sim.path.send_s(payload, nb), sim._packed, (self, msg))
        else:
            sim._post(self, msg)
        return msg

    def irecv(self, src, tag=0):
        if not 0 <= src < self.size or src == self.rank:
            self._check_peer(src)
        sim = self.sim
        h = Handle("recv", src, tag, 0, sim.env.now, self._phase, self.lane)
        if sim.msg_cpu:
            sim._cpu_start(h, self.rank)
        wt = self.wire_tag(tag)
        if self.program.stream is None:
            sim._post_recv(src, self.rank, wt, h)
        else:
            post(self, lambda: sim._post_recv(src, self.rank, wt, h, late=True))
        return h

    def spawn(self, program, stream=None, lane=None):
        return self.sim.spawn(self, program, stream, lane)


class Simulator(Driver):
    """Runs one iteration of P rank programs on a network and device model."""

    def __init__(self, network: NetworkModel, device: Device | None = None, eager_threshold_B: int = 65536,
                 rendezvous_rtt_s: float = 0.0, trace: bool = False, byte_scale: float = 1.0, engine: str = "lean",
                 bulk: bool = True, unexpected_window_B: int | None = None):
        super().__init__()
        #: evaluate helper collectives in bulk where they and the network can (.bulk)
        self.bulk = bulk
        #: a bulk collective of at least this many messages that waits for ports is timed wave after
        #: wave (approximate, :mod:`.waves_ab`) instead of replayed in event order (exact)
        self.approx_from = APPROX_FROM
        #: "lean" (a heap of calls) or "simpy" (the reference): the same times (simsparse.engine)
        self.engine = engine
        self.network = network
        self.device = device or IdealDevice()
        self.ideal = isinstance(self.device, IdealDevice)
        #: ranks that share a host's cores (compute.cores): device work is processor-shared
        self.shared_cores = getattr(self.device, "shared_cores", None)
        prof = getattr(self.device, "profile", None)
        #: the host's speed against calibration (DeviceProfile.slowdown): a slow host runs all its CPU work
        #: slower, the ranks' sends, receives, waits and Python and the kernel's network stack as its kernels
        k = float(getattr(prof, "slowdown", None) or 1.0)

        def charged(name: str) -> float:   # a profile's core-seconds at this host's speed, with shared cores
            return k * (getattr(prof, name, None) or 0.0) if self.shared_cores else 0.0

        #: with shared cores, core-seconds every posted send and receive costs its rank (see _cpu_start)
        self.msg_cpu = charged("message_cpu_s")
        #: with shared cores, core-seconds a rank spends waking from a blocking wait (see _resume_wait)
        self.wait_cpu = charged("wait_cpu_s")
        #: with shared cores: a rank blocked longer than wait_poll_after_s wakes every wait_poll_s (see _poll)
        self.wait_poll = (getattr(prof, "wait_poll_s", None) or 0.0) if self.wait_cpu else 0.0
        self.wait_poll_after = getattr(prof, "wait_poll_after_s", None) or 0.0
        #: with shared cores, core-seconds every rank spends as a run starts (see _begin)
        self.start_cpu = charged("start_cpu_s")
        #: with shared cores and a measured send/receive path, its CPU per message (compute.message_path)
        costs = getattr(prof, "message_path", None) if self.shared_cores else None
        self.path = MessagePath(costs, scale=k) if costs else None
        #: with shared cores, core-seconds of the program's own Python before each kernel (the real driver's steps)
        self.program_cpu = charged("program_cpu_s")
        #: with shared cores on a TCP fabric: the kernel's network stack per payload byte, and its pace (see _stack)
        st = getattr(prof, "network_stack", None) if self.shared_cores else None
        self.stack = (k * st.cpu_per_byte_s, st.rate_Bps) if st is not None and st.cpu_per_byte_s > 0 else None
        #: the spread of each kernel call's time around its median, where the profile measured it (compute.noise)
        bands = getattr(prof, "kernel_noise", None)
        self.noise = KernelNoise(bands) if bands and not self.ideal else None
        #: with shared cores, how ranks are bound to them (compute.cores: one pool, or blocks)
        self.core_binding = getattr(prof, "core_binding", "none")
        #: with shared cores, the scheduler's time slice (compute.cores.SlicedCores), or None: processor sharing
        self.core_slice = getattr(prof, "core_slice_s", None) if self.shared_cores else None
        self.eager = int(eager_threshold_B)
        self.rdv_rtt = float(rendezvous_rtt_s)
        #: messages up to this size move when sent, before their receive is posted (at least the eager ones)
        self.window = max(self.eager, int(unexpected_window_B)) if unexpected_window_B is not None else self.eager
        self.trace_on = trace
        #: data carried at 1/byte_scale of full size: data bytes and compute
        #: work count byte_scale times (host metadata, Scalars, counts as is)
        self.byte_scale = float(byte_scale)

    # -- one iteration ------------------------------------------------------
    def run(self, programs, model: TrainingModel | None = None, grads: list | None = None) -> IterationStats:
        """``programs[r]`` is rank r's generator factory: ``f(ctx) -> generator``.
        ``model`` and ``grads`` (each rank's flat gradient) serve ``forward``
        and ``grad_ready``."""
        P = len(programs)
        self.env = env = make_engine(self.engine)
        self.network.reset(env, P)
        self.model, self.grads = model, grads
        if model is not None:
            L = len(model.sizes)
            offs = model.offsets
            self._bwd_cum = np.concatenate([[0.0], np.cumsum(model.t_backward[::-1])]).tolist()
            self._views = [(offs[i], offs[i] + model.sizes[i]) for i in range(L)]
        self.stack_backlog: dict[int, float] = {}   # sender -> stack work issued while its piece runs (_stack_piece)
        self.ranks = [_Rank(r, len(model.sizes) if model else 0) for r in range(P)]
        self.pending: dict = {}   # (src, dst, tag) -> unmatched sends or receives (see _post_send)
        # a trace holds every message, as the real backend's does: then collectives run as messages
        self.cores = (core_pools(env, self.shared_cores, P, self.core_binding, self.core_slice) if self.shared_cores
                      else None)
        if self.cores is not None:   # every rank reports its CPU (cpu_s), an idle one 0
            for rs in self.ranks:
                rs.busy["cpu"] = 0.0
        self.on_cpu: dict = {}   # handle -> None while its rank's CPU work runs, or its completion that waits for it
        self.blocked = [0] * P   # per rank: its programs blocked in a wait (polled, see _poll)
        self.poll_gen = [0] * P  # per rank: which blocked spell its pending poll belongs to
        # with shared cores a kernel's end depends on the other ranks' work, with kernel noise on each rank's own
        # draws: then collectives run as messages
        self._bulk = (self.bulk and not self.trace_on and self.network.bulk_capable() and self.cores is None
                      and self.noise is None)
        self.gathering: dict = {}   # (scope, place) -> the ranks that posted that bulk collective so far
        self.bulk_runs = self.bulk_inexact = 0
        self.memo = {}     # memo kernels' results by content key
        self.digests = {}  # id -> (read-only array, digest)
        self.trace = []
        #: message records end when the rank's driver learns of the completion (see _complete)
        self._notice = self.trace_on and self.cores is not None
        self.finish = [0.0] * P
        self.results = [None] * P
        self.returned = [False] * P
        # The cyclic garbage collector's full passes grow with the number of live
        # generators and handles; a large run spends up to half its time there.
        # Rank programs create (almost) no reference cycles, so pause it.
        gc_on = gc.isenabled()
        gc.disable()
        try:
            for rs, make in zip(self.ranks, programs):
                ctx = SimContext(self, rs, P)
                if self.start_cpu:
                    self.on_core(rs.rank, self.start_cpu, self._begin, (ctx, make(ctx)))
                else:
                    self.start(ctx, make(ctx))
            env.run()
        finally:
            if gc_on:
                gc.enable()
        if self._notice:   # completions no driver step came after (a send never waited for)
            for rs in self.ranks:
                self._seen(rs, None)
        stuck = [r for r in range(P) if not self.returned[r]]
        if stuck:
            raise RuntimeError(f"deadlock: the programs of ranks {stuck[:8]}{' ...' if len(stuck) > 8 else ''} never "
                               f"returned (a receive without a matching send, or a wait that cannot complete)")
        if self.gathering:
            raise RuntimeError("deadlock: a collective was posted by some ranks but not all")
        path = "events"
        if self.bulk_runs:
            path = "bulk" if not (self.bulk_inexact or self.network.bulk_touched) else "bulk~"
        return IterationStats(self.finish, self.results, [rs.bytes_sent for rs in self.ranks],
                              [rs.msgs_sent for rs in self.ranks], env.events, self.trace,
                              [rs.busy for rs in self.ranks], path)

    # -- driver hooks ----------------------------------------------------------
    def child_context(self, parent, path, sid, lane):
        return SimContext(self, parent.r, parent.size, path, sid, lane)

    def task_done(self, prog, value):
        ctx, t = prog.ctx, prog.task
        if t is None:
            self.results[ctx.rank] = value
            self.finish[ctx.rank] = self.env.now
            self.returned[ctx.rank] = True
            return
        if self.trace_on:
            self.trace.append(TraceRecord(ctx.rank, t.lane, "task", -1, 0, t.post_s, self.env.now, t.lane))
        t.done = True
        t.value = value
        self._notify(t)

    # -- request handlers (the table in .driver) ------------------------------------
    def on_waitall(self, prog, req):
        hs = req   # the request is the list of handles
        need = 0
        for h in hs:
            if not h.done:
                need += 1
        if not need:
            return [h.value for h in hs]
        self._wait(_Wait(prog, hs, need, False))
        if self.wait_poll:
            self._block(prog.ctx.rank)
        return BLOCKED

    def on_waitany(self, prog, req):
        hs = req.handles
        if not hs:
            raise ValueError(f"rank {prog.ctx.rank}: waitany on an empty list")
        for i, h in enumerate(hs):
            if h.done:
                return (i, h.value)
        self._wait(_Wait(prog, hs, 1, True))
        if self.wait_poll:
            self._block(prog.ctx.rank)
        return BLOCKED

    def on_compute(self, prog, req):
        k = KERNELS.get(req.kernel) or get_kernel(req.kernel)
        value = self._memo_call(k, req.args, req.kwargs) if k.memo else k.numpy(*req.args, **req.kwargs)
        if self.ideal:
            if not self.trace_on and prog.ctx.r.device_free <= self.env.now:
                return value   # no time, nothing queued before it, nothing to record
            dt = 0.0
        else:
            dt = self.kernel_seconds(k, value, req.args, req.kwargs)
            if self.noise is not None:
                dt *= self.noise.factor(prog.ctx.rank, dt)
            if self.program_cpu:   # the program's Python before the kernel: on the cores, outside its record
                return self._on_cores(prog, dt, value, "compute:" + req.kernel, "compute", (), self.program_cpu)
        return self._device(prog, dt, value, "compute:" + req.kernel, "compute")

    def run_kernel(self, name: str, args: tuple, kwargs: dict):
        """A kernel's value and the device seconds it costs (``on_compute``'s work)."""
        k = KERNELS.get(name) or get_kernel(name)
        value = self._memo_call(k, args, kwargs) if k.memo else k.numpy(*args, **kwargs)
        return value, self.kernel_seconds(k, value, args, kwargs)

    def kernel_seconds(self, k, value, args, kwargs) -> float:
        """Device seconds of kernel ``k`` called on ``args`` (returning
        ``value``), its work scaled back to full size."""
        if self.ideal:
            return 0.0
        return self.work_seconds(k.name, k.work(value, *args, **kwargs))

    def work_seconds(self, name: str, w: Work) -> float:
        """Device seconds of kernel ``name`` doing work ``w``, scaled back to full size."""
        if self.ideal:
            return 0.0
        if self.byte_scale != 1.0:
            w = replace(w, elems=w.elems * self.byte_scale, bytes=w.bytes * self.byte_scale)
        return self.device.cost(name, w)

    def wire_bytes(self, payload: Payload) -> int:
        """Bytes on the wire: data scaled back to full size, host metadata as is."""
        if self.byte_scale == 1.0:
            return payload.nbytes
        if type(payload) is Dense:
            return int(round(payload.values.nbytes * self.byte_scale))
        return _scaled_nbytes(payload, self.byte_scale)

    def on_collective(self, prog, req):
        """Expand it into messages, or gather it for a bulk evaluation (held
        back behind its stream like its messages would be)."""
        if not self._bulk or type(req).bulk is None:
            return self.expand(prog, req)
        post(prog.ctx, lambda: gather(self, prog, req))
        return BLOCKED

    def on_delay(self, prog, req):
        """Resume after the wait a :class:`~simsparse.ops.Delay` asks for; the device stays free."""
        now = self.env.now
        wait = req.seconds + ((-now) % req.align if req.align > 0 else 0.0)
        if self.trace_on:
            ctx = prog.ctx
            self.trace.append(TraceRecord(ctx.rank, ctx._phase, "delay", -1, 0, now, now + wait, ctx.lane))
        if wait <= 0:
            return None
        self.env.at(wait, self._resume, (prog, None))
        return BLOCKED

    def on_forward(self, prog, req):
        return self._device(prog, self._model("forward").t_forward, None, "forward", "forward")

    def on_grad_ready(self, prog, req):
        m, rs = self._model("grad_ready"), prog.ctx.r
        i = req.index
        L = len(m.sizes)
        if not 0 <= i < L:
            raise IndexError(f"grad_ready({i}): the model has {L} tensors")
        a, b = self._views[i]
        value = self.grads[rs.rank][a:b]
        pos = L - 1 - i
        if pos >= rs.next_bwd:  # run the backward of tensors next_bwd..pos
            dt = self._bwd_cum[pos + 1] - self._bwd_cum[rs.next_bwd]
            covered = range(rs.next_bwd, pos + 1)
            rs.next_bwd = pos + 1
            out = self._device(prog, dt, value, "backward", "backward", covered)
            end = max(rs.device_free, self.env.now)
            for p in covered:   # (with shared cores: when the backward has run, see _core_done)
                rs.ready_at[p] = end
            return out
        delay = rs.ready_at[pos] - self.env.now
        if delay <= 0:
            return value
        self.env.at(delay, self._resume, (prog, value))
        return BLOCKED

    def _resume(self, prog_value) -> None:
        self.step(*prog_value)

    def _transfer(self, msg: _Message) -> None:
        self.network.transfer(msg.src, msg.peer, msg.nbytes, msg)

    def _model(self, what) -> TrainingModel:
        if self.model is None:
            raise RuntimeError(f"ctx.{what}() needs a model: this run simulates a bare collective")
        return self.model

    def on_core(self, rank: int, work: float, done, arg) -> None:
        """``work`` core-seconds of ``rank`` on its shared cores, then ``done(arg)``;
        counted in the rank's ``busy["cpu"]`` (the row's ``cpu_s``)."""
        self.ranks[rank].busy["cpu"] += work
        self.cores[rank].run(work, done, arg, rank)

    def _device(self, prog, dt, value, op, category, covered=()):
        """Occupy the rank's device for dt after everything issued before
        (with shared cores: dt seconds of one core's work, see :meth:`_on_cores`)."""
        if self.cores is not None and (dt > 0 or prog.ctx.r.core_q):
            return self._on_cores(prog, dt, value, op, category, covered)
        ctx = prog.ctx
        rs, now = ctx.r, self.env.now
        start = rs.device_free if rs.device_free > now else now
        end = start + dt
        if dt > 0:
            rs.busy[category] += dt
        if self.trace_on:
            self.trace.append(TraceRecord(rs.rank, ctx._phase, op, -1, 0, start, end, ctx.lane))
        if end > now:
            rs.device_free = end
            self.env.at(end - now, self._resume, (prog, value))
            return BLOCKED
        return value

    def _on_cores(self, prog, dt, value, op, category, covered, pre: float = 0.0):
        """Device work on shared cores: the rank's work runs in issue order,
        each piece as a job of :class:`~simsparse.compute.cores.SharedCores`
        (its end depends on what the other ranks run meanwhile); the program
        resumes when its piece has run. ``pre`` core-seconds of the program's
        own Python run first, outside the piece's record and its busy time
        (as the real backend's trace times only the kernel)."""
        rs = prog.ctx.r
        rs.busy[category] += dt
        rs.device_free = float("inf")   # until the queue has run: nothing may start before it
        rs.core_q.append((prog, dt, value, op, covered, pre))
        if len(rs.core_q) == 1:
            self._core_next(rs)
        return BLOCKED

    def _core_next(self, rs) -> None:
        pre = rs.core_q[0][5]
        if pre:
            self.on_core(rs.rank, pre, self._core_piece, rs)
        else:
            self._core_piece(rs)

    def _core_piece(self, rs) -> None:
        self.on_core(rs.rank, rs.core_q[0][1], self._core_done, (rs, self.env.now))

    def _core_done(self, rs_start) -> None:
        rs, start = rs_start
        prog, dt, value, op, covered, _ = rs.core_q.popleft()
        now = self.env.now
        for p in covered:
            rs.ready_at[p] = now
        if self.trace_on:
            ctx = prog.ctx
            self.trace.append(TraceRecord(rs.rank, ctx._phase, op, -1, 0, start, now, ctx.lane))
        if rs.core_q:
            self._core_next(rs)
        else:
            rs.device_free = now
            if rs.unseen:   # back in its driver's loop, whose progress sees what completed meanwhile
                self._seen(rs, now)
        self.env.at(0.0, self._resume, (prog, value))

    def _memo_call(self, k, args, kwargs):
        # by name, and with ``like`` (which only lends its dtype) replaced by that dtype
        bound = _signature(k.numpy).bind(*args, **kwargs).arguments
        named = tuple((n, ("like", v.dtype.str) if n == "like" else v) for n, v in bound.items())
        key = _memo_key((k.name, named), self.digests)
        if key is None:
            return k.numpy(*args, **kwargs)
        out = self.memo.get(key)
        if out is None:
            out = k.numpy(*args, **kwargs)
            if isinstance(out, np.ndarray):
                out.setflags(write=False)
            elif isinstance(out, Payload):
                out = out.map(_freeze)
            self.memo[key] = out
        return out

    # A handle's waiters: None, the one _Wait (the common case: no list), or
    # a list of them in the order they began to wait.

    @staticmethod
    def _wait(w: _Wait) -> None:
        for h in w.handles:
            if not h.done:
                ws = h._waiters
                if ws is None:
                    h._waiters = w
                elif type(ws) is list:
                    ws.append(w)
                else:
                    h._waiters = [ws, w]

    def _notify(self, h: Handle) -> None:
        """``h`` completed: a wait it completes resumes its program through a
        zero-delay call (never from inside the network model's callbacks)."""
        ws = h._waiters
        if ws is None:
            return
        h._waiters = None
        for w in (ws if type(ws) is list else (ws,)):
            w.need -= 1
            if not w.need:
                if self._notice:
                    self.ranks[w.prog.ctx.rank].waking += 1
                self.env.soon(self._resume_wait, w)

    def _resume_wait(self, w: _Wait) -> None:
        """A blocked wait is complete. With shared cores its rank first wakes:
        ``wait_cpu`` core-seconds on its cores (the real driver's poll or
        sleep returns and runs MPI's progress), once however many requests
        the wait completes (simsparse.calibration.network.request_cpu)."""
        if self.wait_poll:
            self.blocked[w.prog.ctx.rank] -= 1
        if self.wait_cpu:
            self.on_core(w.prog.ctx.rank, self.wait_cpu, self._woke, w)
        else:
            self._woke(w)

    def _block(self, rank: int) -> None:
        """A program of ``rank`` blocks in a wait: the rank's first poll, if it is not polling already."""
        self.blocked[rank] += 1
        if self.blocked[rank] == 1:
            self.poll_gen[rank] += 1
            self.env.at(self.wait_poll_after, self._poll, (rank, self.poll_gen[rank], self.env.now))

    def _poll(self, arg) -> None:
        """A blocked rank's periodic wake-up: ``wait_cpu`` core-seconds on its cores, then the next in
        ``wait_poll`` seconds while it stays blocked. The real backend's wait on a testbed
        (:class:`~simsparse.backends.wire.SocketSleep`) yields for 300 us, then sleeps in ``select`` with a
        timeout that doubles from 50 us to 2 ms; a send's progress (room in its socket's buffer) wakes
        nothing, so a rank waiting on a transfer wakes every 2 ms, and each wake-up runs MPI's progress. On
        the star a rank streaming 4 MiB messages spent 8.6 % of a core at 100 Mb/s and 9.5 % at 200 Mb/s
        sending, 5.7 and 6.5 % receiving: CPU per second of waiting, not per byte (docs/validation.md,
        sixteenth session). With 4 ranks per core that takes up to a third of the core from a rank's
        kernels. (A rank blocked for :data:`POLL_MAX_S` stops polling: a run that deadlocks still ends.)"""
        rank, gen, since = arg
        if self.blocked[rank] and self.poll_gen[rank] == gen and self.env.now - since < POLL_MAX_S:
            self.on_core(rank, self.wait_cpu, _polled, None)
            self.env.at(self.wait_poll, self._poll, arg)

    def _woke(self, w: _Wait) -> None:
        if self._notice:
            rs = self.ranks[w.prog.ctx.rank]
            rs.waking -= 1
            self._seen(rs, self.env.now)
        hs = w.handles
        if w.any:
            i = next(i for i, h in enumerate(hs) if h.done)
            self.step(w.prog, (i, hs[i].value))
        else:
            self.step(w.prog, [h.value for h in hs])

    # -- point-to-point -----------------------------------------------------
    # What is posted and not yet matched waits in ``pending`` under its
    # (src, dst, tag), only while there is something: memory follows the
    # messages in flight, not the pairs that ever communicated (P^2 in an
    # all-to-all). A key holds only sends or only receives (a send and a
    # receive of one key match at once): one item as itself (the common
    # case), more in a deque in posting order. A receive is a plain Handle.

    def _post_send(self, msg: _Message, late: bool = False):
        if late:
            msg.post_s = self.env.now
        key = (msg.src, msg.peer, msg.wtag)
        pending = self.pending
        q = pending.get(key)
        if q is None:
            pending[key] = msg
        elif type(q) is Handle:          # one receive was waiting
            del pending[key]
            msg.recv = q
            return self._start(msg)
        elif type(q) is _Message:
            pending[key] = deque((q, msg))
        elif type(q[0]) is Handle:       # several receives were waiting
            msg.recv = q.popleft()
            if len(q) == 1:
                pending[key] = q[0]
            return self._start(msg)
        else:
            q.append(msg)
        if msg.nbytes <= self.window:   # eager, or buffered by the receiver's transport: it moves now
            self._start(msg)

    def _post_recv(self, src, dst, tag, h, late: bool = False):
        if late:
            h.post_s = self.env.now
        key = (src, dst, tag)
        pending = self.pending
        q = pending.get(key)
        if q is None:
            pending[key] = h
            return
        if type(q) is _Message:          # one send was waiting
            msg = q
            del pending[key]
        elif type(q) is Handle:
            pending[key] = deque((q, h))
            return
        elif type(q[0]) is Handle:
            q.append(h)
            return
        else:
            msg = q.popleft()
            if len(q) == 1:
                pending[key] = q[0]
        msg.recv = h
        if msg.arrived:
            self._arrived(h, msg.payload, msg.nbytes, dst)
        elif not msg.started:
            self._start(msg)

    def _start(self, msg: _Message):
        msg.started = True
        delay = 0.0
        if self.rdv_rtt > 0 and msg.nbytes > self.eager:   # rendezvous start-up (RTS/CTS) first
            delay = self.rdv_rtt
            self.env.at(self.rdv_rtt, self._transfer, msg)
        else:
            self.network.transfer(msg.src, msg.peer, msg.nbytes, msg)
        if self.stack is not None and msg.nbytes > 0:
            self._stack(msg.src, msg.nbytes, delay)

    def _stack(self, rank: int, nbytes: int, delay: float) -> None:
        """The kernel's TCP/IP work for a message of ``nbytes`` (``DeviceProfile.network_stack``): on a TCP
        fabric the host's kernel segments, forwards and acknowledges every frame in softirq context, on the
        cores the ranks run on and outside any rank's process. It is charged on the sender's cores (a veth
        pair and a bridge carry a frame to its receiver in the sending core's softirq), in pieces of at
        least :data:`STACK_PIECE_B` spread as the bytes move at the stack's measured pace, each a job of its
        own that takes a core at once (an interrupt does not wait for a time slice). Not in the rank's
        ``cpu_s``: no rank's CPU clock counts it."""
        per_b, rate = self.stack
        n = max(1, min(STACK_PIECES, -(-nbytes // STACK_PIECE_B)))
        piece = nbytes / n
        for i in range(n):
            self.env.at(delay + (i + 0.5) * piece / rate, self._stack_piece, (rank, piece * per_b))

    def _stack_piece(self, arg) -> None:
        """One piece of a sender's stack work: a job of its own, or added to the one running (a core's
        softirq work runs one piece after another, never as several tasks at once)."""
        rank, work = arg
        if rank in self.stack_backlog:
            self.stack_backlog[rank] += work
        else:
            self._stack_run(rank, work)

    def _stack_run(self, rank: int, work: float) -> None:
        self.stack_backlog[rank] = 0.0
        self.cores[rank].run(work, self._stack_done, rank, ("stack", rank))

    def _stack_done(self, rank: int) -> None:
        more = self.stack_backlog.pop(rank)
        if more > 0.0:
            self._stack_run(rank, more)

    def _begin(self, arg) -> None:
        """A rank's program starts once its share of ``start_cpu`` is done: the
        real ranks leave the iteration's common start together, each from a
        sleep and with cold caches, and their first requests cost that much
        more than the steady ``msg_cpu`` (a 3-step exchange of 1 KiB at P = 8
        on 2 cores took 0.9 to 1.9 ms a step, a 30-step one 0.7 to 1.0 ms)."""
        self.start(*arg)

    def _cpu_start(self, h: Handle, rank: int) -> None:
        """A posted request costs its rank ``msg_cpu`` core-seconds, shared
        with the other ranks' work (:class:`~simsparse.compute.cores.SharedCores`),
        beside the transfer: the request completes when both are done. The
        real backend's driver, MPI's progress and the kernel's TCP for each
        message, and the waiting loops that poll for them, run on the host's
        cores: an exchange of 1 KiB on the testbed took 104 us at P = 2 and
        415 us at P = 4 on 2 cores (CPU-bound: 4 ranks x 2 requests x 104 us
        / 2 cores), while 8 KiB took 695 us, its wire time: the CPU work
        overlaps the wire's. Through shared memory at P = 2 an exchange costs
        two requests of CPU, twice a ping-pong's half round trip."""
        self.on_cpu[h] = None
        self.on_core(rank, self.msg_cpu, self._cpu_end, h)

    def _post(self, ctx, msg: _Message) -> None:
        """Post a send of ``ctx``'s program now (behind its stream, if any);
        with shared cores its progress costs CPU from now on (``_cpu_start``)."""
        if self.msg_cpu:
            self._cpu_start(msg, ctx.rank)
        if ctx.program.stream is None:
            self._post_send(msg)
        else:
            post(ctx, lambda: self._post_send(msg, late=True))

    def _packed(self, arg) -> None:
        """A send's payload is serialised: it is posted now."""
        ctx, msg = arg
        msg.post_s = self.env.now
        self._post(ctx, msg)

    def _arrived(self, h: Handle, value, nbytes, owner) -> None:
        """A receive's message is here: with a measured receive path its rank
        matches and unpacks it first (compute.message_path), then it completes."""
        if self.path is None:
            self._complete(h, value, nbytes, owner)
        else:
            self.on_core(owner, self.path.recv_s(value, nbytes), self._unpacked, (h, value, nbytes, owner))

    def _unpacked(self, arg) -> None:
        self._complete(*arg)

    def _cpu_end(self, h: Handle) -> None:
        done = self.on_cpu.pop(h)
        if done is not None:
            self._complete(h, *done)

    def _complete(self, h: Handle, value, nbytes, owner):
        if self.on_cpu and h in self.on_cpu:   # transferred; its CPU work has not run yet
            self.on_cpu[h] = (value, nbytes, owner)
            return
        h.done = True
        h.value = value
        self._notify(h)   # (may start the owner's wake-up)
        if self.trace_on:
            rs = self.ranks[owner]
            if self._notice and (rs.core_q or rs.waking):
                rs.unseen.append((h, nbytes, self.env.now))
            else:
                self.trace.append(TraceRecord(owner, h.phase, h.kind, h.peer, nbytes, h.post_s, self.env.now, h.lane))

    def _seen(self, rs: _Rank, now) -> None:
        """Record the messages of ``rs`` that completed while its driver was busy, ending ``now`` (None:
        when they completed). The real backend's trace ends a message where its driver's progress learns
        of the completion (:meth:`~simsparse.backends.mpi.MPIDriver._message_done`); its one thread runs
        that progress only between program steps, never during a kernel, and a rank whose wait completed
        must first get a core back to run it (``wait_cpu``). With shared cores the model knows both, so
        its records end there too: a rank that posts two 8 KB sends on the star and waits for them while
        the other rank of its core computes saw them done 0.85 to 1.0 ms after posting (the wire: 0.2 ms)."""
        for h, nbytes, t in rs.unseen:
            self.trace.append(TraceRecord(rs.rank, h.phase, h.kind, h.peer, nbytes, h.post_s,
                                          t if now is None else now, h.lane))
        rs.unseen.clear()
