"""The bulk replay on the alpha-beta network, compiled with numba.

:meth:`simsparse.backends.bulk.BulkRun._replay` times a collective whose
messages wait for ports by replaying it on a scratch copy of the network
with a private engine: about 15 us a message in Python, so Ok-Topk's split
and reduce (P^2 messages) took minutes at P = 4096. This is the same replay
for :class:`~simsparse.network.alphabeta.AlphaBetaNetwork`, statement for
statement, on arrays:

* the engine: one heap of (time, sequence, event), which orders calls as
  :class:`~simsparse.engine.HeapEngine` does (its FIFO of zero-delay calls
  holds only calls due now, in sequence order); every time is computed by
  the same floating-point expression as there (``now + (end - now)``);
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

GO, MOVE, ARRIVE, RESUME = 0, 1, 2, 3

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


def _inline(fn):
    """A helper of :func:`replay`, inlined into it (a call passing two dozen arrays costs more than its body)."""
    return numba.njit(cache=True, inline="always")(fn) if numba is not None else None


@_inline
def fit(st, en, n, last, t, d):
    """Earliest t' >= t with [t', t' + d) free (``_Port.fit``)."""
    if t >= last:
        return t
    i = np.searchsorted(st[:n], t, side="right") - 1
    if i >= 0 and en[i] > t:
        t = en[i]
    i += 1
    while i < n and st[i] < t + d:
        if en[i] > t:
            t = en[i]
        i += 1
    return t


@_inline
def book(PS, PE, pn, plast, p, t, d, now):
    """``_Port.book`` on port p (row p of PS and PE, its first pn[p] intervals);
    returns the storage, doubled when the row was full."""
    if d <= 0:
        return PS, PE
    n = pn[p]
    if n == PS.shape[1]:   # grow every row
        PS2, PE2 = np.empty((PS.shape[0], 2 * n)), np.empty((PS.shape[0], 2 * n))
        PS2[:, :n], PE2[:, :n] = PS, PE
        PS, PE = PS2, PE2
    st, en = PS[p], PE[p]
    if t >= plast[p]:
        st[n], en[n] = t, t + d
        plast[p] = t + d
    else:
        i = np.searchsorted(st[:n], t, side="right")
        for j in range(n, i, -1):
            st[j], en[j] = st[j - 1], en[j - 1]
        st[i], en[i] = t, t + d
    n += 1
    if n > 64 and en[0] <= now:   # forget the past now and then
        k = np.searchsorted(en[:n], now, side="right")
        for j in range(n - k):
            st[j], en[j] = st[j + k], en[j + k]
        n -= k
    pn[p] = n
    return PS, PE


@_inline
def transfer(m, firm, now, P, msrc, mdst, mdur, PS, PE, pn, plast,
             chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d, border, nbook, heap, seq):
    """``bulk_transfer``: book message m's ports, schedule its arrival;
    returns (sequence, whether the booking order is the event path's, the port storage)."""
    s, q = msrc[m], P + mdst[m]
    d = mdur[m]
    ok = True
    if plast[s] <= now and plast[q] <= now:
        t1 = now
    else:
        own = fit(PS[s], PE[s], pn[s], plast[s], now, d)
        tt = now
        while True:   # alternate until both ports agree on a start
            t1 = fit(PS[s], PE[s], pn[s], plast[s], tt, d)
            t2 = fit(PS[q], PE[q], pn[q], plast[q], t1, d)
            if t2 == t1:
                break
            tt = t2
        if t1 != own:   # (looked up at the current time only: one (time, sender) per receiver)
            ok = tied_t[mdst[m]] != now or tied_s[mdst[m]] == s
        elif own != now:
            ok = chain_set[s] and (chain_t[s] < now or (chain_t[s] == now and chain_firm[s] and firm))
    if d > 0:
        PS, PE = book(PS, PE, pn, plast, s, t1, d, now)
        PS, PE = book(PS, PE, pn, plast, q, t1, d, now)
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
    heapq.heappush(heap, (now + (t1 + d - now), seq, ARRIVE, m, 0, 0))
    return seq, ok, PS, PE


@_inline
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
def replay(P, entry, order, device, msrc, mdst, mnb, sitem, ritem, item_rank,
           soff, kind, dt, send_off, send_idx, recv_off, recv_idx, dur_off, dur_dt,
           port_off, port_st, port_en, port_last, mdur, rtt, eager, window):
    nitems = len(kind)
    t = entry.copy()
    dev = device.copy()
    busy = np.zeros(P)
    exact_dev = True
    exact_net = True
    # ports (0..P-1 send, P..2P-1 receive): row p holds port p's pn[p] busy intervals
    pn = port_off[1:] - port_off[:-1]
    cap = 2 * max(pn.max(), 32)
    PS, PE = np.empty((2 * P, cap)), np.empty((2 * P, cap))
    plast = port_last.copy()
    for p in range(2 * P):
        a, b = port_off[p], port_off[p + 1]
        PS[p, :b - a], PE[p, :b - a] = port_st[a:b], port_en[a:b]
    chain_t = np.full(P, -np.inf)
    chain_firm = np.zeros(P, dtype=np.bool_)
    chain_set = np.zeros(P, dtype=np.bool_)
    tied_t = np.full(P, -np.inf)           # per receiver: when the messages booked there last were ready
    tied_s = np.zeros(P, dtype=np.int64)   # and their sender (-1: several)
    left = (send_off[1:] - send_off[:-1]) + (recv_off[1:] - recv_off[:-1])
    waiting = np.zeros(nitems, dtype=np.bool_)
    posted = np.zeros(nitems, dtype=np.bool_)
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
            seq, ok, PS, PE = transfer(a, b == 1, now, P, msrc, mdst, mdur, PS, PE, pn, plast, chain_t,
                               chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d, border, nbook, heap, seq)
            exact_net = ok and exact_net
            continue
        if typ == ARRIVE:   # the sender's wait first, then the receiver's
            for it in (sitem[a], ritem[a]):
                left[it] -= 1
                if left[it] == 0 and waiting[it]:
                    waiting[it] = False
                    seq += 1
                    heapq.heappush(heap, (now, seq, GO, item_rank[it], 0, 0))
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
                while di < dur_off[it + 1] - dur_off[it]:
                    x = dur_dt[dur_off[it] + di]
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
                    waiting[it] = True
                    break
                it = -1
                t[r] = now
            if cursor[r] >= soff[r + 1]:   # the collective returns
                done[ndone] = r
                ndone += 1
                break
            j = cursor[r]
            cursor[r] += 1
            if kind[j] == 1:   # a kernel
                if device_run(r, dt[j], t, dev, busy):
                    exact_dev = False
                if t[r] > now:
                    seq += 1
                    heapq.heappush(heap, (now + (dev[r] - now), seq, GO, r, 0, 0))
                    break
                continue
            posted[j] = True
            for x in range(recv_off[j], recv_off[j + 1]):
                m = np.int64(recv_idx[x])
                if mnb[m] > window and posted[sitem[m]]:   # a rendezvous send posted before moves now
                    if rtt > 0:
                        seq += 1
                        heapq.heappush(heap, (now + rtt, seq, MOVE, m, 0, 0))
                    else:
                        seq, ok, PS, PE = transfer(m, False, now, P, msrc, mdst, mdur, PS, PE, pn, plast,
                                           chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d,
                                           border, nbook, heap, seq)
                        exact_net = ok and exact_net
            for x in range(send_off[j], send_off[j + 1]):
                m = np.int64(send_idx[x])
                if mnb[m] <= eager or ((mnb[m] <= window or posted[ritem[m]]) and not rtt > 0):
                    seq, ok, PS, PE = transfer(m, True, now, P, msrc, mdst, mdur, PS, PE, pn, plast,
                                       chain_t, chain_firm, chain_set, tied_t, tied_s, mstart, log_t1, log_d,
                                       border, nbook, heap, seq)
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


def _wave_steps(waves, witems, wkey, P: int, ix):
    """Each message's wave step at its sender and at its receiver (``witems``:
    the wave steps, ``wkey``: rank * waves + wave of each, ascending), wave
    by wave from a table of every rank's step in that wave (by binary search
    where the table would outgrow the messages): gathers within a wave, not
    a search over all steps for each of P^2 messages."""
    nw, nm = len(waves), sum(len(w[0]) for w in waves)
    sitem, ritem = np.empty(nm, dtype=ix), np.empty(nm, dtype=ix)
    table = nw * P <= 4 * nm + 4096
    if table:
        step_of = np.full((nw, P), -1, dtype=ix)
        step_of[wkey % nw, wkey // nw] = witems
    a = 0
    for k, (src, dst, _, _) in enumerate(waves):
        b = a + len(src)
        if table:
            sitem[a:b], ritem[a:b] = step_of[k][src], step_of[k][dst]
        else:
            sitem[a:b] = witems[np.searchsorted(wkey, src * np.int64(nw) + k)]
            ritem[a:b] = witems[np.searchsorted(wkey, dst * np.int64(nw) + k)]
        a = b
    return sitem, ritem


def _by_step(waves, item, off, P: int, ix, recv: bool):
    """The messages grouped by step (``item``, offsets ``off``), a step's
    sends by (place, message) and its receives by (place, sender, message)
    (``BulkRun._mine``): sorted within each wave (a wave's steps ascend with
    their rank) and placed at their step's offset."""
    out = np.empty(int(off[-1]), dtype=ix)
    a = 0
    for src, dst, _, pos in waves:
        b = a + len(src)
        places = np.int64(pos.max()) + 1 if len(pos) else 1
        key = (dst * places + pos) * np.int64(P) + src if recv else src * places + pos
        o = np.argsort(key, kind="stable")
        it = item[a:b][o]
        within = np.arange(b - a) - np.searchsorted(it, it)   # place in its step
        out[off[it] + within] = a + o
        a = b
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
    # each rank's steps: waves (ids) and kernels (seconds), in order
    kind = np.concatenate([np.frombuffer(kb, dtype=np.uint8) for kb in run.kinds]).astype(np.int64)
    n_items, nm = len(kind), sum(len(w[0]) for w in run.waves)
    ix = np.int32 if max(P, nm, n_items) < 2**31 else np.int64   # message and step indices: half the memory
    msrc = np.concatenate([w[0] for w in run.waves], dtype=ix)
    mdst = np.concatenate([w[1] for w in run.waves], dtype=ix)
    mnb = np.concatenate([w[2] for w in run.waves]).astype(np.int64, copy=False)
    val = np.concatenate([np.array(items, dtype=np.float64) for items in run.steps])
    rank = [len(items) for items in run.steps]
    dt = np.where(kind == 1, val, 0.0)
    wave = np.where(kind == 0, val, -1).astype(np.int64)
    soff = np.zeros(P + 1, dtype=np.int64)
    soff[1:] = np.cumsum(rank)
    item_rank = np.repeat(np.arange(P, dtype=np.int64), rank)
    witems = np.flatnonzero(kind == 0)
    wkey = item_rank[witems] * nw + wave[witems]   # (ascending: a rank's steps, rank after rank)
    sitem, ritem = _wave_steps(run.waves, witems, wkey, P, ix)
    send_off = np.zeros(n_items + 1, dtype=np.int64)
    send_off[1:] = np.cumsum(np.bincount(sitem, minlength=n_items))
    recv_off = np.zeros(n_items + 1, dtype=np.int64)
    recv_off[1:] = np.cumsum(np.bincount(ritem, minlength=n_items))
    send_idx = _by_step(run.waves, sitem, send_off, P, ix, recv=False)
    recv_idx = _by_step(run.waves, ritem, recv_off, P, ix, recv=True)
    dr, dk, dd = (np.asarray(c) for c in run.during_log)
    keep = dk >= 0 if len(dk) else np.zeros(0, dtype=bool)   # kernels after a rank's last wave are never read
    dr, dk, dd = dr[keep].astype(np.int64), dk[keep].astype(np.int64), dd[keep].astype(np.float64)
    at = witems[np.searchsorted(wkey, dr * nw + dk)]   # each one's wave step
    o = np.argsort(at, kind="stable")                  # grouped by step, in the order they were recorded
    dur_off = np.zeros(n_items + 1, dtype=np.int64)
    dur_off[1:] = np.cumsum(np.bincount(at, minlength=n_items))
    dur_dt = dd[o]
    port_off, port_st, port_en, port_last = net.bulk_ports()
    (t, dev, busy, done, exact_dev, exact_net, mstart, border, log_t1, log_d, held) = replay(
        P, run.entry.astype(np.float64), np.asarray(run.order, dtype=np.int64), run.device.astype(np.float64),
        msrc, mdst, mnb, sitem, ritem, item_rank, soff, kind, dt, send_off, send_idx, recv_off, recv_idx,
        dur_off, dur_dt, port_off, port_st, port_en, port_last, net.duration(mnb.astype(np.float64)),
        float(sim.rdv_rtt), float(sim.eager), float(sim.window))
    run.t, run.device, run.busy, run.done = t, dev, busy, done.tolist()
    free = net.bulk_took(msrc, mdst, mstart, (msrc[border], mdst[border], log_t1, log_d), held)
    run.exact = run.exact and exact_dev and exact_net and free
