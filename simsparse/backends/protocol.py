"""The MPI semantics every evaluator applies, written once.

Every way of timing a point (the event engine, the lockstep rounds, the
bulk arrays, the replays in Python and compiled, the waves) reads these
rules from here:

* **eager, window, rendezvous** (:class:`Protocol`): a message of at most
  ``window_B`` bytes moves when it is sent -- eager (at most ``eager_B``) or
  buffered by the receiver's transport (TCP sockets: the receive window);
  a larger one waits until its receive is posted (:func:`gated`). Every
  message past ``eager_B`` first pays the RTS/CTS round trip ``rdv_rtt_s``
  (:func:`handshake`). Cost: a message ready at ``t`` starts moving at
  ``t + handshake``; ``t`` is its post, or with :func:`gated` the later of
  its post and its receive's.
* **posting order**: matching by (source, destination, tag) in posting
  order (MPI's non-overtaking rule); among a sender's messages ready at the
  same time, the one posted first is booked first (:meth:`Protocol.ready`'s
  ``firm``).
* **the FIFO device** (:func:`fifo`): a rank's kernels, forward and
  backward run one after another in issue order; one issued at ``now``
  starts when everything issued before it has ended (``free``) and takes
  ``dt``; the program waiting for it resumes at ``now + (end - now)``, the
  clock of an engine that adds a delay (:func:`resumed`); a program's
  kernel step on it (:func:`run_kernel`, :func:`run_kernels`).
* **delivery** (:func:`freeze`): a receiver gets a read-only copy of what
  was sent, shared by every receiver of the same block.

The scalar rules are plain functions that compiled code calls too
(:func:`simsparse.jit.jitable`): one source for both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import jit
from ..ops import Dense, Payload, Scalars


@jit.jitable
def gated(nbytes, window_B):
    """Whether a message of ``nbytes`` (a number or an array) waits for its
    receive to be posted before it moves (past the receiver's window)."""
    return nbytes > window_B


@jit.jitable
def handshake(nbytes, eager_B, rdv_rtt_s):
    """The rendezvous round trip a message of ``nbytes`` pays before it
    moves: ``rdv_rtt_s`` past the eager threshold, else 0 (numbers or arrays)."""
    return (nbytes > eager_B) * rdv_rtt_s


@jit.jitable
def device_start(free: float, now: float) -> float:
    """When work issued at ``now`` starts on a FIFO device busy until
    ``free`` with what was issued before it."""
    return free if free > now else now


@jit.jitable
def fifo(free: float, now: float, dt: float) -> float:
    """When a kernel of ``dt`` seconds issued at ``now`` ends on a FIFO
    device busy until ``free`` (:func:`device_start` plus ``dt``)."""
    return device_start(free, now) + dt


@jit.jitable
def resumed(now: float, end: float) -> float:
    """The engine's clock when a program that waited from ``now`` until
    ``end`` resumes (a delay added to now)."""
    return now + (end - now)


def fifo_all(free: np.ndarray, now: np.ndarray, dt: np.ndarray) -> np.ndarray:
    """:func:`fifo` for arrays of ranks, elementwise."""
    return np.where(free > now, free, now) + dt


@jit.jitable
def run_kernel(t, dev, busy, r, dt):
    """Rank r's program, at ``t[r]``, runs a kernel of ``dt`` seconds on its
    FIFO device (free from ``dev[r]``) and waits for it; ``busy[r]`` counts
    the device's seconds. Whether the device was busy with work issued
    before (where an evaluation that queues kernels at once may differ from
    the events)."""
    now = t[r]
    was = dev[r] > now
    end = fifo(dev[r], now, dt)
    if dt > 0:
        busy[r] += dt
    if end > now:
        dev[r] = end
        t[r] = resumed(now, end)
    return was


def run_kernels(t, dev, busy, ranks, dts) -> int:
    """:func:`run_kernel` for arrays of ranks (no rank twice) and seconds; how
    many of them waited (an event each)."""
    now = t[ranks]
    end = fifo_all(dev[ranks], now, dts)
    busy[ranks] += np.where(dts > 0, dts, 0.0)
    adv = end > now
    r = ranks[adv]
    dev[r] = end[adv]
    t[r] = resumed(now[adv], end[adv])
    return len(r)


@dataclass(frozen=True)
class Protocol:
    """The MPI protocol settings of a network (``NetworkSpec.protocol``):
    the eager threshold, the receiver's window (at least the eager
    threshold) and the rendezvous round trip."""

    eager_B: int = 65536
    window_B: int = 65536
    rdv_rtt_s: float = 0.0

    @classmethod
    def of(cls, eager_threshold_B: int = 65536, rendezvous_rtt_s: float = 0.0,
           unexpected_window_B: int | None = None) -> "Protocol":
        """From a network spec's keys; the window is never below the eager threshold."""
        eager = int(eager_threshold_B)
        window = max(eager, int(unexpected_window_B)) if unexpected_window_B is not None else eager
        return cls(eager, window, float(rendezvous_rtt_s))

    def gated(self, nbytes):
        return gated(nbytes, self.window_B)

    def handshake(self, nbytes):
        return handshake(nbytes, self.eager_B, self.rdv_rtt_s)

    @property
    def scalars(self) -> tuple:
        """(eager_B, window_B, rdv_rtt_s) as floats, for compiled code."""
        return float(self.eager_B), float(self.window_B), float(self.rdv_rtt_s)

    def ready(self, nbytes, post_s, post_r):
        """Arrays of messages posted by their senders at ``post_s`` and their
        receives at ``post_r``: when each starts moving, and whether the
        event engine books it in posting order among its sender's messages
        ready at the same time (``firm``: it moved when sent, or its
        receive came first)."""
        g = self.gated(nbytes)
        ready = np.where(g, np.maximum(post_s, post_r), post_s) if g.any() else post_s
        if self.rdv_rtt_s > 0:
            ready = ready + self.handshake(nbytes)
        return ready, ~g | (post_r <= post_s)


# -- delivery ----------------------------------------------------------------------------

def _freeze(a):
    """A read-only copy of a writable array; read-only arrays are shared."""
    if not a.flags.writeable:
        return a
    c = a.copy()
    c.setflags(write=False)
    return c


def freeze(p: Payload) -> Payload:
    """The payload as a receiver gets it: read-only, shared."""
    if type(p) is Dense:
        return p if not p.values.flags.writeable else Dense(_freeze(p.values))
    if type(p) is Scalars:   # (Ok-Topk's counts: P^2 a call, already read-only)
        return p if not p.values.flags.writeable else Scalars(_freeze(p.values))
    return p.map(_freeze)


class Gathered(tuple):
    """The blocks an allgather hands every rank: one read-only tuple that all
    ranks hold, so memoised kernels key it by identity (``events.memo``)
    instead of hashing its P blocks' contents once per allgather (3.5 s at
    P = 4096 for Ok-Topk's ``coo_concat``)."""

    __slots__ = ()
