"""The real backend's driver: the same rank programs under ``mpiexec`` with mpi4py + torch.

One process per rank (``simsparse measure`` launches them; the experiment
loop in :mod:`simsparse.experiments.run.worker` calls :meth:`MPIDriver.run`):

* gradient data are torch tensors (CUDA when a GPU is present and allowed, else CPU);
* ``isend`` serialises the payload (:mod:`.wire`; ``.cpu().numpy()`` then mpi4py,
  as the Ok-Topk code does): a large dense block is sent from the tensor's own
  memory, anything else copied into one buffer. As a simulated sender may
  overwrite what it has sent at once, a kernel whose arguments overlap an
  uncopied send in flight waits for it;
* ``irecv`` matches the next message of (source, tag) with ``MPI_Improbe`` in
  posting order -- sparse sizes are not known in advance -- and receives it. A
  spawned program's tags carry its scope (:func:`simsparse.ops.scoped_tag`),
  so concurrent collectives never match each other's messages;
* the rank's programs are stepped cooperatively on one thread. Device work
  (``compute``, ``forward``, the backward behind ``grad_ready``) goes through
  one FIFO queue in issue order, as in the simulator; each kernel runs and is
  timed (synchronising the device around it on a GPU) when it reaches the
  head -- at once if the queue is empty and no other program could act first;
* when nothing can run, the driver blocks inside MPI (``MPI_Waitsome`` on the
  requests in flight, or a probe when only an arriving message can wake a
  program), so transfers progress at MPI's speed; otherwise, or with more
  ranks than cores on the node, it polls and yields the core in between;
* training (:class:`Trainer`): ``forward`` runs the real model's forward and
  loss; when a ``grad_ready`` reaches the head of the device queue the real
  ``loss.backward()`` starts, and a post-accumulate-grad hook on every
  parameter marks its gradient ready and runs the programs (their kernels,
  their message progress) until the queue's head is again a gradient the
  backward has not produced -- so communication overlaps the real backward at
  the granularity of one tensor's gradient.
"""
from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

from ...compute.kernels import get_kernel
from ...ops import Compute, ContextBase, Forward, GradReady, TraceRecord, Waitany
from . import wire
from ..driver import BLOCKED, Driver, IterationStats, post


class _Rank:
    """Per-process state shared by all programs of the rank."""

    def __init__(self, comm, device, trace: bool, on_done):
        from mpi4py import MPI
        import torch

        self.MPI, self.torch, self.comm = MPI, torch, comm
        self.box = wire.Mailbox(comm, self.from_host, on_done)  # the messages in flight
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.device = device
        self.cuda = device.type == "cuda"
        self.trace_on = trace
        self.reset()

    def reset(self, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0
        self.box.reset()
        self.bytes_sent = self.msgs_sent = 0
        self.trace: list[TraceRecord] = []
        self.streams = {}
        self.busy = {"forward": 0.0, "backward": 0.0, "compute": 0.0}
        #: the kernel of the rank's previous request (None: a message, a wait or a layer since), and whether the
        #: call running now repeats it back to back (as the simulator's ranks track it: DeviceProfile's
        #: back_to_back_scale; calibration.probes.KernelProbe records it)
        self.last_kernel, self.back_to_back = None, False

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def to_host(self, t):
        return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)

    def from_host(self, a):
        t = self.torch.from_numpy(a)
        return t.to(self.device, non_blocking=False) if self.cuda else t


class MPIContext(ContextBase):
    def __init__(self, rs: _Rank, driver: "MPIDriver", scope: tuple = (), sid: int = 0, lane: str = "main"):
        super().__init__(rs.rank, rs.size, rs.streams, scope, sid, lane)
        self.r, self.driver = rs, driver

    # compatibility with code that converts through the context
    def to_host(self, t):
        return self.r.to_host(t)

    def from_host(self, a):
        return self.r.from_host(a)

    def now(self) -> float:
        return self.r.now()

    def isend(self, dst, payload, tag=0):
        self._check_peer(dst)
        rs = self.r
        nb = payload.nbytes
        h = wire.Message("send", dst, tag, nb, rs.now(), self._phase, self.lane)
        st = self.program.stream  # a send held back behind its stream is copied: its buffer may change first
        rs.box.pack(h, payload, rs.to_host, split=st is None or st.queue[0] is self.program)
        h.wtag = self.wire_tag(tag)
        rs.bytes_sent += nb
        rs.msgs_sent += 1
        rs.last_kernel = None

        def do_post():
            h.post_s = rs.now()
            rs.box.post_send(h)

        post(self, do_post)
        return h

    def irecv(self, src, tag=0):
        self._check_peer(src)
        rs = self.r
        rs.last_kernel = None
        h = wire.Message("recv", src, tag, 0, rs.now(), self._phase, self.lane)
        h.wtag = self.wire_tag(tag)

        def do_post():
            h.post_s = rs.now()
            rs.box.post_recv(h)

        post(self, do_post)
        return h

    def spawn(self, program, stream=None, lane=None):
        return self.driver.spawn(self, program, stream, lane)


class Trainer:
    """The real model of a training iteration on one rank: ``forward()``
    computes the loss of this rank's batch, ``backward()`` runs autograd;
    ``params`` are the model's parameters in registration order."""

    def __init__(self, model, forward_loss):
        self.model = model
        self.forward_loss = forward_loss
        self.params = list(model.parameters())
        self.loss = None

    def forward(self):
        for p in self.params:
            p.grad = None
        self.loss = self.forward_loss()

    def backward(self):
        loss, self.loss = self.loss, None
        if loss is None:
            raise RuntimeError("grad_ready before forward: a schedule must yield ctx.forward() first")
        loss.backward()


class MPIDriver(Driver):
    """Steps one rank's programs cooperatively; see the module docstring."""

    def __init__(self, comm, device, trace: bool = False, trainer: Trainer | None = None):
        super().__init__()
        self.rs = _Rank(comm, device, trace, self._message_done)
        self.trainer = trainer
        if trainer is not None:
            for i, p in enumerate(trainer.params):
                p.register_post_accumulate_grad_hook(lambda _p, i=i: self._grad_hook(i))

    # -- one iteration ---------------------------------------------------------
    def run(self, make_program, t0: float | None = None) -> IterationStats:
        """Run the rank's main program ``make_program(ctx)`` to completion
        (with everything it spawns); the stats of this rank, its times from
        ``t0`` (a ``perf_counter`` reading: the common start of the ranks,
        :class:`~.start.CommonStart`), or from now."""
        rs = self.rs
        rs.reset(t0)
        self.runnable, self.device_q, self.blocked = deque(), deque(), []
        self.changed = False  # a handle completed since the blocked waits were last checked
        self.in_hook, self.spawning = 0, 0
        self.bwd_from = None   # where the backward last went on (rank clock), while it runs
        self.grads = [None] * (len(self.trainer.params) if self.trainer else 0)
        self.main_done, self.result = False, None
        ctx = MPIContext(rs, self)
        cpu0 = time.process_time()
        self.start(ctx, make_program(ctx))
        self._loop()
        rs.sync()
        rs.busy["cpu"] = time.process_time() - cpu0   # the process's CPU, waits included (poll, yield, spin)
        return IterationStats([self.finish_s], [self.result], [rs.bytes_sent], [rs.msgs_sent], 0, rs.trace, [rs.busy])

    def _loop(self):
        """Run until the main program has returned (outside a hook) or, inside
        a gradient hook, until the backward must go on."""
        runnable, device_q = self.runnable, self.device_q
        while True:
            while runnable:
                prog, value = runnable.popleft()
                self.step(prog, value)
            if device_q:
                prog, req = device_q[0]
                if type(req) is GradReady and self.grads[req.index] is None:
                    if self.in_hook:
                        return  # the backward of the next tensors runs when the hook returns
                    self._backward()
                    continue
                if not self._overlaps_send(req):
                    device_q.popleft()
                    runnable.append((prog, self._device(prog, req)))
                    continue
            elif self.main_done:  # (it has joined everything it spawned)
                return
            if not self._progress():
                self._idle()

    # -- driver hooks ----------------------------------------------------------
    def spawn(self, parent_ctx, program, stream, lane):
        self.spawning += 1  # the parent goes on when the child blocks: the child's kernels queue
        try:
            return super().spawn(parent_ctx, program, stream, lane)
        finally:
            self.spawning -= 1

    def child_context(self, parent, path, sid, lane):
        return MPIContext(self.rs, self, path, sid, lane)

    def task_done(self, prog, value):
        t = prog.task
        rs = self.rs
        if t is None:
            self.main_done, self.result, self.finish_s = True, value, rs.now()
            return
        if rs.trace_on:
            rs.trace.append(TraceRecord(rs.rank, t.lane, "task", -1, 0, t.post_s, rs.now(), t.lane))
        t.done, t.value = True, value
        self.changed = True

    # -- request handlers ----------------------------------------------------------
    def on_waitall(self, prog, req):
        value = _answer(req)
        if value is BLOCKED:
            self.blocked.append((prog, req))
        return value

    def on_waitany(self, prog, req):
        if not req.handles:
            raise ValueError(f"rank {self.rs.rank}: waitany on an empty list")
        return self.on_waitall(prog, req)

    def on_compute(self, prog, req):
        if self.device_q or self.runnable or self.spawning or self._overlaps_send(req):
            self.device_q.append((prog, req))
            return BLOCKED
        return self._device(prog, req)  # an idle device, and no other program could post first: run it now

    on_forward = on_compute

    def on_delay(self, prog, req):
        """A modelled framework delay: the real run has its real software stack, so nothing is added."""
        return None

    def on_grad_ready(self, prog, req):
        if self.trainer is None:
            raise RuntimeError("ctx.grad_ready() needs a model: this run measures a bare collective")
        if not 0 <= req.index < len(self.grads):
            raise IndexError(f"grad_ready({req.index}): the model has {len(self.grads)} tensors")
        g = self.grads[req.index]
        if g is not None:
            return g
        self.device_q.append((prog, req))  # the backward up to this tensor runs in its place in the device order
        return BLOCKED

    # -- the device ----------------------------------------------------------------
    def _device(self, prog, req):
        rs, ctx = self.rs, prog.ctx
        t = type(req)
        if t is GradReady:
            return self.grads[req.index]
        rs.sync()
        start = rs.now()
        if t is Forward:
            if self.trainer is None:
                raise RuntimeError("ctx.forward() needs a model: this run measures a bare collective")
            self.trainer.forward()
            out, op, cat = None, "forward", "forward"
        else:
            k = get_kernel(req.kernel)
            rs.back_to_back, rs.last_kernel = rs.last_kernel == req.kernel, req.kernel
            out = k.torch_fn(*req.args, **req.kwargs)
            op, cat = "compute:" + req.kernel, "compute"
        rs.sync()
        end = rs.now()
        rs.busy[cat] += end - start
        if rs.trace_on:   # a kernel's record: the bytes it touches (its Work's, as the simulator's record says)
            nbytes = int(k.work(out, *req.args, **req.kwargs).bytes) if cat == "compute" else 0
            rs.trace.append(TraceRecord(rs.rank, ctx._phase, op, -1, nbytes, start, end, ctx.lane))
        return out

    def _overlaps_send(self, req) -> bool:
        """Whether a kernel's arguments overlap an uncopied send in flight (the
        kernel waits: in the simulator a sender may overwrite what it sent)."""
        return type(req) is Compute and self.rs.box.overlaps((req.args, req.kwargs))

    def _backward(self):
        """The backward pass, its gradient hooks running the programs (DDP's
        reducer does the same): its trace records and busy time are the spans
        between the hooks, as the simulator's backward is its layers alone."""
        rs = self.rs
        rs.sync()
        self.bwd_from = rs.now()
        self.trainer.backward()
        rs.sync()
        self._backward_piece(rs.now())
        self.bwd_from = None
        for i, p in enumerate(self.trainer.params):  # tensors that got no gradient
            if self.grads[i] is None:
                self.grads[i] = rs.torch.zeros(p.numel(), dtype=p.dtype, device=p.device)

    def _backward_piece(self, end: float) -> None:
        """The backward from where it last went on to ``end`` (a hook's start, or its own end): busy, and traced."""
        rs, start = self.rs, self.bwd_from
        rs.busy["backward"] += end - start
        if rs.trace_on and end > start:
            rs.trace.append(TraceRecord(rs.rank, "main", "backward", -1, 0, start, end, "main"))

    def _grad_hook(self, i):
        p = self.trainer.params[i]
        self.grads[i] = p.grad.detach().reshape(-1)
        self._backward_piece(self.rs.now())   # (hooks fire only inside _backward)
        self.in_hook += 1
        try:
            self._loop()
        finally:
            self.in_hook -= 1
            self.bwd_from = self.rs.now()

    # -- message progress -------------------------------------------------------------
    def _progress(self) -> bool:
        """Match, test, wake; whether the loop has work again."""
        self.rs.box.progress()
        if not self.changed:
            return False
        self.changed = False
        still = []
        for prog, req in self.blocked:
            value = _answer(req)
            if value is BLOCKED:
                still.append((prog, req))
            else:
                self.runnable.append((prog, value))
        self.blocked = still
        return bool(self.runnable or self.device_q)  # (the device may wait for a send)

    def _idle(self) -> None:
        """Nothing can run: block inside MPI if only MPI can wake a program."""
        box = self.rs.box
        box.block(probe=bool(box.unmatched) and not self.device_q and self._gated())

    def _gated(self) -> bool:
        """Whether only a message for an unmatched receive can wake a program:
        every wait needs a handle not in flight at MPI (unmatched, held back, a task)."""
        for _, req in self.blocked:
            flying = [bool(getattr(h, "pending", 0)) for h in req.handles if not h.done]
            if (any if type(req) is Waitany else all)(flying):
                return False
        return True

    def _message_done(self, h) -> None:
        rs = self.rs
        self.changed = True
        if rs.trace_on:
            rs.trace.append(TraceRecord(rs.rank, h.phase, h.kind, h.peer, h.nbytes, h.post_s, rs.now(), h.lane))


def _answer(req):
    """What a waitall/waitany returns now, or BLOCKED."""
    hs = req.handles
    if type(req) is Waitany:
        return next(((i, h.value) for i, h in enumerate(hs) if h.done), BLOCKED)
    return [h.value for h in hs] if all(h.done for h in hs) else BLOCKED


def pick_device(which: str):
    import torch

    if which == "cuda" or (which == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda asked for, but torch sees no CUDA device")
        local = int(os.environ.get("MPI_LOCALRANKID", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")
