"""The point-to-point patterns ``simsparse calibrate`` times: rank programs
of the contract, so the real backend measures them (:mod:`.worker`) and the
simulator predicts them with the fitted profile (:func:`predict`): every
profile carries, per pattern, the measurement beside the model's time.

Each program returns its own figure on the rank that measures it (else
None): ``pingpong`` the half round trip; ``exchange`` (both directions at
once, a ring step) the time per exchange; ``window`` the per-message time at
the receiver of back-to-back sends; ``pairs`` every rank streaming to rank
r xor 1; ``crossing`` every rank streaming to the rank half the machine away
(on a tree, across the uplinks its leaf's hosts share, in both directions);
``incast`` every rank sending to rank 0 at once.
"""
from __future__ import annotations

import time


def pingpong(ctx, make, reps):
    r = ctx.rank
    if r > 1:
        return None
    peer = 1 - r
    t0 = ctx.now()
    for _ in range(reps):
        if r == 0:
            yield ctx.waitall([ctx.isend(peer, make())])
            yield ctx.waitall([ctx.irecv(peer)])
        else:
            yield ctx.waitall([ctx.irecv(peer)])
            yield ctx.waitall([ctx.isend(peer, make())])
    return (ctx.now() - t0) / reps / 2


def window(ctx, make, count):
    """Rank 0 posts ``count`` sends at once to rank 1: per-message time at the
    receiver (g for small messages), and the sender's posting time (o)."""
    r = ctx.rank
    if r == 0:
        t0 = time.perf_counter()
        hs = [ctx.isend(1, make()) for _ in range(count)]
        post = (time.perf_counter() - t0) / count
        yield ctx.waitall(hs)
        return post
    if r == 1:
        t0 = ctx.now()
        yield ctx.waitall([ctx.irecv(0) for _ in range(count)])
        return (ctx.now() - t0) / count
    return None


#: the exchange's steps per timing (.worker): a short run, as the suite's collectives are, and, for
#: sizes up to STEADY_MAX_B, a long one whose steps are mostly past the run's first (network.request_cpu)
EXCHANGE_STEPS, STEADY_STEPS, STEADY_MAX_B = 3, 24, 1024


def exchange(ctx, make, reps):
    """Ranks r and r xor 1 send each other a message at once and wait for
    both, ``reps`` times (MPI_Sendrecv): a step of a ring or recursive
    doubling, which moves both directions together (on one host: through
    one memory bus)."""
    peer = ctx.rank ^ 1
    if peer >= ctx.size:
        return None
    t0 = ctx.now()
    for _ in range(reps):
        yield ctx.waitall([ctx.irecv(peer), ctx.isend(peer, make())])
    return (ctx.now() - t0) / reps


def alltoall(ctx, make, reps):
    """Every rank posts a receive from and a send to every other rank and
    waits for all 2(P - 1) of them, ``reps`` times: as many requests behind
    one wait as a split or an all-to-all has, against the exchange's two (what
    a request costs and what a wake-up costs, :func:`..network.request_cpu`)."""
    peers = [p for p in range(ctx.size) if p != ctx.rank]
    t0 = ctx.now()
    for _ in range(reps):
        yield ctx.waitall([ctx.irecv(p) for p in peers] + [ctx.isend(p, make()) for p in peers])
    return (ctx.now() - t0) / reps


def pairs(ctx, make, count):
    """Every rank streams ``count`` messages to its partner (r xor 1)."""
    peer = ctx.rank ^ 1
    if peer >= ctx.size:
        return None
    return (yield from _stream(ctx, peer, make, count))


def crossing(ctx, make, count):
    """Every rank streams ``count`` messages to the rank P/2 away and receives
    as many from it: recursive doubling's farthest step. On a tree every
    flow crosses its leaf's uplinks, shared by the leaf's hosts, with the
    reverse flows' data and acknowledgements in the same queues."""
    half = ctx.size // 2
    if ctx.rank >= 2 * half:
        return None
    peer = ctx.rank + half if ctx.rank < half else ctx.rank - half
    return (yield from _stream(ctx, peer, make, count))


def _stream(ctx, peer, make, count):
    """``count`` messages to ``peer`` and as many from it, all at once: the time per message."""
    t0 = ctx.now()
    hs = [ctx.isend(peer, make()) for _ in range(count)] + [ctx.irecv(peer) for _ in range(count)]
    yield ctx.waitall(hs)
    return (ctx.now() - t0) / count


def incast(ctx, make):
    if ctx.rank == 0:
        t0 = ctx.now()
        yield ctx.waitall([ctx.irecv(s) for s in range(1, ctx.size)])
        return ctx.now() - t0
    yield ctx.waitall([ctx.isend(0, make())])
    return None


def simulate(spec, device, P: int, program):
    """``program`` (a factory ``ctx -> generator`` whose payloads hold numpy
    arrays) on every rank of network ``spec``: per rank, its result and the
    time it finished (the simulator's own run of what :mod:`.worker` times)."""
    from ..backends.events.sim import Simulator

    sim = Simulator(spec.build(), device, **spec.protocol())
    stats = sim.run([program] * P)
    return stats.results, stats.finish_s
