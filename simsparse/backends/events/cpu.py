"""The simulator's host CPU where ranks share cores (``Simulator.cores``):
device work, each posted request, each wake-up and poll of a blocked rank,
the serialisation around a message and the kernel's TCP/IP stack, each a job
on the rank's cores (:mod:`simsparse.compute.cores`), and the trace records
that end where a busy rank's driver learns of a completion. Mixed into
:class:`~.sim.Simulator`.

Cost model: the device profile's calibrated core-seconds (``message_cpu_s``,
``wait_cpu_s``, ``wait_poll_s``, ``start_cpu_s``, ``message_path``,
``network_stack``), processor-shared or time-sliced among the ranks of a core.
"""
from __future__ import annotations

from collections import deque

from ...ops import Handle, TraceRecord
from ..driver import BLOCKED

#: a rank blocked this long stops polling (Simulator._poll): a deadlocked run's event queue still empties
POLL_MAX_S = 3600.0


#: the kernel's network stack is charged in pieces of at least this many payload bytes, at most STACK_PIECES
STACK_PIECE_B, STACK_PIECES = 1 << 16, 64


def _pieces(nbytes: int, delay: float, rate: float, burst: float = 0.0) -> tuple[list, float]:
    """A message's TCP work in pieces of at least :data:`STACK_PIECE_B`, at most :data:`STACK_PIECES`, each
    due as its bytes leave from ``delay``: the first ``burst`` bytes at once (a shaped link's token bucket,
    ``FlowNetwork.burst``, lets them pass without waiting for the rate), the rest at ``rate``: (the pieces'
    due times, the bytes of each). The bucket is taken as full, as the pause before a run leaves it; where
    a message finds it drained its work runs early, and its send still ends with its transfer."""
    n = max(1, min(STACK_PIECES, -(-nbytes // STACK_PIECE_B)))
    piece = nbytes / n
    return [delay + max(0.0, (i + 0.5) * piece - burst) / rate for i in range(n)], piece


def _polled(_) -> None:
    """A poll's CPU is done: the rank goes on waiting."""


class HostCPU:
    """Mixed into :class:`~.sim.Simulator`: the shared cores' side of its requests."""

    def on_core(self, rank: int, work: float, done, arg) -> None:
        """``work`` core-seconds of ``rank`` on its shared cores, then ``done(arg)``;
        counted in the rank's ``busy["cpu"]`` (the row's ``cpu_s``)."""
        self.ranks[rank].busy["cpu"] += work
        self.cores[rank].run(work, done, arg, rank)

    def _on_cores(self, prog, dt, value, op, category, covered, pre: float = 0.0, nbytes: int = 0):
        """Device work on shared cores: the rank's work runs in issue order,
        each piece as a job of :class:`~simsparse.compute.cores.SharedCores`
        (its end depends on what the other ranks run meanwhile); the program
        resumes when its piece has run. ``pre`` core-seconds of the program's
        own Python run first, outside the piece's record and its busy time
        (as the real backend's trace times only the kernel)."""
        rs = prog.ctx.r
        rs.busy[category] += dt
        rs.device_free = float("inf")   # until the queue has run: nothing may start before it
        rs.core_q.append((prog, dt, value, op, covered, pre, nbytes))
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
        prog, dt, value, op, covered, _, nbytes = rs.core_q.popleft()
        now = self.env.now
        for p in covered:
            rs.ready_at[p] = now
        if self.trace_on:
            ctx = prog.ctx
            self.trace.append(TraceRecord(rs.rank, ctx._phase, op, -1, nbytes, start, now, ctx.lane))
        if rs.core_q:
            self._core_next(rs)
        else:
            rs.device_free = now
            if rs.unseen:   # back in its driver's loop, whose progress sees what completed meanwhile
                self._seen(rs, now)
        self.env.at(0.0, self._resume, (prog, value))

    def _block(self, rank: int) -> None:
        """A program of ``rank`` blocks in a wait: the rank's first poll, if it is not polling already."""
        self.blocked[rank] += 1
        if self.blocked[rank] == 1:
            self.ranks[rank].blocked_at = self.env.now
            self.poll_gen[rank] += 1
            self.env.at(self.wait_poll_after, self._poll, (rank, self.poll_gen[rank], self.env.now))

    def _poll(self, arg) -> None:
        """A blocked rank's periodic wake-up: ``wait_cpu`` core-seconds on its cores, then the next in
        ``wait_poll`` seconds while it stays blocked. The real backend's wait on a testbed
        (:class:`~simsparse.backends.real.wire.SocketSleep`) yields for 300 us, then sleeps in ``select`` with a
        timeout that doubles from 50 us to 2 ms; a send's progress (room in its socket's buffer) wakes
        nothing, so a rank waiting on a transfer wakes every 2 ms, and each wake-up runs MPI's progress. On
        the star a rank streaming 4 MiB messages spent 8.6 % of a core at 100 Mb/s and 9.5 % at 200 Mb/s
        sending, 5.7 and 6.5 % receiving: CPU per second of waiting, not per byte (docs/history/validation-journal.md,
        sixteenth session). With 4 ranks per core that takes up to a third of the core from a rank's
        kernels. (A rank blocked for :data:`POLL_MAX_S` stops polling: a run that deadlocks still ends.)"""
        rank, gen, since = arg
        if self.blocked[rank] and self.poll_gen[rank] == gen and self.env.now - since < POLL_MAX_S:
            self.on_core(rank, self.wait_cpu, _polled, None)
            self.env.at(self.wait_poll, self._poll, arg)

    def _stack(self, rank: int, nbytes: int, delay: float) -> None:
        """The kernel's TCP/IP work for a message of ``nbytes`` (``DeviceProfile.network_stack``): on a TCP
        fabric the host's kernel segments, forwards and acknowledges every frame in softirq context, on the
        cores the ranks run on and outside any rank's process. It is charged on the sender's cores (a veth
        pair and a bridge carry a frame to its receiver in the sending core's softirq), in pieces of at
        least :data:`STACK_PIECE_B` spread as the bytes move at the stack's measured pace, each a job of its
        own that takes a core at once (an interrupt does not wait for a time slice). Not in the rank's
        ``cpu_s``: no rank's CPU clock counts it."""
        per_b, rate, burst = self.stack
        due, piece = _pieces(nbytes, delay, rate, burst)
        for at in due:
            self.env.at(at, self._stack_piece, (rank, piece * per_b))

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
        self._hold(h, 1)
        self.on_core(rank, self.msg_cpu, self._cpu_end, h)

    def _hold(self, h: Handle, jobs: int) -> None:
        """``h`` completes only once ``jobs`` more CPU jobs of its rank have run (:meth:`_cpu_end`)."""
        held = self.on_cpu.get(h)
        if held is None:
            self.on_cpu[h] = [jobs, None]   # [jobs left, the completion that waits for them]
        else:
            held[0] += jobs

    def _tcp_calls(self, msg, delay: float) -> None:
        """The kernel's TCP work inside the ranks' own send and receive calls for ``msg``
        (``network_stack.send_cpu_per_byte_s`` and ``recv_cpu_per_byte_s``): copying the payload into
        and out of the sockets and cutting it into segments, system time of each end's process, per
        payload byte (per frame at a small MTU). Charged in the pieces and at the pace of :meth:`_stack`,
        each a job of its rank that waits for a core like its kernels; the send, and the receive where
        it is posted, complete only once their side has run. So where the stack and the ranks need more
        than the cores give (4 ranks streaming at 250 Mb/s with 1500-byte frames on 2 cores), a message
        ends when the CPU has carried it, not when the wire could have."""
        c_send, c_recv = self.tcp_calls
        due, piece = _pieces(msg.nbytes, delay, *self.stack[1:])
        if c_send:
            self._hold(msg, len(due))
        if c_recv:   # (a receive posted later waits for what is left of it then)
            msg.rx_left = len(due)
            if msg.recv is not None:
                self._hold(msg.recv, len(due))
        for at in due:
            if c_send:
                self.env.at(at, self._tcp_piece, (msg, msg.src, piece * c_send, self._cpu_end))
            if c_recv:
                self.env.at(at, self._tcp_piece, (msg, msg.peer, piece * c_recv, self._rx_end))

    def _tcp_piece(self, arg) -> None:
        """A piece of one end's TCP work, behind that rank's earlier pieces (its process runs them in turn)."""
        q = self.tcp_q.setdefault(arg[1], deque())
        q.append(arg)
        if len(q) == 1:
            self.on_core(arg[1], arg[2], self._tcp_ran, arg[1])

    def _tcp_ran(self, rank: int) -> None:
        q = self.tcp_q[rank]
        msg, _, _, end = q.popleft()
        if q:
            self.on_core(rank, q[0][2], self._tcp_ran, rank)
        end(msg)

    def _rx_end(self, msg) -> None:
        """A piece of the receiving side's TCP work ran: the receive, if posted, waits for one job fewer."""
        msg.rx_left -= 1
        if msg.recv is not None:
            self._cpu_end(msg.recv)

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
        held = self.on_cpu[h]
        held[0] -= 1
        if not held[0]:
            del self.on_cpu[h]
            if held[1] is not None:
                self._complete(h, *held[1])

    def _seen(self, rs, now) -> None:
        """Record the messages of ``rs`` that completed while its driver was busy, ending ``now`` (None:
        when they completed). The real backend's trace ends a message where its driver's progress learns
        of the completion (:meth:`~simsparse.backends.real.mpi.MPIDriver._message_done`); its one thread runs
        that progress only between program steps, never during a kernel, and a rank whose wait completed
        must first get a core back to run it (``wait_cpu``). With shared cores the model knows both, so
        its records end there too: a rank that posts two 8 KB sends on the star and waits for them while
        the other rank of its core computes saw them done 0.85 to 1.0 ms after posting (the wire: 0.2 ms)."""
        for h, nbytes, t in rs.unseen:
            self.trace.append(TraceRecord(rs.rank, h.phase, h.kind, h.peer, nbytes, h.post_s,
                                          t if now is None else now, h.lane))
        rs.unseen.clear()
