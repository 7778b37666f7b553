"""The bulk replay on the alpha-beta network, compiled with numba.

:meth:`simsparse.backends.fast.timing.BulkTiming._replay` times a collective whose
messages wait for ports by replaying it on a scratch copy of the network
with a private engine: about 15 us a message in Python, so Ok-Topk's split
and reduce (P^2 messages) took minutes at P = 4096. This is the same replay
for :class:`~simsparse.network.alphabeta.AlphaBetaNetwork`, statement for
statement, on arrays:

* the engine: one heap of (time, sequence, event), which orders calls as
  :class:`~simsparse.engine.HeapEngine` does (its FIFO of zero-delay calls
  holds only calls due now, in sequence order); every time is computed by
  the same floating-point expression as there (``now + (end - now)``);
  of the arrival events only the one that ends a step's wait is pushed, at
  its own (time, sequence) (:func:`transfer`);
* the ports: each port's busy intervals sorted, booked by the earliest fit
  (backfilling) as ``_Port`` books them (:mod:`.ports`);
* the ranks: each one's steps (a wave, or a kernel of known seconds), its
  kernels between posting a wave and waiting for it, the eager, window and
  rendezvous rules, and the exactness tests of ``bulk_transfer``.

The Python replay stays the reference (the evaluator ``replay_py``); the
differential tests run both on a grid and require identical times, order
and flags.
"""
from __future__ import annotations

import heapq

import numpy as np

from ...jit import njit
from ..protocol import gated, handshake, run_kernel
from .ports import book, fit

GO, MOVE, DONE_S, RESUME, DONE_R = 0, 1, 2, 3, 4   # DONE_*: a step's last message arrived

# The helpers of :func:`replay` are compiled on their own (LLVM still inlines them: ``inline="always"``
# made numba type and lower ``transfer`` at each of its call sites, 19 s of compiling in a fresh clone
# for the same speed).
@njit
def transfer(m, firm, now, P, msrc, mdst, mdur, sitem, ritem, PX, plo, pn, plast,
             chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d, border, nbook, heap, seq,
             unbooked, last_t, last_s):
    """``bulk_transfer``: book message m's ports (:mod:`.ports`) and note its
    arrival at its two steps; returns (the port storage, sequence, whether
    the booking order is the event path's)."""
    s, q = np.int64(msrc[m]), P + np.int64(mdst[m])   # (int64: one compiled fit and book)
    d = mdur[m]
    ok = True
    if plast[s] <= now and plast[q] <= now:
        t1 = now
    else:
        own = fit(PX, plo, pn, plast, s, now, d)
        tt = now
        while True:   # alternate until both ports agree on a start
            t1 = fit(PX, plo, pn, plast, s, tt, d)
            t2 = fit(PX, plo, pn, plast, q, t1, d)
            if t2 == t1:
                break
            tt = t2
        if t1 != own:   # (looked up at the current time only: one (time, sender) per receiver)
            ok = tied_t[mdst[m]] != now or tied_s[mdst[m]] == s
        elif own != now:
            ok = chain_set[s] and (chain_t[s] < now or (chain_t[s] == now and chain_firm[s] and firm))
    if d > 0:
        PX = book(PX, plo, pn, plast, s, t1, d, now, False)
        PX = book(PX, plo, pn, plast, q, t1, d, now, False)
        b = nbook[0]
        log_t1[b], log_d[b] = t1, d
        border[b] = m
        nbook[0] = b + 1
    chain_t[s], chain_firm[s], chain_set[s] = now, firm, True
    q = mdst[m]
    if tied_t[q] != now:
        tied_t[q], tied_s[q] = now, s
    elif tied_s[q] != s:
        tied_s[q] = -1
    mstart[m] = now
    seq += 1
    arr = now + (t1 + d - now)
    # The event path's wait of a step ends at the arrival event of its last message to arrive:
    # the latest (arrival, sequence) of its messages, known once all of them are booked (the
    # last one booked has the largest sequence and arrives now or later). One event per step
    # then, at that key, where an arrival event per message cost a heap push and pop each
    # (0.2 us a message at P = 2048); the other arrivals changed nothing but a count.
    for side in range(2):   # 0: its sender's step, 1: its receiver's (first at one arrival)
        it = np.int64(sitem[m]) if side == 0 else np.int64(ritem[m])
        if arr >= last_t[it]:   # (a later booking has the larger sequence)
            last_t[it], last_s[it] = arr, 2 * seq + side
        unbooked[it] -= 1
        if unbooked[it] == 0:
            heapq.heappush(heap, (last_t[it], last_s[it] >> 1, DONE_S + 2 * (last_s[it] & 1), it, 0, 0))
    return PX, seq, ok


@njit
def replay(P, entry, order, device, msrc, mdst, mnb, sitem, ritem,
           soff, seqmap, items, dt, waits, rv_idx, dur_dt,
           PX, plo, pn, plast, mdur, eager, window, rtt):
    nitems = len(items)
    t = entry.copy()
    dev = device.copy()
    busy = np.zeros(P)
    exact_dev = True
    exact_net = True
    yes, no = np.bool_(True), np.bool_(False)   # (not literals, as seq: one compiled transfer for every call)
    chain_t = np.full(P, -np.inf)
    chain_firm = np.zeros(P, dtype=np.bool_)
    chain_set = np.zeros(P, dtype=np.bool_)
    tied_t = np.full(P, -np.inf)           # per receiver: when the messages booked there last were ready
    tied_s = np.zeros(P, dtype=np.int64)   # and their sender (-1: several)
    # a step's fields side by side, one row each (one cache line, where separate arrays
    # were a miss each: the replay visits steps in an order no layout follows)
    kind, send_lo, send_hi, rv_lo, rv_hi = items[:, 0], items[:, 1], items[:, 2], items[:, 3], items[:, 4]
    dur_lo, dur_hi = items[:, 5], items[:, 6]
    state = np.zeros((nitems, 4), dtype=items.dtype)
    for j in range(nitems):
        state[j, 0], state[j, 3] = waits[j], items[j, 7]
    left, waiting, posted, item_rank = state[:, 0], state[:, 1], state[:, 2], state[:, 3]   # left: 0 once all arrived
    unbooked = waits.copy()                # per step: its messages not booked yet,
    last_t = np.full(nitems, -np.inf)      # and the latest arrival of those booked,
    last_s = np.zeros(nitems, dtype=np.int64)   # with 2 x its sequence + its side
    cursor = soff[:-1].copy()
    nm = len(msrc)
    mstart = np.zeros(nm)
    log_t1 = np.empty(nm)                  # what was booked, in booking order: start, duration, message
    log_d = np.empty(nm)
    border = np.empty(nm, dtype=msrc.dtype)
    nbook = np.zeros(1, dtype=np.int64)
    done = np.empty(P, dtype=np.int64)
    ndone = 0
    heap = [(0.0, 0, 0, 0, 0, 0)]
    heap.pop()
    seq = np.int64(0)
    for j in range(P):
        r = order[j]
        seq += 1
        heapq.heappush(heap, (0.0 + entry[r], seq, GO, r, 0, 0))
    while len(heap):
        ev = heapq.heappop(heap)
        now = ev[0]
        typ, a, b, c = ev[2], ev[3], ev[4], ev[5]
        if typ == MOVE:
            PX, seq, ok = transfer(a, b == 1, now, P, msrc, mdst, mdur, sitem, ritem, PX, plo, pn, plast, chain_t,
                               chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d, border, nbook, heap, seq,
                               unbooked, last_t, last_s)
            exact_net = ok and exact_net
            continue
        if typ == DONE_S or typ == DONE_R:   # step a's last message arrived
            left[a] = 0
            if waiting[a]:
                waiting[a] = 0
                seq += 1
                heapq.heappush(heap, (now, seq, GO, np.int64(item_rank[a]), 0, 0))
            continue
        r = a
        it, di = -1, 0
        if typ == GO:
            t[r] = now
        else:   # RESUME: a kernel between posting and waiting ended
            it, di = b, c
        while True:
            if it >= 0:   # settle: the kernels between posting and waiting, then the wait
                blocked = False
                while di < dur_hi[it] - dur_lo[it]:
                    x = dur_dt[dur_lo[it] + di]
                    di += 1
                    if run_kernel(t, dev, busy, r, x):
                        exact_dev = False
                    if t[r] > now:
                        seq += 1
                        heapq.heappush(heap, (now + (dev[r] - now), seq, RESUME, r, it, di))
                        blocked = True
                        break
                if blocked:
                    break
                if left[it]:
                    waiting[it] = 1
                    break
                it = -1
                t[r] = now
            if cursor[r] >= soff[r + 1]:   # the collective returns
                done[ndone] = r
                ndone += 1
                break
            j = seqmap[cursor[r]]   # (rank r's steps in order: soff[r] .. soff[r + 1] - 1)
            cursor[r] += 1
            if kind[j] == 1:   # a kernel
                if run_kernel(t, dev, busy, r, dt[j]):
                    exact_dev = False
                if t[r] > now:
                    seq += 1
                    heapq.heappush(heap, (now + (dev[r] - now), seq, GO, r, 0, 0))
                    break
                continue
            posted[j] = 1
            for x in range(rv_lo[j], rv_hi[j]):   # its receives past the window (protocol.gated)
                m = np.int64(rv_idx[x])
                if posted[sitem[m]]:   # a send held for this receive moves now (plus the handshake)
                    wait = handshake(mnb[m], eager, rtt)
                    if wait > 0:
                        seq += 1
                        heapq.heappush(heap, (now + wait, seq, MOVE, m, 0, 0))
                    else:
                        PX, seq, ok = transfer(m, no, now, P, msrc, mdst, mdur, sitem, ritem, PX, plo, pn, plast,
                                           chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d,
                                           border, nbook, heap, seq, unbooked, last_t, last_s)
                        exact_net = ok and exact_net
            for m in range(np.int64(send_lo[j]), np.int64(send_hi[j])):   # (messages numbered in posting order)
                if not gated(mnb[m], window) or posted[ritem[m]]:   # within the window, or its receive is posted
                    wait = handshake(mnb[m], eager, rtt)
                    if wait > 0:
                        seq += 1
                        heapq.heappush(heap, (now + wait, seq, MOVE, m, 1, 0))
                        continue
                    PX, seq, ok = transfer(m, yes, now, P, msrc, mdst, mdur, sitem, ritem, PX, plo, pn, plast,
                                       chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d,
                                       border, nbook, heap, seq, unbooked, last_t, last_s)
                    exact_net = ok and exact_net
            it, di = j, 0
    nb = nbook[0]
    held = np.full(2 * P, -np.inf)   # each port's last end booked here (np.maximum.at of the log)
    for b in range(nb):
        e = log_t1[b] + log_d[b]
        s, q = msrc[border[b]], P + mdst[border[b]]
        if e > held[s]:
            held[s] = e
        if e > held[q]:
            held[q] = e
    return t, dev, busy, done[:ndone], exact_dev, exact_net, mstart, border[:nb], log_t1[:nb], log_d[:nb], held
