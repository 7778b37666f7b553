"""One common start for every rank of a timed run (a synchronised window).

A barrier releases its ranks at different times: the last arrival travels
log P rounds of messages, and a rank asleep in its wait sees it when it
wakes. On the testbed, ranks left the barrier 0.2 to 2 ms apart (gaussiank
at P = 4, n = 1e4, an iteration of about 2.5 ms). Timing each rank from its
own exit adds that spread to every collective in which an early rank waits
for a late one, and the simulator, whose ranks all start at 0, never sees
it (Hoefler, Schneider and Lumsdaine, "Accurately measuring collective
operations at massive scale", IPDPS 2008; Hunold and Carpen-Amarie,
"Reproducible MPI benchmarking is still not as easy as you think", TPDS
2016). Here every rank starts at one instant of a common clock and is timed
from it.

*The clock.* Ranks on one kernel (one boot id: one host, or the testbed's
namespaces) share ``CLOCK_MONOTONIC`` (``time.perf_counter``); elsewhere each
rank takes its offset to rank 0 from the ping-pong of least round trip out
of :data:`PINGS` (Cristian's algorithm).

*The instant.* An allreduce (MAX, waited without spinning) of each rank's
arrival and of the longest it has been released after the latest arrival
so far; the start is the latest arrival plus twice that delay
(:data:`MIN_MARGIN_S` at least, :data:`FIRST_MARGIN_S` the first time).
Every rank computes the same start, and waits for it as it waits for
messages: spinning with a core per rank (a rank that slept there began
cold: on this host the points of n = 1e4 and 1e5 measured about twice as
long as after a spinning barrier), else asleep until the last
:data:`YIELD_S`. The delay is the running maximum, not
the last one: ranks asleep in the allreduce's rounds wake within 0.1 to
10 ms on the testbed, and a margin from the last delay alone was missed in
half the points of the suite. A rank released after the start begins at
once, still timed from the common start; :attr:`CommonStart.late_s` keeps
the worst such lateness for the row.
"""
from __future__ import annotations

import os
import time

import numpy as np

MIN_MARGIN_S, FIRST_MARGIN_S = 2e-3, 20e-3
#: the last stretch before the start is waited by yielding, not sleeping (a sleep may overshoot by the timer slack)
YIELD_S = 150e-6
PINGS = 20


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return f"unknown-{os.getpid()}"   # never equal across processes: the offsets are measured


def clock_offset(comm) -> float:
    """This rank's ``perf_counter`` minus rank 0's, in seconds (0 on a shared kernel)."""
    if len(set(comm.allgather(_boot_id()))) == 1:
        return 0.0
    rank, buf = comm.Get_rank(), np.zeros(1)
    offset = 0.0
    for peer in range(1, comm.Get_size()):
        best = None
        for _ in range(PINGS):
            if rank == peer:
                t1 = time.perf_counter()
                comm.Send(buf, 0, tag=9001)
                comm.Recv(buf, 0, tag=9002)
                t2 = time.perf_counter()
                if best is None or t2 - t1 < best[0]:
                    best = (t2 - t1, (t1 + t2) / 2 - buf[0])
            elif rank == 0:
                comm.Recv(buf, peer, tag=9001)
                buf[0] = time.perf_counter()
                comm.Send(buf, peer, tag=9002)
        if rank == peer:
            offset = best[1]
    return offset


class CommonStart:
    """Waits every rank of ``comm`` until one agreed instant (see the module docstring)."""

    def __init__(self, comm, box, before: "CommonStart | None" = None):
        """``before``: the same ranks' previous instance, whose clock offset and delays carry over."""
        from mpi4py import MPI

        self.MPI, self.comm, self.box = MPI, comm, box
        self.offset = clock_offset(comm) if before is None else before.offset
        #: the longest this rank was released after the latest arrival, so far
        self.delay = -1.0 if before is None else before.delay
        self.late_s = 0.0     # the worst start this rank missed, and by how much

    def now(self) -> float:
        """The common clock."""
        return time.perf_counter() - self.offset

    def wait(self) -> float:
        """Return at the common start, given in this rank's ``perf_counter``."""
        send, recv = np.array([self.now(), self.delay]), np.empty(2)
        self.box.quiet_wait(self.comm.Iallreduce(send, recv, op=self.MPI.MAX))
        latest, delay = recv
        released = self.now()
        self.delay = max(self.delay, released - latest)
        start = latest + (FIRST_MARGIN_S if delay < 0 else max(MIN_MARGIN_S, 2 * delay))
        if released > start:
            self.late_s = max(self.late_s, released - start)
        elif self.box.wait == "spin":   # a core per rank: stay on it, as a barrier's spin would
            while self.now() < start:
                pass
        else:
            ahead = start - released - YIELD_S
            if ahead > 0:
                time.sleep(ahead)
            while self.now() < start:
                os.sched_yield()
        return start + self.offset


class BarrierStart:
    """The default start: a barrier (waited as the wait mode says), each rank
    then timed from its own exit."""

    late_s = None   # no common start to miss

    def __init__(self, comm, box):
        self.comm, self.box = comm, box

    def wait(self) -> None:
        """Return once every rank has arrived; None: time from now."""
        self.box.quiet_wait(self.comm.Ibarrier())


def make_start(comm, box, before=None) -> "CommonStart | BarrierStart":
    """How a timed run starts: ``SIMSPARSE_START=common`` from a common start;
    the default, ``barrier``, from each rank's own exit of a barrier. In an
    interleaved comparison on this host (P = 2, spinning) the common start
    measured the small points 1.3 to 2x slower than the barrier, for a
    reason not found yet, so it is not the default. ``before``: the previous
    start of these ranks, whose learning a common start carries over."""
    how = os.environ.get("SIMSPARSE_START", "barrier")
    if how not in ("barrier", "common"):
        raise ValueError(f"SIMSPARSE_START={how!r}: must be barrier or common")
    if how == "barrier":
        return BarrierStart(comm, box)
    return CommonStart(comm, box, before if isinstance(before, CommonStart) else None)
