"""Helper collectives built from isend/irecv/waitall, for use inside algorithms.

Each is a generator function: ``got = yield from allgather(ctx, block)``.
They move :class:`~simsparse.ops.Payload` objects, so an allgather of
variable-size sparse blocks is an allgatherv. Costs in the alpha-beta model
(``m`` = bytes of one block, all blocks equal, P a power of two):

* ``allgather_rd`` (recursive doubling, Thakur et al. 2005):
  ``log2(P) alpha + (P-1) m beta``;
* ``allgather_ring``: ``(P-1)(alpha + m beta)``;
* ``bcast_binomial`` (MPICH short-message bcast): ``ceil(log2 P)(alpha + m beta)``.

Non-powers of two are handled as MPICH does for allreduce: the first
``2*rem`` ranks (``rem = P - pof2``) pair up, the even one hands its data to
the odd one, ``pof2`` ranks run the power-of-two algorithm, and the odd ones
hand the result back (:class:`Fold`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ops import Bundle
from .base import pof2_floor


def sendrecv(ctx, dst, payload, src, tag=0):
    """Send to ``dst`` and receive from ``src`` concurrently; returns what arrived."""
    r = ctx.irecv(src, tag)
    s = ctx.isend(dst, payload, tag)
    got, _ = yield ctx.waitall([r, s])
    return got


def send(ctx, dst, payload, tag=0):
    yield ctx.waitall([ctx.isend(dst, payload, tag)])


def recv(ctx, src, tag=0):
    (got,) = yield ctx.waitall([ctx.irecv(src, tag)])
    return got


@dataclass(frozen=True)
class Fold:
    """MPICH's reduction of P ranks to the largest power of two ``pof2``."""

    P: int
    pof2: int = field(init=False)
    rem: int = field(init=False)

    def __post_init__(self):   # computed once: folding steps ask for them per message
        object.__setattr__(self, "pof2", pof2_floor(self.P))
        object.__setattr__(self, "rem", self.P - self.pof2)

    def newrank(self, rank: int) -> int:
        """Rank among the pof2 participants, or -1 for a folded-away even rank."""
        if rank < 2 * self.rem:
            return -1 if rank % 2 == 0 else rank // 2
        return rank - self.rem

    def real(self, newrank: int) -> int:
        return 2 * newrank + 1 if newrank < self.rem else newrank + self.rem

    def ranks_of(self, newrank: int) -> list[int]:
        """The original ranks a participant stands for after folding."""
        return [2 * newrank, 2 * newrank + 1] if newrank < self.rem else [newrank + self.rem]


def allgather_rd(ctx, block, tag=0):
    """Recursive-doubling allgather(v): returns the P blocks in rank order.
    In step j each participant exchanges everything gathered so far with
    the partner at distance 2^j (a :class:`Bundle`)."""
    P, r = ctx.size, ctx.rank
    if P == 1:
        return [block]
    f = Fold(P)
    have = {r: block}
    if r < 2 * f.rem:
        if r % 2 == 0:
            yield from send(ctx, r + 1, block, tag)
        else:
            have[r - 1] = yield from recv(ctx, r - 1, tag)
    nr = f.newrank(r)
    if nr >= 0:
        mask = 1
        while mask < f.pof2:
            pnr = nr ^ mask
            peer = f.real(pnr)
            mine = Bundle(tuple(have[q] for q in sorted(have)))
            got = yield from sendrecv(ctx, peer, mine, peer, tag)
            lo = pnr & ~(mask - 1)
            peer_ranks = [q for g in range(lo, lo + mask) for q in f.ranks_of(g)]
            for q, part in zip(peer_ranks, got.parts):
                have[q] = part
            mask <<= 1
    if r < 2 * f.rem:
        if r % 2 == 1:
            others = tuple(have[q] for q in range(P) if q != r - 1)
            yield from send(ctx, r - 1, Bundle(others), tag)
        else:
            got = yield from recv(ctx, r + 1, tag)
            rest = [q for q in range(P) if q != r]
            for q, part in zip(rest, got.parts):
                have[q] = part
    return [have[q] for q in range(P)]


def allgather_ring(ctx, block, tag=0):
    """Ring allgather(v): P-1 steps, each forwarding the block received last."""
    P, r = ctx.size, ctx.rank
    have = [None] * P
    have[r] = block
    right, left = (r + 1) % P, (r - 1) % P
    for s in range(P - 1):
        have[(r - s - 1) % P] = yield from sendrecv(ctx, right, have[(r - s) % P], left, tag)
    return have


ALLGATHERS = {"rd": allgather_rd, "ring": allgather_ring}


def allgather(ctx, block, algorithm="rd", tag=0):
    """Allgather(v) of payloads by the named algorithm (``rd`` or ``ring``)."""
    return (yield from ALLGATHERS[algorithm](ctx, block, tag))


def bcast_binomial(ctx, payload, root=0, tag=0):
    """MPICH binomial-tree broadcast; non-roots pass ``None`` and get the payload."""
    P, r = ctx.size, ctx.rank
    rel = (r - root) % P
    mask = 1
    while mask < P:
        if rel & mask:
            payload = yield from recv(ctx, (r - mask) % P, tag)
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if rel + mask < P:
            sends.append(ctx.isend((r + mask) % P, payload, tag))
        mask >>= 1
    if sends:
        yield ctx.waitall(sends)
    return payload


def alltoall(ctx, blocks, tag=0, throttle=None):
    """Personalised all-to-all: ``blocks[j]`` goes to rank j (``blocks[r]`` stays);
    returns the P blocks addressed to this rank, by source.

    Rotated schedule: step i sends to (r+i) mod P and receives from (r-i) mod P,
    so every step is a permutation (no endpoint is a hot spot). With
    ``throttle = t`` at most t steps are in flight (one waitall per batch), as
    in the Ok-Topk code (t = min(4, P)); ``None`` posts all at once.
    Cost: (P-1) alpha + (sum of sent bytes) beta per rank."""
    P, r = ctx.size, ctx.rank
    got = [None] * P
    got[r] = blocks[r]
    t = max(1, P - 1) if not throttle else max(1, int(throttle))
    for start in range(1, P, t):
        steps = range(start, min(P, start + t))
        recvs = [ctx.irecv((r - i) % P, tag) for i in steps]
        sends = [ctx.isend((r + i) % P, blocks[(r + i) % P], tag) for i in steps]
        vals = yield ctx.waitall(recvs + sends)
        for i, v in zip(steps, vals):
            got[(r - i) % P] = v
    return got
