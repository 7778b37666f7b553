"""Lockstep rounds: a value-free schedule evaluated in bulk, giving the event
simulation's times, bytes and event count exactly, or nothing at all.

Some schedules are a sequence of *rounds*. In each round, every rank posts
at most one receive and one send, waits for both, and runs one kernel on
what it received. The ring is one: in step s, rank r sends block
(r - s) mod P to r + 1, receives block (r - s - 1) mod P from r - 1 and adds
it. Such a schedule is given as
:attr:`Algorithm.rounds <simsparse.algorithms.base.Algorithm.rounds>`:
``rounds(P, n)`` yields, per round, ``(dst, count, kernel)``:
* ``dst[r]`` is rank r's destination (-1: no send);
* ``count[r]`` is the number of elements it sends;
* ``kernel`` is what the receiver runs on the received block, as
  ``kernel(own block, received block)``, or None.

A *local step* ``(None, count, kernel)`` has every rank run
``kernel(vector of count elements)``. The rounds come from the same step
functions as the algorithm's generator, so the two cannot drift apart.

A round is then a few numpy operations over P ranks instead of 2P events.
The model is :class:`~simsparse.backends.events.sim.Simulator`'s:

* a rank enters a round at its time t_r and posts its receive and send then;
* a send starts moving as :class:`~simsparse.backends.protocol.Protocol`
  says: at the sender's t within the receiver's window, else at
  max(t_sender, t_receiver); plus the handshake's round trip past the eager
  threshold;
* the network model's ``bulk_wave`` gives every message's arrival as its
  ``transfer`` would (:mod:`simsparse.backends.fast.bulk`);
* a rank leaves the round when its send and its receive are both complete,
  then runs the kernel for the seconds the simulator's device charges
  (``Simulator.kernel_seconds``). Its device is idle then: the program
  waits for every kernel it runs.

The path is exact only while no message waits for another. A port or link
still busy from an earlier message would make the event simulation queue or
share it. So the rounds give up (None) as soon as ``bulk_wave`` says one
message of a round would not find its port (alpha-beta) or all its links
(flow level) idle. The check is conservative: a resource used out of round
order also counts as a conflict. The caller then runs the event simulation,
so results never depend on which path ran.

Events are counted as the engines count them:
* one per arrival;
* one per rendezvous handshake (round trip > 0);
* one per rank per round it waits in;
* one per kernel that takes time.

``tests/backends/test_rounds.py`` compares rows and event counts with SimPy.
"""
from __future__ import annotations

import numpy as np

from ...compute.kernels import get_kernel, phantom
from ..driver import IterationStats
from ..protocol import run_kernels


def run_rounds(sim, P: int, rounds, dtype) -> IterationStats | None:
    """Evaluate ``rounds`` (module docstring) for P ranks on the network
    (reset to idle), device and protocol of ``sim`` (a
    :class:`~simsparse.backends.events.sim.Simulator`); None if the network has no
    bulk path or a message would wait."""
    network = sim.network
    network.reset(None, P)
    if "arrays" not in network.capabilities(P):
        return None
    network.bulk_start(P, keep=False)   # (the rounds time the whole point: nothing comes after)
    itemsize = np.dtype(dtype).itemsize
    pr = sim.protocol
    seconds = _KernelTimes(sim, dtype)
    t = np.zeros(P)   # each rank's time, and when its device is free: its program waits for every kernel
    busy = np.zeros(P)
    sent = np.zeros(P, dtype=np.int64)
    msgs = np.zeros(P, dtype=np.int64)
    events = 0
    active = np.zeros(P, dtype=bool)
    for dst, count, kernel in rounds:
        if dst is None:   # a local step: every rank runs the kernel on count elements
            events += run_kernels(t, t, busy, np.arange(P), seconds(kernel, np.broadcast_to(count, P), 1))
            continue
        src = np.flatnonzero(dst >= 0)
        if not len(src):
            continue
        to = dst[src]
        if np.bincount(to, minlength=P).max() > 1:
            raise ValueError("a round sends two messages to one rank; rounds allow one receive per rank")
        nb = count[src].astype(np.int64) * itemsize
        if sim.byte_scale != 1.0:
            nb = np.rint(nb * sim.byte_scale).astype(np.int64)   # round half to even, as round() in isend
        start, firm = pr.ready(nb, t[src], t[to])
        events += int(np.count_nonzero(pr.handshake(nb)))   # a handshake is an event
        arrival, exact = network.bulk_wave(start, src, to, nb, np.zeros(len(src), dtype=np.intp), firm)
        if not exact:
            return None
        t[src] = np.maximum(t[src], arrival)
        t[to] = np.maximum(t[to], arrival)
        sent[src] += nb
        msgs[src] += 1
        active[:] = False
        active[src] = True
        active[to] = True
        events += len(src) + int(active.sum())
        if kernel is not None:   # the receivers reduce or copy what they got
            events += run_kernels(t, t, busy, to, seconds(kernel, count[src], 2))
    busy_of = [{"forward": 0.0, "backward": 0.0, "compute": b} for b in busy.tolist()]
    return IterationStats(t.tolist(), [None] * P, sent.tolist(), msgs.tolist(), events, [], busy_of, "bulk")


class _KernelTimes:
    """Device seconds of a kernel on blocks of given lengths (size-only
    vectors), asked of the simulator once per kernel and length."""

    def __init__(self, sim, dtype):
        self.sim, self.dtype, self.known = sim, dtype, {}

    def __call__(self, kernel: str, lengths, arity: int):
        if self.sim.ideal:
            return np.zeros(len(lengths))
        lo, hi = int(lengths.min()), int(lengths.max())
        if hi - lo < 2:   # (balanced blocks: one or two lengths; np.unique sorted P lengths a round, 1 s at P = 4096)
            return np.where(lengths == lo, self._seconds(kernel, lo, arity), self._seconds(kernel, hi, arity))
        uniq, inv = np.unique(lengths, return_inverse=True)
        return np.array([self._seconds(kernel, m, arity) for m in uniq.tolist()])[inv]

    def _seconds(self, kernel: str, m: int, arity: int) -> float:
        key = (kernel, m, arity)
        if key not in self.known:
            k = get_kernel(kernel)
            args = (phantom(m, self.dtype),) * arity
            self.known[key] = self.sim.kernel_seconds(k, k.numpy(*args), args, {})
        return self.known[key]
