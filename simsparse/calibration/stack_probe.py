"""The host's network stack: the CPU a host spends carrying TCP outside the
ranks' own processes.

Why: on an Ethernet host the kernel runs TCP/IP itself. On the emulated
cluster every frame crosses a veth pair, a bridge and a token bucket, and
its acknowledgements come back the same way; that work runs in softirq
context on the cores the ranks compute on, and no rank's CPU clock sees it.
It is per packet more than per byte: a 100 Mb/s stream of 4 MiB messages
cost this host 20 ns of softirq per payload byte at MTU 1500 and 4 to 5 ns
at MTU 9000 (docs/history/validation-journal.md, nineteenth session), i.e. a quarter of a
core per stream at MTU 1500, taken from the ranks' kernels while the bytes
move. A fabric with RDMA (InfiniBand, Aries) offloads it; a TCP fabric has
it on every host.

The probe: rank 0 streams ``count`` messages of ``nbytes`` to rank 1 through
the real backend's wait while the other ranks wait; the host's interrupt and
softirq time (``/proc/stat``, which counts it apart from any process where
the kernel accounts IRQ time) less that of a quiet interval of the same
length is the stack's. Per payload byte, with the rate the stream reached
(the pace at which the simulator charges it:
:meth:`simsparse.backends.events.sim.Simulator._stack`). Subtracting the ranks'
own CPU (``getrusage``, exact) from the host's busy time (sampled at each
tick) instead left nothing at P = 8: eight polling ranks' short wake-ups
are not what the tick samples.

The same streams give the kernel's TCP work inside the two ranks' own calls:
the sender's and the receiver's system time (``getrusage``'s ``ru_stime``)
less that of the quiet interval, per payload byte
(:meth:`~simsparse.backends.events.sim.Simulator._tcp_calls`). With
1500-byte frames at 250 Mb/s it is what makes 4 streams on 2 cores
CPU-bound: plain sockets there spent 1.52 cores in softirq and 0.36 in
system time for 25 MB/s a stream, against 29.4 alone. Their user time is
left out: a waiting rank's yield loop fills whatever CPU is free, so it is
not work a message waits for (counted, the held-out ring of 3.1M there was
predicted 87 % slow, Rabenseifner 55 %).
"""
from __future__ import annotations

import os
import resource
import time

import numpy as np

#: the columns of /proc/stat's cpu line that the kernel's packet work is counted in (irq, softirq)
_IRQ = (5, 6)


def host_irq_s() -> float:
    """Seconds the whole host (all cores) has spent in interrupts and softirqs since boot."""
    with open("/proc/stat") as f:
        cols = f.readline().split()[1:]
    return sum(int(cols[i]) for i in _IRQ) / os.sysconf("SC_CLK_TCK")


def system_s() -> float:
    """Seconds this process has spent in the kernel (its system time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def stream(comm, box, nbytes: int = 4 << 20, count: int = 8, reps: int = 3) -> dict:
    """Every rank returns ``{"cpu_per_byte_s", "rate_Bps", "send_cpu_per_byte_s", "recv_cpu_per_byte_s",
    "samples"}``: the median over ``reps`` streams of the stack's core-seconds per payload byte, the
    stream's payload rate, and the sender's and the receiver's system time per payload byte. Needs two
    ranks or more."""
    buf = np.zeros(nbytes, np.uint8)
    rank = comm.Get_rank()

    def interval(quiet_s: float | None = None) -> tuple[float, float, float]:
        """(the host's irq and softirq seconds, wall, this rank's system seconds) over a stream, or over a
        sleep of ``quiet_s``."""
        box.quiet_wait(comm.Ibarrier())
        s0 = system_s()
        h0, t0 = host_irq_s(), time.perf_counter()
        if quiet_s is None:
            for i in range(count):
                if rank == 0:
                    box.quiet_wait(comm.Isend(buf, 1, tag=7100 + i))
                elif rank == 1:
                    box.quiet_wait(comm.Irecv(buf, 0, tag=7100 + i))
            box.quiet_wait(comm.Ibarrier())
        else:
            time.sleep(quiet_s)
        return host_irq_s() - h0, time.perf_counter() - t0, system_s() - s0

    interval()   # the first stream opens the connection and grows the socket buffers
    per_byte, rates, own = [], [], []
    for _ in range(reps):
        busy, wall, mine = interval()
        background, _, mine_quiet = interval(quiet_s=wall)
        per_byte.append(max(busy - background, 0.0) / (nbytes * count))
        rates.append(nbytes * count / wall)
        own.append(max(mine - mine_quiet, 0.0) / (nbytes * count))
    ends = comm.gather(float(np.median(own)), root=0)   # rank 0 sent, rank 1 received
    out = {"cpu_per_byte_s": float(np.median(per_byte)), "rate_Bps": float(np.median(rates)),
           "send_cpu_per_byte_s": ends[0] if rank == 0 else None, "recv_cpu_per_byte_s": ends[1] if rank == 0 else None,
           "samples": [float(x) for x in per_byte]}
    return comm.bcast(out if rank == 0 else None, root=0)


def profile_entry(stack: dict, wait_cpu_s: float | None, wait_poll_s: float | None) -> dict:
    """The probe's result as a profile's ``network_stack``: each end's own system time per byte less what
    the simulator already charges a rank that waits through the stream (``wait_cpu_s`` every
    ``wait_poll_s``, at the stream's rate), at least 0. The probe's ranks wait in the real backend's poll
    wait while the bytes move, so their system time holds those wake-ups too: at 100 Mb/s with 9000-byte
    frames it was what the wake-ups cost and no more (2.6 and 1.2 ns a byte on the star, 2.5 and 1.4 on the
    tree, against 2.6 and 2.4 for the polling), and the ranks of a ring there spent 0.057 s a rank and
    iteration where the polling alone was charged 0.060; with 1500-byte frames at 250 Mb/s, 5.0 and 3.3
    against 1.0."""
    out = {k: stack[k] for k in ("cpu_per_byte_s", "rate_Bps")}
    polling = (wait_cpu_s or 0.0) / wait_poll_s / stack["rate_Bps"] if wait_poll_s else 0.0
    for side in ("send_cpu_per_byte_s", "recv_cpu_per_byte_s"):
        if side in stack:
            out[side] = max(0.0, stack[side] - polling)
    return out
