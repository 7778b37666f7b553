"""The simulator's messages: MPI matching by (source, destination, tag) in
posting order, eager, buffered and rendezvous starts, completions, and the
waits they end. Mixed into :class:`~.sim.Simulator` (the module docstring
there states the semantics modelled).

Cost model: the network model's ``transfer`` from the moment a message may
move (plus ``rendezvous_rtt_s`` past the eager threshold); a send completes
at its arrival, a receive at its arrival once posted.
"""
from __future__ import annotations

from collections import deque

from ...ops import Bundle, Handle, Payload, TraceRecord
from ..driver import post


def _scaled_nbytes(p: Payload, s: float) -> int:
    """Wire size of a payload carried at reduced size: data scaled by s,
    host metadata (Scalars) as is."""
    if isinstance(p, Bundle):
        return sum(_scaled_nbytes(q, s) for q in p.parts)
    return p.nbytes if p.HOST else int(round(p.nbytes * s))


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

    __slots__ = ("sim", "src", "wtag", "payload", "recv", "started", "arrived", "rx_left")

    def __init__(self, sim, src, dst, tag, wtag, payload, nbytes, post_s, phase, lane):
        self.kind, self.peer, self.tag, self.nbytes = "send", dst, tag, nbytes
        self.done, self.value, self._waiters = False, None, None
        self.post_s, self.phase, self.lane = post_s, phase, lane
        self.sim, self.src, self.wtag, self.payload = sim, src, wtag, payload
        self.recv = None
        self.started = False
        self.arrived = False
        self.rx_left = 0   # pieces of the receiving side's TCP work still to run (Simulator._tcp_calls)

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


class Messages:
    """Mixed into :class:`~.sim.Simulator`: posting, matching and completing messages, and waking waits."""

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
            rank = w.prog.ctx.rank
            self.blocked[rank] -= 1
            if not self.blocked[rank]:   # it slept since its programs blocked or its device went idle, if later
                rs = self.ranks[rank]
                rs.idled = max(0.0, self.env.now - max(rs.blocked_at, rs.device_free))
        if self.wait_cpu:
            self.on_core(w.prog.ctx.rank, self.wait_cpu, self._woke, w)
        else:
            self._woke(w)

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
        if not self.protocol.gated(msg.nbytes):   # eager, or buffered by the receiver: it moves now
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
        if msg.rx_left:   # the receiving side's TCP work for it still runs: the receive waits for it too
            self._hold(h, msg.rx_left)
        if msg.arrived:
            self._arrived(h, msg.payload, msg.nbytes, dst)
        elif not msg.started:
            self._start(msg)

    def _start(self, msg: _Message):
        msg.started = True
        delay = self.protocol.handshake(msg.nbytes)
        if delay > 0:   # rendezvous start-up (RTS/CTS) first
            self.env.at(delay, self._transfer, msg)
        else:
            self.network.transfer(msg.src, msg.peer, msg.nbytes, msg)
        if self.stack is not None and msg.nbytes > 0:
            self._stack(msg.src, msg.nbytes, delay)
            if self.tcp_calls is not None:
                self._tcp_calls(msg, delay)

    def _transfer(self, msg: _Message) -> None:
        self.network.transfer(msg.src, msg.peer, msg.nbytes, msg)

    def _post(self, ctx, msg: _Message) -> None:
        """Post a send of ``ctx``'s program now (behind its stream, if any);
        with shared cores its progress costs CPU from now on (``_cpu_start``)."""
        if self.msg_cpu:
            self._cpu_start(msg, ctx.rank)
        if ctx.program.stream is None:
            self._post_send(msg)
        else:
            post(ctx, lambda: self._post_send(msg, late=True))

    def _complete(self, h: Handle, value, nbytes, owner):
        if self.on_cpu and h in self.on_cpu:   # transferred; its CPU work has not run yet
            self.on_cpu[h][1] = (value, nbytes, owner)
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
