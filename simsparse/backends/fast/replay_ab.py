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
  (backfilling), forgotten as ``_Port.book`` forgets them;
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

GO, MOVE, DONE_S, RESUME, DONE_R = 0, 1, 2, 3, 4   # DONE_*: a step's last message arrived

# The helpers of :func:`replay` are compiled on their own (LLVM still inlines them: ``inline="always"``
# made numba type and lower ``transfer`` at each of its call sites, 19 s of compiling in a fresh clone
# for the same speed).
@njit
def fit(PS, PE, p, lo, n, last, t, d):
    """Earliest t' >= t with [t', t' + d) free (``_Port.fit``) among port p's
    intervals lo..n-1 (row p of PS and PE: sorted, disjoint, so their ends
    ascend too; indexed in place, as a row view costs reference counting)."""
    if t >= last:
        return t
    i = lo
    while i < n and PE[p, i] <= t:   # those over by t
        i += 1
    if i < n and PS[p, i] <= t:      # the one under way at t
        t = PE[p, i]
        i += 1
    while i < n and PS[p, i] < t + d:
        if PE[p, i] > t:
            t = PE[p, i]
        i += 1
    return t


@njit
def room(PS, PE, plo, pn, ports, now):
    """Space for one more interval in the rows of ``ports``: the intervals
    over by ``now`` are dropped (every later fit asks from ``now`` on, so
    none can meet them) and the row compacted; every row doubled when
    nothing can go. Returns the storage (a new one only when it grew)."""
    for p in ports:
        lo, n = plo[p], pn[p]
        if n < PS.shape[1]:
            continue
        while lo < n and PE[p, lo] <= now:
            lo += 1
        if lo > 0:
            for j in range(n - lo):
                PS[p, j], PE[p, j] = PS[p, lo + j], PE[p, lo + j]
            plo[p], pn[p] = 0, n - lo
        else:
            PS2, PE2 = np.empty((PS.shape[0], 2 * n)), np.empty((PS.shape[0], 2 * n))
            for q in range(PS.shape[0]):   # (loops: numba took seconds to compile each slice assignment)
                for j in range(n):
                    PS2[q, j], PE2[q, j] = PS[q, j], PE[q, j]
            PS, PE = PS2, PE2
    return PS, PE


@njit
def book(PS, PE, plo, pn, plast, p, t, d, now):
    """``_Port.book`` on port p (row p of PS and PE holds its intervals
    plo[p]..pn[p]-1, with room for one more): those over by ``now`` are
    forgotten, [t, t + d) goes in after those starting at or before t."""
    lo, n = plo[p], pn[p]
    while lo < n and PE[p, lo] <= now:
        lo += 1
    if t >= plast[p]:
        PS[p, n], PE[p, n] = t, t + d
        plast[p] = t + d
    else:
        i = n
        while i > lo and PS[p, i - 1] > t:
            PS[p, i], PE[p, i] = PS[p, i - 1], PE[p, i - 1]
            i -= 1
        PS[p, i], PE[p, i] = t, t + d
    plo[p], pn[p] = lo, n + 1


@njit
def transfer(m, firm, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast,
             chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d, border, nbook, heap, seq,
             unbooked, last_t, last_s):
    """``bulk_transfer``: book message m's ports and note its arrival at its
    two steps; returns (sequence, whether the booking order is the event
    path's). Its ports have room (:func:`room`)."""
    s, q = np.int64(msrc[m]), P + np.int64(mdst[m])   # (int64: one compiled fit and book)
    d = mdur[m]
    ok = True
    if plast[s] <= now and plast[q] <= now:
        t1 = now
    else:
        own = fit(PS, PE, s, plo[s], pn[s], plast[s], now, d)
        tt = now
        while True:   # alternate until both ports agree on a start
            t1 = fit(PS, PE, s, plo[s], pn[s], plast[s], tt, d)
            t2 = fit(PS, PE, q, plo[q], pn[q], plast[q], t1, d)
            if t2 == t1:
                break
            tt = t2
        if t1 != own:   # (looked up at the current time only: one (time, sender) per receiver)
            ok = tied_t[mdst[m]] != now or tied_s[mdst[m]] == s
        elif own != now:
            ok = chain_set[s] and (chain_t[s] < now or (chain_t[s] == now and chain_firm[s] and firm))
    if d > 0:
        book(PS, PE, plo, pn, plast, s, t1, d, now)
        book(PS, PE, plo, pn, plast, q, t1, d, now)
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
    return seq, ok


@njit
def replay(P, entry, order, device, msrc, mdst, mnb, sitem, ritem,
           soff, seqmap, items, dt, waits, rv_idx, dur_dt,
           port_off, port_st, port_en, port_last, mdur, eager, window, rtt):
    nitems = len(items)
    t = entry.copy()
    dev = device.copy()
    busy = np.zeros(P)
    exact_dev = True
    exact_net = True
    yes, no = np.bool_(True), np.bool_(False)   # (not literals, as seq: one compiled transfer for every call)
    # ports (0..P-1 send, P..2P-1 receive): row p holds port p's pn[p] busy intervals
    pn = port_off[1:] - port_off[:-1]
    plo = np.zeros(2 * P, dtype=pn.dtype)
    cap = 32
    for p in range(2 * P):   # (a loop: numba's array max compiles for 0.3 s)
        cap = max(cap, pn[p])
    cap *= 2
    PS, PE = np.empty((2 * P, cap)), np.empty((2 * P, cap))
    plast = port_last.copy()
    for p in range(2 * P):
        a, b = port_off[p], port_off[p + 1]
        for j in range(b - a):
            PS[p, j], PE[p, j] = port_st[a + j], port_en[a + j]
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
            PS, PE = room(PS, PE, plo, pn, (np.int64(msrc[a]), P + np.int64(mdst[a])), now)
            seq, ok = transfer(a, b == 1, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast, chain_t,
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
                        PS, PE = room(PS, PE, plo, pn, (np.int64(msrc[m]), P + np.int64(mdst[m])), now)
                        seq, ok = transfer(m, no, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast,
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
                    PS, PE = room(PS, PE, plo, pn, (np.int64(msrc[m]), P + np.int64(mdst[m])), now)
                    seq, ok = transfer(m, yes, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast,
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
