"""The bulk replay on the alpha-beta network, compiled with numba.

:meth:`simsparse.backends.bulk_timing.BulkTiming._replay` times a collective whose
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

The Python replay stays the reference (``SIMSPARSE_NUMBA=0`` runs it); the
tests run both on a grid and require identical times, order and flags.
"""
from __future__ import annotations

import heapq

import numpy as np

from ..jit import enabled, numba

GO, MOVE, DONE_S, RESUME, DONE_R = 0, 1, 2, 3, 4   # DONE_*: a step's last message arrived

#: replays of fewer messages run in Python: compiling takes about 20 s once per installation
#: (cached after), a Python replay of 20,000 messages about 0.3 s
COMPILE_FROM = 20000


def compiled(messages: int | None = None):
    """The compiled replay, or None: no numba, ``SIMSPARSE_NUMBA=0``, or
    fewer than :data:`COMPILE_FROM` ``messages``."""
    if not enabled():
        return None
    if messages is not None and messages < COMPILE_FROM:
        return None
    return replay


def _njit(fn):
    return numba.njit(cache=True)(fn) if numba is not None else None


def _helper(fn):
    """A helper of :func:`replay`, compiled on its own (LLVM still inlines it:
    ``inline="always"`` made numba type and lower ``transfer`` at each of its
    call sites, 19 s of compiling in a fresh clone for the same speed)."""
    return numba.njit(cache=True)(fn) if numba is not None else None


@_helper
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


@_helper
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


@_helper
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


@_helper
def transfer(m, firm, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast,
             chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d, border, nbook, heap, seq,
             unbooked, last_t, last_s):
    """``bulk_transfer``: book message m's ports and note its arrival at its
    two steps; returns (sequence, whether the booking order is the event
    path's). Its ports have room (:func:`room`)."""
    s, q = msrc[m], P + mdst[m]
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


@_helper
def device_run(r, x, t, dev, busy):
    """``BulkRun._device`` for one kernel of x seconds; whether the device was busy."""
    nw = t[r]
    was = dev[r] > nw
    st = dev[r] if was else nw
    end = st + x
    if x > 0:
        busy[r] += x
    if end > nw:
        dev[r] = end
        t[r] = nw + (end - nw)
    return was


@_njit
def replay(P, entry, order, device, msrc, mdst, mnb, sitem, ritem,
           soff, seqmap, items, dt, waits, rv_idx, dur_dt,
           port_off, port_st, port_en, port_last, mdur, rtt, eager, window):
    nitems = len(items)
    t = entry.copy()
    dev = device.copy()
    busy = np.zeros(P)
    exact_dev = True
    exact_net = True
    # ports (0..P-1 send, P..2P-1 receive): row p holds port p's pn[p] busy intervals
    pn = port_off[1:] - port_off[:-1]
    plo = np.zeros(2 * P, dtype=pn.dtype)
    cap = 2 * max(pn.max(), 32)
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
    seq = 0
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
                    if device_run(r, x, t, dev, busy):
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
                if device_run(r, dt[j], t, dev, busy):
                    exact_dev = False
                if t[r] > now:
                    seq += 1
                    heapq.heappush(heap, (now + (dev[r] - now), seq, GO, r, 0, 0))
                    break
                continue
            posted[j] = 1
            for x in range(rv_lo[j], rv_hi[j]):   # its receives past the window (rendezvous)
                m = np.int64(rv_idx[x])
                if posted[sitem[m]]:   # a rendezvous send posted before moves now
                    if rtt > 0:
                        seq += 1
                        heapq.heappush(heap, (now + rtt, seq, MOVE, m, 0, 0))
                    else:
                        PS, PE = room(PS, PE, plo, pn, (np.int64(msrc[m]), P + np.int64(mdst[m])), now)
                        seq, ok = transfer(m, False, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast,
                                           chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d,
                                           border, nbook, heap, seq, unbooked, last_t, last_s)
                        exact_net = ok and exact_net
            for m in range(np.int64(send_lo[j]), np.int64(send_hi[j])):   # (messages numbered in posting order)
                if mnb[m] <= eager or ((mnb[m] <= window or posted[ritem[m]]) and not rtt > 0):
                    PS, PE = room(PS, PE, plo, pn, (np.int64(msrc[m]), P + np.int64(mdst[m])), now)
                    seq, ok = transfer(m, True, now, P, msrc, mdst, mdur, sitem, ritem, PS, PE, plo, pn, plast,
                                       chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d,
                                       border, nbook, heap, seq, unbooked, last_t, last_s)
                    exact_net = ok and exact_net
                elif mnb[m] <= window or posted[ritem[m]]:   # buffered by the receiver, or rendezvous
                    seq += 1
                    heapq.heappush(heap, (now + rtt, seq, MOVE, m, 1, 0))
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


class _StepOf:
    """Rank r's step in wave k, for arrays of (r, k) (``witems``: the wave
    steps, ``wkey``: rank * waves + wave of each, ascending): a gather from a
    (waves x P) table, or a binary search where the table would outgrow the
    ``m`` lookups to come (a table lookup is a fraction of a search's cache
    misses: at P = 4096 the searches of the kernels during waves took 9 s)."""

    def __init__(self, witems, wkey, nw: int, P: int, ix, m: int):
        self.witems, self.wkey, self.nw, self.table = witems, wkey, nw, None
        if nw * P <= 4 * m + 4096:
            self.table = np.full((nw, P), -1, dtype=ix)
            self.table[wkey % nw, wkey // nw] = witems

    def __call__(self, ranks, k):
        """The steps of ``ranks`` in wave ``k`` (an int, or an array as long as ``ranks``)."""
        if self.table is not None:
            return self.table[k, ranks]
        return self.witems[np.searchsorted(self.wkey, ranks * np.int64(self.nw) + k)]


def _wave_steps(waves, step_of: _StepOf, ix):
    """Each message's wave step at its sender and at its receiver, wave by
    wave: gathers within a wave, not a search over all steps for each of
    P^2 messages."""
    nm = sum(len(w[0]) for w in waves)
    sitem, ritem = np.empty(nm, dtype=ix), np.empty(nm, dtype=ix)
    a = 0
    for k, (src, dst, _, _) in enumerate(waves):
        b = a + len(src)
        sitem[a:b], ritem[a:b] = step_of(src, k), step_of(dst, k)
        a = b
    return sitem, ritem


def _by_step(waves, item, off, P: int, ix, recv: bool, senders=None):
    """The messages grouped by step (``item``, offsets ``off``), a step's
    sends by (place, message) and its receives by (place, sender, message)
    (``BulkRun._mine``; ``senders``: the senders' ranks to order by, where
    the waves' are labels): sorted within each wave (a wave's steps ascend
    with their rank) and placed at their step's offset."""
    out = np.empty(int(off[-1]), dtype=ix)
    a = 0
    for k, (src, dst, _, pos) in enumerate(waves):
        b = a + len(src)
        places = np.int64(pos.max()) + 1 if len(pos) else 1
        by = src if senders is None else senders[k]
        key = (dst * places + pos) * np.int64(P) + by if recv else src * places + pos
        o = np.argsort(key, kind="stable")
        it = item[a:b][o]
        within = np.arange(b - a) - np.searchsorted(it, it)   # place in its step
        out[off[it] + within] = a + o
        a = b
    return out


def _regroup(counts, order):
    """Indices that lay segments of ``counts`` (stored one after another)
    out in ``order``."""
    c = counts[order]
    start = np.cumsum(counts) - counts
    return np.repeat(start[order] - (np.cumsum(c) - c), c) + np.arange(int(c.sum()))


def _unlabel(x, order):
    """Per-label values back in rank order (label i is rank ``order[i]``)."""
    out = np.empty_like(x)
    out[order] = x
    return out


def replay_run(run) -> None:
    """Time ``run`` (a :class:`~simsparse.backends.bulk.BulkRun` on an
    alpha-beta network, after ``bulk_restart``) with the compiled replay:
    its waves, steps and kernels as arrays in, exits, device times, the
    order of the returns and the exactness out, the bookings handed to the
    network as the Python replay hands them."""
    sim, P = run.sim, run.P
    net = sim.network
    nw = len(run.waves)
    # The ranks are labelled by their place in the order they posted (``run.order``), and
    # their steps and messages laid out in that order: the replay visits ranks in about
    # that order, so one rank's data follows the last one's in memory (16 % less time at
    # P = 2048 than in rank order, where after a recursive doubling the visits jump in
    # bit-reversed order). Events are ordered by time and sequence, never by rank.
    rorder = np.asarray(run.order, dtype=np.int64)
    lab = np.empty(P, dtype=np.int64)
    lab[rorder] = np.arange(P)
    # each rank's steps: waves (ids) and kernels (seconds), in order
    kind, val, rank = run.flat_steps()
    at = _regroup(rank, rorder)
    kind, val, rank = kind[at].astype(np.int64), val[at], rank[rorder]
    n_items, nm = len(kind), sum(len(w[0]) for w in run.waves)
    ix = np.int32 if max(P, nm, n_items) < 2**31 else np.int64   # message and step indices: half the memory
    senders = [w[0] for w in run.waves]
    waves = [(lab[s].astype(ix), lab[d].astype(ix), nb, pos) for s, d, nb, pos in run.waves]
    msrc = np.concatenate([w[0] for w in waves], dtype=ix)
    mdst = np.concatenate([w[1] for w in waves], dtype=ix)
    mnb = np.concatenate([w[2] for w in waves]).astype(np.int64, copy=False)
    dt = np.where(kind == 1, val, 0.0)
    wave = np.where(kind == 0, val, -1).astype(np.int64)
    soff = np.zeros(P + 1, dtype=np.int64)
    soff[1:] = np.cumsum(rank)
    item_rank = np.repeat(np.arange(P, dtype=np.int64), rank)
    witems = np.flatnonzero(kind == 0)
    wkey = item_rank[witems] * nw + wave[witems]   # (ascending: a rank's steps, rank after rank)
    dr, dk, dd = (np.asarray(c) for c in run.during_log)
    step_of = _StepOf(witems, wkey, nw, P, ix, nm + len(dr))
    sitem, ritem = _wave_steps(waves, step_of, ix)
    send_off = np.zeros(n_items + 1, dtype=np.int64)
    send_off[1:] = np.cumsum(np.bincount(sitem, minlength=n_items))
    recv_n = np.bincount(ritem, minlength=n_items)
    recv_off = np.zeros(n_items + 1, dtype=np.int64)
    recv_off[1:] = np.cumsum(recv_n)
    # messages numbered again in the order their senders post them: a step's sends lie side by
    # side (the replay reads each one's arrays where it read P apart), its receives by the new ids
    order = _by_step(waves, sitem, send_off, P, ix, recv=False)
    renum = np.empty(nm, dtype=ix)
    renum[order] = np.arange(nm, dtype=ix)
    recv_idx = renum[_by_step(waves, ritem, recv_off, P, ix, recv=True, senders=senders)]
    del renum, waves, senders
    msrc, mdst, mnb, sitem, ritem = msrc[order], mdst[order], mnb[order], sitem[order], ritem[order]
    del order
    # a step waits for its sends and receives; of its receives only those past the window act when it posts
    left = (np.diff(send_off) + recv_n).astype(ix)
    rv_idx = recv_idx[mnb[recv_idx] > float(sim.window)]
    rv_off = np.zeros(n_items + 1, dtype=np.int64)
    rv_off[1:] = np.cumsum(np.bincount(ritem[rv_idx], minlength=n_items))
    del recv_idx, recv_n
    keep = dk >= 0 if len(dk) else np.zeros(0, dtype=bool)   # kernels after a rank's last wave are never read
    dr, dk, dd = lab[dr[keep]], dk[keep].astype(np.int64), dd[keep].astype(np.float64)
    at = step_of(dr, dk).astype(np.int64)   # each one's wave step
    o = np.argsort(at, kind="stable")                  # grouped by step, in the order they were recorded
    dur_off = np.zeros(n_items + 1, dtype=np.int64)
    dur_off[1:] = np.cumsum(np.bincount(at, minlength=n_items))
    dur_dt = dd[o]
    items = np.empty((n_items, 8), dtype=ix if dur_off[-1] < 2**31 else np.int64)   # a step's fields in a row
    items[:, 0], items[:, 7] = kind, item_rank
    for c, off in ((1, send_off), (3, rv_off), (5, dur_off)):
        items[:, c], items[:, c + 1] = off[:-1], off[1:]
    del send_off, rv_off, dur_off, kind, val, wave, item_rank, witems, wkey, at, o, dr, dk, dd, step_of
    # the rows by (place in their rank's sequence, rank): the ranks go through their steps about
    # together, so the rows the replay reads at one time lie side by side (P = 2048: 10 % less time
    # than rank after rank); ``seqmap`` takes a rank's place in its sequence to its row
    seqmap = np.empty(n_items, dtype=ix)
    perm = np.lexsort((items[:, 7], np.arange(n_items) - soff[items[:, 7]]))
    seqmap[perm] = np.arange(n_items, dtype=ix)
    sitem, ritem = seqmap[sitem], seqmap[ritem]
    items, dt, left = items[perm], dt[perm], left[perm]
    del perm
    mdur = net.duration(mnb.astype(np.float64))
    port_off, port_st, port_en, port_last = net.bulk_ports()
    rows = np.concatenate((rorder, P + rorder))   # the ports by label: send ports, then receive ports
    n_port = np.diff(port_off)
    port_st, port_en = port_st[_regroup(n_port, rows)], port_en[_regroup(n_port, rows)]
    port_off = np.concatenate(([0], np.cumsum(n_port[rows])))
    (t, dev, busy, done, exact_dev, exact_net, mstart, border, log_t1, log_d, held) = replay(
        P, run.entry[rorder].astype(np.float64), np.arange(P, dtype=np.int64), run.device[rorder].astype(np.float64),
        msrc, mdst, mnb, sitem, ritem, soff, seqmap, items, dt, left, rv_idx, dur_dt, port_off, port_st, port_en, port_last[rows],
        mdur, float(sim.rdv_rtt), float(sim.eager), float(sim.window))
    run.t, run.device, run.busy = (_unlabel(x, rorder) for x in (t, dev, busy))
    run.done = rorder[done].tolist()
    rank_of = rorder.astype(ix)
    msrc, mdst = rank_of[msrc], rank_of[mdst]
    held = _unlabel(held, rows)
    free = net.bulk_took(msrc, mdst, mstart, (msrc[border], mdst[border], log_t1, log_d), held)
    run.exact = run.exact and exact_dev and exact_net and free
