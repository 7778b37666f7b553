"""The event engine: drives every rank program message by message.

Each rank's generator is stepped by the engine (:mod:`simsparse.engine`: the
lean heap, or SimPy as the reference). Posting operations is
instantaneous; the network model moves messages; ``compute`` runs the numpy
kernel and advances that rank's clock by the device model's cost.

MPI semantics modelled (the rules themselves are in :mod:`..protocol`):

* matching is by (source, destination, tag) in posting order, as MPI's
  non-overtaking rule gives (no wildcards);
* a message moves when sent if it fits the receiver's window (eager, or
  buffered by the transport), else once its receive is posted; past the
  eager threshold it first pays the rendezvous round trip;
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
returns the rank's gradient of tensor ``i``; ``GradsReady`` (a bucket's
tensors, asked only where nothing else of the rank can use the device) is
``grad_ready`` of each in turn with one wake-up.

Requests that take no simulated time (an all-complete waitall, a zero-cost
kernel on an idle device) do not create SimPy events, which keeps large runs
cheap. A program blocked on messages resumes through one zero-delay event,
never from inside the network model's callbacks.

Helper collectives are expanded into their messages, or, where the
simulator was handed a ``collectives`` evaluator (the table of
:mod:`simsparse.backends.evaluators` chooses it), gathered until every rank
has posted one and timed for all ranks at once, unless the run is traced (a trace
holds every message); which path ran is in ``IterationStats.collectives``.

The pieces: messages and waits in :mod:`.sim_messages`, the shared cores'
CPU work in :mod:`.sim_cpu`, memoised kernels in :mod:`.memo`; this module
holds the ranks, their contexts and the request handlers.
"""
from __future__ import annotations

import gc
from collections import deque

import numpy as np

from ...compute.cores import core_pools
from ...compute.devices import Device, IdealDevice
from ...compute.kernels import KERNELS, Work, get_kernel
from ...compute.message_path import MessagePath
from ...compute.noise import KernelNoise
from ...engine import make_engine
from ...network.model import NetworkModel
from ...ops import ContextBase, Dense, Handle, Payload, Scalars, TraceRecord
from ..driver import BLOCKED, Driver, IterationStats, post
from ..protocol import Protocol, _freeze, device_start, freeze
from .memo import memo_call
from .cpu import HostCPU
from .model import ModelHandlers, TrainingModel  # noqa: F401 (TrainingModel: the model's costs, imported from here)
from .messages import Messages, _Message, _scaled_nbytes, _Wait


class _Rank:
    """Per-rank state shared by the rank's programs: device, streams, counters."""

    __slots__ = ("rank", "device_free", "streams", "bytes_sent", "msgs_sent", "busy", "next_bwd", "ready_at",
                 "core_q", "waking", "unseen", "bulk_until", "blocked_at", "idled", "last_kernel")

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
        self.bulk_until = -1.0                  # the last exit from a bulk collective that ran kernels here
        self.blocked_at = 0.0                   # with a polled wait: when it last went from none blocked to one
        self.idled = 0.0                        # how long it idled in its last wait, until its next kernel
        self.last_kernel = None                 # its previous request's kernel (None: a message, a wait, a layer)


class _Gathering:
    """The ranks that have posted one bulk collective (of type ``kind``) so
    far, when, and in which order (``order``: ranks in the order they posted)."""

    __slots__ = ("kind", "progs", "reqs", "t", "order")

    def __init__(self, P: int, kind: type):
        self.kind, self.progs, self.reqs, self.t, self.order = kind, [None] * P, [None] * P, np.zeros(P), []

    def add(self, rank: int, prog, req, now: float) -> bool:
        """Rank ``rank`` posted; whether every rank has."""
        self.progs[rank], self.reqs[rank], self.t[rank] = prog, req, now
        self.order.append(rank)
        return len(self.order) == len(self.progs)


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
        rs.last_kernel = None
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
        self.r.last_kernel = None
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

    def sent_often(self, payload):
        return freeze(payload)   # (read-only: every send shares it, where each one copied a writable payload)

    def _grads_at_once(self) -> bool:
        """The rank's main program with no task alive, on a device of its own:
        nothing else can use the device until the gradients are ready."""
        prog = self.program
        return self.sim.cores is None and prog.task is None and not prog.live_children


class Simulator(Messages, HostCPU, ModelHandlers, Driver):
    """Runs one iteration of P rank programs on a network and device model."""

    def __init__(self, network: NetworkModel, device: Device | None = None, eager_threshold_B: int = 65536,
                 rendezvous_rtt_s: float = 0.0, trace: bool = False, byte_scale: float = 1.0, engine: str = "lean",
                 collectives=None, unexpected_window_B: int | None = None):
        super().__init__()
        #: what times a gathered helper collective for all ranks at once (``time(host, kind, reqs, entry,
        #: order, device, now, pending)`` -> (evaluator name, BulkRun, results)), or None: every collective
        #: runs as its messages (the evaluator table hands it over: simsparse.backends.evaluators)
        self.collectives = collectives
        #: "lean" (a heap of calls) or "simpy" (the reference): the same times (simsparse.engine)
        self.engine = engine
        self.network = network
        self.device = device or IdealDevice()
        self.ideal = isinstance(self.device, IdealDevice)
        #: ranks that share a host's cores (compute.cores): device work is processor-shared
        self.shared_cores = getattr(self.device, "shared_cores", None)
        prof = getattr(self.device, "profile", None)
        #: the host's speed against calibration for the ranks' sends, receives, waits and Python and the kernel's
        #: network stack (DeviceProfile.cpu_slowdown, else its slowdown, which the kernels take)
        k = float(getattr(prof, "cpu_slowdown", None) or getattr(prof, "slowdown", None) or 1.0)

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
        #: with shared cores, how long every rank idled before the run starts: its first kernel pays idle_excess for it
        self.start_idle = (getattr(prof, "start_idle_s", None) or 0.0) if self.shared_cores else 0.0
        #: how long the network idles before each run (the real backend's common start): its buckets refill
        self.start_pause = getattr(prof, "start_pause_s", None) or 0.0
        #: with shared cores and a measured send/receive path, its CPU per message (compute.message_path)
        costs = getattr(prof, "message_path", None) if self.shared_cores else None
        self.path = MessagePath(costs, scale=k) if costs else None
        #: with shared cores, core-seconds of the program's own Python before each kernel (the real driver's steps)
        self.program_cpu = charged("program_cpu_s")
        #: with shared cores on a TCP fabric: the kernel's network stack per payload byte, its pace, and the bytes a
        #: shaped link lets pass at once (see _stack)
        st = getattr(prof, "network_stack", None) if self.shared_cores else None
        self.stack = ((k * st.cpu_per_byte_s, st.rate_Bps, getattr(network, "burst", 0.0))
                      if st is not None and st.cpu_per_byte_s > 0 else None)
        #: and the TCP work inside each end's own send and receive calls, per payload byte (see _tcp_calls)
        calls = (k * st.send_cpu_per_byte_s, k * st.recv_cpu_per_byte_s) if self.stack is not None else (0, 0)
        self.tcp_calls = calls if any(calls) else None
        #: the spread of each kernel call's time around its median, where the profile measured it (compute.noise)
        bands = getattr(prof, "kernel_noise", None)
        #: the kernels' draws take this seed, the model's own the next (DeviceProfile.noise_seed picks another pair)
        self.noise_seed = 2 * getattr(prof, "noise_seed", 0)
        self.noise = KernelNoise(bands, seed=self.noise_seed) if bands and not self.ideal else None
        self._layer_bands, self._own_noise = None, None   # a model's own bands, and their draws (run)
        #: with shared cores, how ranks are bound to them (compute.cores: one pool, or blocks)
        self.core_binding = getattr(prof, "core_binding", "none")
        #: with shared cores, the scheduler's time slice (compute.cores.SlicedCores), or None: processor sharing
        self.core_slice = getattr(prof, "core_slice_s", None) if self.shared_cores else None
        #: eager threshold, receive window and rendezvous round trip (.protocol: the one place of their rules)
        self.protocol = Protocol.of(eager_threshold_B, rendezvous_rtt_s, unexpected_window_B)
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
        self.network.reset(env, P, self.start_pause)
        self.model, self.grads = model, grads
        #: what the model's pieces draw from: its own bands (a stream of draws apart from the kernels'), else
        #: the kernel noise (None: none)
        own = model.noise if model is not None and not self.ideal else None
        if own != self._layer_bands:   # (kept from run to run, as the kernel noise is: each iteration draws on)
            self._layer_bands, self._own_noise = own, KernelNoise(own, seed=self.noise_seed + 1) if own else None
        self.layer_noise = self._own_noise or self.noise
        if model is not None:
            L = len(model.sizes)
            offs = model.offsets
            self._bwd_cum_a = np.concatenate([[0.0], np.cumsum(model.t_backward[::-1])])
            self._bwd_cum = self._bwd_cum_a.tolist()
            self._views = [(offs[i], offs[i] + model.sizes[i]) for i in range(L)]
        self.stack_backlog: dict[int, float] = {}   # sender -> stack work issued while its piece runs (_stack_piece)
        self.ranks = [_Rank(r, len(model.sizes) if model else 0) for r in range(P)]
        if model is None:   # (a training step starts with its forward, timed by the layers' own calibration)
            for rs in self.ranks:
                rs.idled = self.start_idle
        self.pending: dict = {}   # (src, dst, tag) -> unmatched sends or receives (see _post_send)
        # a trace holds every message, as the real backend's does: then collectives run as messages
        self.cores = (core_pools(env, self.shared_cores, P, self.core_binding, self.core_slice) if self.shared_cores
                      else None)
        if self.cores is not None:   # every rank reports its CPU (cpu_s), an idle one 0
            for rs in self.ranks:
                rs.busy["cpu"] = 0.0
        self.tcp_q: dict = {}    # rank -> the pieces of its TCP calls' work, in turn (_tcp_piece)
        self.on_cpu: dict = {}   # handle -> [its rank's CPU jobs still to run, the completion that waits for them]
        self.blocked = [0] * P   # per rank: its programs blocked in a wait (polled, see _poll)
        self.poll_gen = [0] * P  # per rank: which blocked spell its pending poll belongs to
        # with shared cores a kernel's end depends on the other ranks' work, with kernel noise on each rank's own
        # draws: then collectives run as messages
        self._bulk = (self.collectives is not None and not self.trace_on and self.cores is None
                      and self.noise is None)
        self.gathering: dict = {}   # (scope, place) -> the ranks that posted that bulk collective so far
        self.evaluated: dict = {}   # evaluator name -> the collectives it timed
        self.inexact = {"order": 0, "outside": 0, "device": 0}   # where a bulk evaluation may differ (fast.bulk)
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
        if self.evaluated:
            self.inexact["outside"] += self.network.bulk_touched
        return IterationStats(self.finish, self.results, [rs.bytes_sent for rs in self.ranks],
                              [rs.msgs_sent for rs in self.ranks], env.events, self.trace,
                              [rs.busy for rs in self.ranks], dict(self.evaluated),
                              {k: v for k, v in self.inexact.items() if v})

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
        value = memo_call(self.memo, self.digests, k, req.args, req.kwargs) if k.memo else k.numpy(*req.args, **req.kwargs)
        if self.ideal and not self.trace_on and prog.ctx.r.device_free <= self.env.now:
            return value   # no time, nothing queued before it, nothing to record
        w = k.work(value, *req.args, **req.kwargs) if self.trace_on or not self.ideal else None
        if self.ideal:
            dt = 0.0
        else:
            rs = prog.ctx.r
            dt = self.work_seconds(k.name, w, rs.idled, rs.last_kernel == k.name)
            rs.idled, rs.last_kernel = 0.0, k.name
            if self.noise is not None:   # the call's draw of the profile's kernel noise (compute.noise)
                dt *= self.noise.factor(prog.ctx.rank, dt)
        nbytes = round(w.bytes * self.byte_scale) if self.trace_on else 0   # (its record: the bytes it touches)
        if not self.ideal and self.program_cpu:   # the program's Python before the kernel: on the cores, outside
            return self._on_cores(prog, dt, value, "compute:" + req.kernel, "compute", (), self.program_cpu, nbytes)
        return self._device(prog, dt, value, "compute:" + req.kernel, "compute", nbytes=nbytes)

    def run_kernel(self, name: str, args: tuple, kwargs: dict):
        """A kernel's value and the device seconds it costs (``on_compute``'s work)."""
        k = KERNELS.get(name) or get_kernel(name)
        value = memo_call(self.memo, self.digests, k, args, kwargs) if k.memo else k.numpy(*args, **kwargs)
        return value, self.kernel_seconds(k, value, args, kwargs)

    def kernel_seconds(self, k, value, args, kwargs, idle_s: float = 0.0) -> float:
        """Device seconds of kernel ``k`` called on ``args`` (returning
        ``value``), its work scaled back to full size; ``idle_s``: how long
        its rank idled in a wait, or before the run, just before (``DeviceProfile`` ``idle_excess``)."""
        if self.ideal:
            return 0.0
        return self.work_seconds(k.name, k.work(value, *args, **kwargs), idle_s)

    def work_seconds(self, name: str, w: Work, idle_s: float = 0.0, back_to_back: bool = False) -> float:
        """Device seconds of kernel ``name`` doing work ``w``, scaled back to full size (``idle_s``,
        ``back_to_back``: :meth:`~simsparse.compute.devices.ParametricDevice.cost`)."""
        if self.ideal:
            return 0.0
        if self.byte_scale != 1.0:   # (the constructor: dataclasses.replace was a fifth of a small kernel's cost)
            w = Work(w.elems * self.byte_scale, w.bytes * self.byte_scale, w.parts, w.path, w.select * self.byte_scale)
        return self.device.cost(name, w, idle_s, back_to_back)

    def wire_bytes(self, payload: Payload) -> int:
        """Bytes on the wire: data scaled back to full size, host metadata as is."""
        if type(payload) is Scalars:   # host metadata, never scaled (the count exchange: P^2 blocks a call)
            return payload.values.nbytes
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
        post(prog.ctx, lambda: self._gather(prog, req))
        return BLOCKED

    def _gather(self, prog, req) -> None:
        """Rank ``prog.ctx.rank`` posts bulk collective ``req`` (its scope's
        next); the last rank to post it has it timed."""
        ctx = prog.ctx
        key = (ctx.sid, ctx.nbulk)
        ctx.nbulk += 1
        g = self.gathering.get(key)
        if g is None:
            g = self.gathering[key] = _Gathering(len(self.ranks), type(req))
        elif type(req) is not g.kind:
            raise RuntimeError(f"rank {ctx.rank} posted {type(req).__name__} where other ranks posted another "
                               f"collective (every rank must post the same collectives in the same order)")
        if g.add(ctx.rank, prog, req, self.env.now):
            del self.gathering[key]
            self._gathered(g)

    def _gathered(self, g: "_Gathering") -> None:
        """Every rank posted: the collective is timed for all of them at once;
        account what each sent and computed and resume each at its exit with
        its result, in the order the event engine would."""
        now = self.env.now
        pending = min((h.t[h.order].min() for h in self.gathering.values() if h.order), default=np.inf)
        device = np.array([rs.device_free for rs in self.ranks])
        name, run, results = self.collectives.time(self, g.kind, g.reqs, g.t, g.order, device, now, pending)
        self.network.bulk_commit(now)
        exits = run.t
        self.evaluated[name] = self.evaluated.get(name, 0) + 1
        for cause, n in run.inexact.items():
            self.inexact[cause] += n
        if exits.min() < now:   # (no bulk collective lets a rank leave before the last one came)
            self.inexact["order"] += 1
        sent, msgs, busy = run.sent.tolist(), run.msgs.tolist(), run.busy.tolist()
        for r, rs in enumerate(self.ranks):
            rs.bytes_sent += sent[r]
            rs.msgs_sent += msgs[r]
            if busy[r]:
                rs.busy["compute"] += busy[r]
                rs.device_free = max(rs.device_free, float(run.device[r]))
                rs.bulk_until = max(rs.bulk_until, float(exits[r]))
        for r in run.done:
            self.env.at_time(float(exits[r]), self._resume, (g.progs[r], results[r]))

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

    def _resume(self, prog_value) -> None:
        self.step(*prog_value)

    def _device(self, prog, dt, value, op, category, covered=(), nbytes: int = 0):
        """Occupy the rank's device for dt after everything issued before
        (with shared cores: dt seconds of one core's work, see :meth:`_on_cores`);
        ``nbytes``: what its trace record says the work touches."""
        if self.cores is not None and (dt > 0 or prog.ctx.r.core_q):
            return self._on_cores(prog, dt, value, op, category, covered, 0.0, nbytes)
        ctx = prog.ctx
        rs, now = ctx.r, self.env.now
        start = device_start(rs.device_free, now)
        end = start + dt
        if dt > 0:
            rs.busy[category] += dt
            if now < rs.bulk_until:   # queued behind a bulk collective's kernels issued later
                self.inexact["device"] += 1
        if self.trace_on:
            self.trace.append(TraceRecord(rs.rank, ctx._phase, op, -1, nbytes, start, end, ctx.lane))
        if end > now:
            rs.device_free = end
            self.env.at(end - now, self._resume, (prog, value))
            return BLOCKED
        return value
