"""The alpha-beta network's ports on arrays, for the compiled evaluations.

``AlphaBetaNetwork``'s ``_Port`` (:mod:`simsparse.network.alphabeta`)
keeps each port's busy intervals in lists; the compiled replay
(:mod:`.replay_ab`) and the waves (:mod:`.waves_ab`) keep port p's as row p
of ``PX``, (start, end) pairs side by side (one cache line where two arrays
were two), from ``plo[p]`` to ``pn[p] - 1``, sorted and disjoint (so their
ends ascend too), and ``plast[p]`` the end of the last. The two functions
are ``_Port.fit`` and ``_Port.book`` on that layout, plain Python that
compiled code calls too (:func:`simsparse.jit.jitable`).
"""
from __future__ import annotations

import numpy as np

from ... import jit


class Rows:
    """The network's port intervals (``bulk_ports``) as rows of ``PX``: send
    ports 0..P-1, receive ports P..2P-1, or the ports of ``label`` in its
    order; ``held``: each row's last end booked here."""

    def __init__(self, net, P: int, label: np.ndarray | None = None):
        off, st, en, last = net.bulk_ports()
        n = np.diff(off)
        label = np.arange(2 * P) if label is None else label
        cap = 2 * max(int(n.max()) if len(n) else 0, 16)
        self.PX = np.empty((2 * P, cap, 2))
        row = np.empty(2 * P, dtype=np.int64)
        row[label] = np.arange(2 * P)
        port = np.repeat(np.arange(2 * P), n)   # each interval's port, and its place there
        self.PX[row[port], np.arange(len(port)) - off[port]] = np.stack((st, en), axis=1)
        self.plo, self.pn, self.plast = np.zeros(2 * P, dtype=np.int64), n[label].astype(np.int64), last[label].copy()
        self.held = np.full(2 * P, -np.inf)

    def rows(self, floor: float):
        """Each row's intervals that end after ``floor``: offsets, starts, ends."""
        PS, PE = self.PX[:, :, 0], self.PX[:, :, 1]
        j = np.arange(PS.shape[1])
        keep = (j >= self.plo[:, None]) & (j < self.pn[:, None]) & (PE > floor)
        off = np.zeros(len(self.plo) + 1, dtype=np.int64)
        off[1:] = np.cumsum(keep.sum(axis=1))
        return off, PS[keep], PE[keep]


@jit.jitable(inline="always")
def fit(PX, plo, pn, plast, p, t, d):
    """``_Port.fit`` on row p: the earliest t' >= t with [t', t' + d) free."""
    if t >= plast[p]:
        return t
    i, n = plo[p], pn[p]
    hi = n   # the first interval ending after t (ends ascend): a binary search
    while i < hi:
        mid = (i + hi) >> 1
        if PX[p, mid, 1] <= t:
            i = mid + 1
        else:
            hi = mid
    if i < n and PX[p, i, 0] <= t:   # the one under way at t
        t = PX[p, i, 1]
        i += 1
    while i < n and PX[p, i, 0] < t + d:
        if PX[p, i, 1] > t:
            t = PX[p, i, 1]
        i += 1
    return t


@jit.jitable(inline="always")
def book(PX, plo, pn, plast, p, t, d, floor, touch):
    """``_Port.book`` of [t, t + d) on row p, after those starting at or
    before t; the intervals over by ``floor`` (no later booking asks before
    it) are forgotten. A full row is compacted, or every row doubled when
    nothing in it is over. With ``touch``, a booking that touches its
    neighbours joins them: the same free time for any message that takes
    time (one of no duration could start where two touched), and at
    P = 4096 rows of half the length. Returns the storage (a new array only
    when it grew)."""
    end = t + d
    lo, n = plo[p], pn[p]
    while lo < n and PX[p, lo, 1] <= floor:
        lo += 1
    if n == PX.shape[1]:
        if lo > 0:
            for j in range(n - lo):
                PX[p, j, 0], PX[p, j, 1] = PX[p, lo + j, 0], PX[p, lo + j, 1]
            n, lo = n - lo, 0
        else:
            PX2 = np.empty((PX.shape[0], 2 * n, 2))   # (loops: numba compiles a slice assignment in seconds)
            for a in range(PX.shape[0]):
                for j in range(n):
                    PX2[a, j, 0], PX2[a, j, 1] = PX[a, j, 0], PX[a, j, 1]
            PX = PX2
    i = n
    while i > lo and PX[p, i - 1, 0] > t:
        i -= 1
    if touch and i > lo and PX[p, i - 1, 1] == t:   # touches the one before: extend it
        if i < n and PX[p, i, 0] == end:   # and the one after: the two become one
            PX[p, i - 1, 1] = PX[p, i, 1]
            for j in range(i, n - 1):
                PX[p, j, 0], PX[p, j, 1] = PX[p, j + 1, 0], PX[p, j + 1, 1]
            n -= 1
        else:
            PX[p, i - 1, 1] = end
    elif touch and i < n and PX[p, i, 0] == end:   # touches the one after
        PX[p, i, 0] = t
    else:
        for j in range(n, i, -1):
            PX[p, j, 0], PX[p, j, 1] = PX[p, j - 1, 0], PX[p, j - 1, 1]
        PX[p, i, 0], PX[p, i, 1] = t, end
        n += 1
    if end > plast[p]:
        plast[p] = end
    plo[p], pn[p] = lo, n
    return PX
