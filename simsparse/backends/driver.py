"""What both backends share: running rank programs, one request table.

A rank runs one *main* program and any number of programs it spawns. Each is
a :class:`Program`; :meth:`Driver.step` sends it a value and dispatches the
requests it yields through one table (:data:`DISPATCH`), until a request
cannot be answered at once (the handler returns :data:`BLOCKED`; the backend
resumes the program later with :meth:`Driver.step`). The backends implement
the handlers:

* the simulator answers from simulated time (network and device models),
* the real backend from MPI and torch.

A helper collective (:class:`~simsparse.ops.Collective`) is one request too.
By default (:meth:`Driver.on_collective`) it is *expanded*: its
point-to-point generator runs in the program's place, on the program's
context, and its return value goes back to the program (a stack of
generators per program). The simulator may evaluate it in bulk instead.

Spawning, joining and the per-stream serialisation of communication are the
same in both and live here. Streams (:class:`Stream`): the programs spawned
on a stream communicate in spawn order; the sends and receives of a program
are held back, in order, until every program spawned before it on that
stream has finished. Compute is not held back: a bucket's sparsification runs while the
previous bucket communicates (OMGS-SGD Eqs. 6-8).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..ops import Collective, Compute, Delay, Forward, GradReady, GradsReady, Task, Waitall, Waitany, scope_id

#: a handler's answer when the program must wait
BLOCKED = object()
#: a handler's answer when it replaced the program's generator (an expanded collective)
EXPANDED = object()

#: request type -> name of the backend's handler method
DISPATCH = {Waitall: "on_waitall", Waitany: "on_waitany", Compute: "on_compute", Forward: "on_forward",
            GradReady: "on_grad_ready", GradsReady: "on_grads_ready", Delay: "on_delay"}


@dataclass
class IterationStats:
    """What one iteration produced on the ranks a backend runs (all ranks in
    the simulator, its own rank in an MPI process), per rank in rank order."""

    finish_s: list            # when the rank's main program returned
    results: list             # the main program's return value
    bytes_sent: list
    msgs_sent: list
    n_events: int = 0         # simulator events (0 in real runs)
    trace: list = field(default_factory=list)  # TraceRecord of these ranks
    busy: list = field(default_factory=list)   # {"forward", "backward", "compute"}: device seconds
    #: the simulator's evaluators of gathered helper collectives: name -> how many each timed (none: events)
    evaluated: dict = field(default_factory=dict)
    #: where a bulk evaluation may differ from the events, by cause -> count (simsparse.backends.fast.bulk)
    inexact: dict = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return max(self.finish_s) if self.finish_s else 0.0


class Program:
    """A running rank program: its generator (``outer``: the generators an
    expanded collective suspended), context, task handle and children."""

    __slots__ = ("gen", "outer", "ctx", "task", "stream", "live_children", "finished")

    def __init__(self, gen, ctx, task: Task | None, stream: "Stream | None"):
        self.gen, self.ctx, self.task, self.stream = gen, ctx, task, stream
        self.outer = []
        self.live_children = 0
        self.finished = False


class Stream:
    """One communication stream of a rank: its programs in spawn order; only
    the first unfinished one may post (the order is the same on every rank,
    so streams of different ranks never wait on each other in a cycle)."""

    __slots__ = ("queue", "held")

    def __init__(self):
        self.queue: deque[Program] = deque()
        self.held: dict[Program, list] = {}

    def join(self, prog: Program) -> None:
        self.queue.append(prog)

    def post(self, prog: Program, do_post) -> None:
        """Post now if ``prog`` is at the head of the stream, else hold it back."""
        if self.queue[0] is prog:
            do_post()
        else:
            self.held.setdefault(prog, []).append(do_post)

    def release(self, prog: Program) -> None:
        """``prog`` finished: the next program's held posts go out."""
        q = self.queue
        if q[0] is not prog:
            return  # it finished early; it leaves the queue (posting what it held) when its turn comes
        q.popleft()
        while q:
            head = q[0]
            for do_post in self.held.pop(head, ()):
                do_post()
            if not head.finished:
                return
            q.popleft()


class Driver:
    """The stepping loop and spawn/join logic; backends add the handlers
    (``on_waitall``, ``on_waitany``, ``on_compute``, ``on_forward``,
    ``on_grad_ready``; ``on_collective`` expands by default), ``child_context``
    and ``task_done``."""

    def __init__(self):
        self._table = {t: getattr(self, name) for t, name in DISPATCH.items() if hasattr(self, name)}

    # -- programs -----------------------------------------------------------
    def start(self, ctx, gen) -> Program:
        """Run a rank's main program until it first blocks."""
        prog = Program(gen, ctx, None, None)
        ctx.program = prog
        self.step(prog, None)
        return prog

    def step(self, prog: Program, value) -> None:
        """Run ``prog`` until it blocks or returns."""
        gen, table = prog.gen, self._table
        while True:
            try:
                req = gen.send(value)
            except StopIteration as stop:
                if prog.outer:   # an expanded collective returned: its caller goes on with its value
                    gen = prog.gen = prog.outer.pop()
                    value = stop.value
                    continue
                self._finish(prog, stop.value)
                return
            t = type(req)
            if t is not Compute and t is not Delay:   # a wait, a layer or a collective between two kernels:
                prog.ctx.r.last_kernel = None             # the next is not back to back (DeviceProfile)
            handler = table.get(t)
            if handler is None:
                handler = self._handler(prog, req)
            value = handler(prog, req)
            if value is BLOCKED:
                return
            if value is EXPANDED:
                gen, value = prog.gen, None

    def _handler(self, prog: Program, req):
        if isinstance(req, Collective):
            handler = self._table[type(req)] = self.on_collective
            return handler
        raise TypeError(f"rank {prog.ctx.rank} ({prog.ctx.lane}) yielded {req!r}; expected ctx.waitall, "
                        f"ctx.waitany, ctx.compute, ctx.forward, ctx.grad_ready or a collective")

    def on_collective(self, prog: Program, req: Collective):
        """Run the collective as its point-to-point messages, in the program's place."""
        return self.expand(prog, req)

    @staticmethod
    def expand(prog: Program, req: Collective):
        prog.outer.append(prog.gen)
        prog.gen = req.expand(prog.ctx)
        return EXPANDED

    def spawn(self, parent_ctx, program, stream: str | None, lane: str | None) -> Task:
        """``ctx.spawn``: a child context with the next tag scope, run at once
        until it first blocks."""
        idx = parent_ctx.spawned
        parent_ctx.spawned += 1
        path = parent_ctx.scope + (idx,)
        name = lane or f"task{idx}"
        if parent_ctx.lane != "main":
            name = f"{parent_ctx.lane}/{name}"
        child = self.child_context(parent_ctx, path, scope_id(path), name)
        task = Task(name, parent_ctx.now())
        parent = parent_ctx.program
        parent.live_children += 1
        st = None
        if stream is not None:
            streams = parent_ctx.streams
            st = streams.get(stream)
            if st is None:
                st = streams[stream] = Stream()
        child.parent_program = parent
        gen = program(child)
        prog = Program(gen, child, task, st)
        child.program = prog
        if st is not None:
            st.join(prog)
        self.step(prog, None)
        return task

    def _finish(self, prog: Program, value) -> None:
        if prog.live_children:
            raise RuntimeError(f"rank {prog.ctx.rank}: program {prog.ctx.lane!r} returned with {prog.live_children} "
                               f"spawned task(s) not joined; wait for them (ctx.waitall) before returning")
        prog.finished = True
        if prog.stream is not None:
            prog.stream.release(prog)
        parent = prog.ctx.parent_program
        if parent is not None:
            parent.live_children -= 1
        self.task_done(prog, value)

    # -- backend hooks ------------------------------------------------------
    def child_context(self, parent_ctx, path: tuple, sid: int, lane: str):  # pragma: no cover - interface
        raise NotImplementedError

    def task_done(self, prog: Program, value) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def post(ctx, do_post) -> None:
    """Post a send or receive of ``ctx``'s program now, or hold it back
    behind the program that owns its stream."""
    prog = ctx.program
    st = prog.stream
    if st is None:
        do_post()
    else:
        st.post(prog, do_post)
