"""Approximate bulk timing on the alpha-beta network: wave after wave.

The exact replay (:mod:`.replay_ab`) orders every message by the time it
becomes ready, through one heap: about 1.25 us a message compiled, plus its
layout, so Ok-Topk's split and reduce at P = 4096 (16.8 M messages, three
times a run) took most of two minutes. This evaluation times the recorded
schedule in the order it was recorded instead:

* a kernel step runs on its rank's FIFO device (:func:`~simsparse.backends.protocol.run_kernels`),
  for all the step's ranks at once;
* a wave books each of its messages on its sender's and its receiver's
  port when it is ready (eager, rendezvous and window rules of
  :meth:`~simsparse.backends.protocol.Protocol.ready`), in the order (ready, the rank's place among
  the resumptions, place in its sender's wave): the earliest interval free
  on both ports, backfilling, as ``AlphaBetaNetwork.transfer`` books it;
* a rank runs the kernels it recorded between posting the wave and waiting
  for it, then waits for its last message.

Cost model: the network's and the device's, unchanged. What differs from
the event path is only the order in which two messages that compete for
one port are booked: here every message of wave k is booked before any of
wave k + 1, where the event path books by ready time, so a rank that runs a
wave ahead of a slow peer may find the peer's port taken by an earlier
wave's message that the event path would have booked after its own. Its
declared bound, and the sizes it holds from, are in the evaluator table
(:mod:`simsparse.backends.evaluators`); the differential tests measure it
against the exact replay.
"""
from __future__ import annotations

import numpy as np

from ... import jit
from ..protocol import run_kernels
from .ports import Rows, book, fit


def _book_wave(order, src, dst, ready, dur, P, PX, plo, pn, plast, floor, arrmax, held, touch):
    """Book the wave's messages in ``order`` on ports src (send) and P + dst
    (receive) (:mod:`.ports`): the earliest t >= ready with both free for
    dur, backfilling; the intervals over by ``floor`` (no later message is
    ready before it) are forgotten. Sets arrmax (per rank: its last arrival
    in the wave) and held (per port: its last end). Returns the storage (a
    new array when it grew)."""
    for m in order:
        s, q = np.int64(src[m]), P + np.int64(dst[m])
        d = dur[m]
        tt = ready[m]
        while True:   # as transfer: the sender's fit, the receiver's from there, until they agree
            first = fit(PX, plo, pn, plast, s, tt, d)
            u = fit(PX, plo, pn, plast, q, first, d)
            if u == first:
                break
            tt = u
        t = first
        end = t + d
        if d > 0:
            for p in (s, q):
                PX = book(PX, plo, pn, plast, p, t, d, floor, touch)
                if end > held[p]:
                    held[p] = end
        for r in (np.int64(src[m]), np.int64(dst[m])):
            if end > arrmax[r]:
                arrmax[r] = end
    return PX


_book_wave_compiled = jit.njit(_book_wave)


def booker():
    """The compiled booking loop, or its Python twin (inside ``jit.python``)."""
    return _book_wave_compiled if jit.enabled() and _book_wave_compiled is not None else _book_wave


def _grouped(ranks, values, P: int):
    """(ranks, values) split into rounds in which no rank repeats, in order
    (a rank's second entry in the round after its first)."""
    if len(ranks) <= 1 or np.bincount(ranks, minlength=P).max() <= 1:
        return [(ranks, values)]
    occ = np.zeros(len(ranks), dtype=np.int64)
    seen: dict = {}
    for i, r in enumerate(ranks.tolist()):
        occ[i] = seen.get(r, 0)
        seen[r] = occ[i] + 1
    return [(ranks[occ == j], values[occ == j]) for j in range(int(occ.max()) + 1)]


def _booking_order(src, pos, ready, rkey, ascending: bool):
    """The wave's messages by (ready, the sender's place among the
    resumptions ``rkey``, distinct per rank; place in its sender's wave):
    ``np.lexsort((pos, rkey[src], ready))``. Where ``pos`` ascends along the
    wave (as every wave's layout has it), a counting sort by the senders'
    places and then a stable sort by ready (compiled: a radix sort, a
    fifth of the lexsort's time for 16 k messages)."""
    if not ascending:
        return np.lexsort((pos, rkey[src], ready))
    P = len(rkey)
    place = np.empty(P, dtype=np.int64)
    place[np.argsort(rkey)] = np.arange(P)
    return _stably_by(ready, _by_sender(src, place))


def _by_time(t, key):
    """``np.lexsort((key, t))`` for distinct keys: by t, ties by key."""
    return _stably_by(t, np.argsort(key))


def _stably_by(x, pre):
    """``pre`` (positions in the float array x) stably sorted by x: compiled,
    a radix sort of x's bits, else numpy's stable argsort."""
    if jit.enabled() and _radix_compiled is not None:
        b = (np.asarray(x, dtype=np.float64) + 0.0).view(np.uint64)   # (+ 0.0: -0.0 ties with 0.0)
        keys = np.where(b >> np.uint64(63) == 1, ~b, b | np.uint64(1 << 63))   # unsigned, in x's order
        return _radix_compiled(keys, pre)
    return pre[np.argsort(np.asarray(x)[pre], kind="stable")]


def _radix(keys, pre):
    """``pre`` stably sorted by keys[pre] (uint64): least significant byte
    first, skipping a byte every key shares."""
    n = pre.shape[0]
    a, b = pre.astype(np.int64), np.empty(n, dtype=np.int64)
    count = np.empty(257, dtype=np.int64)
    for byte in range(8):
        sh = np.uint64(8 * byte)
        if n == 0:
            break
        d0 = (keys[a[0]] >> sh) & np.uint64(255)
        same = True
        for i in range(n):
            if (keys[a[i]] >> sh) & np.uint64(255) != d0:
                same = False
                break
        if same:
            continue
        count[:] = 0
        for i in range(n):
            count[np.int64((keys[a[i]] >> sh) & np.uint64(255)) + 1] += 1
        for j in range(256):
            count[j + 1] += count[j]
        for i in range(n):
            d = np.int64((keys[a[i]] >> sh) & np.uint64(255))
            b[count[d]] = a[i]
            count[d] += 1
        a, b = b, a
    return a


_radix_compiled = jit.njit(_radix)


def _counting_order(src, place):
    """The messages by their sender's place (stable): a counting sort."""
    P = len(place)
    first = np.zeros(P + 1, dtype=np.int64)
    for m in range(len(src)):
        first[place[src[m]] + 1] += 1
    for j in range(P):
        first[j + 1] += first[j]
    out = np.empty(len(src), dtype=np.int64)
    for m in range(len(src)):
        j = place[src[m]]
        out[first[j]] = m
        first[j] += 1
    return out


_counting_order_compiled = jit.njit(_counting_order)


def _by_sender(src, place):
    """:func:`_counting_order` compiled (16 k messages in tens of microseconds), else a stable argsort."""
    if jit.enabled() and _counting_order_compiled is not None:
        return _counting_order_compiled(src, place)
    return np.argsort(place[src], kind="stable")


def drive(run, wave) -> None:
    """Run ``run``'s recorded steps wave after wave (after ``_reset``):
    kernel steps on each rank's FIFO device, then each wave's messages, ready
    by :meth:`~simsparse.backends.protocol.Protocol.ready` and ordered for booking
    (:func:`_booking_order`), timed by ``wave(src, dst, nbytes, ready, order,
    floor)`` -> each rank's last arrival in the wave (-inf: none; ``floor``:
    no later message is ready before it), then the kernels each rank ran
    between posting and waiting. Sets the exits, device times, busy
    seconds and the order of returns. Shared by the
    alpha-beta (:func:`waves_run`) and flow-level (:mod:`.waves_flow`) waves."""
    P = run.P
    t, dev, busy = run.t, run.device, run.busy
    run._flush_steps()
    chunks = run._chunks
    dr, dk, dd = (np.asarray(c) for c in run.during_log)
    o = np.argsort(dk, kind="stable")
    dr, dk, dd = dr[o], dk[o], dd[o]
    dcut = np.searchsorted(dk, np.arange(len(run.waves) + 1))
    left = np.zeros(P, dtype=np.int64)   # per rank: its steps still to run (the floor of later readiness)
    for ranks, _, _ in chunks:
        left += np.bincount(ranks, minlength=P)
    rkey = np.empty(P)
    rkey[np.asarray(run.order, dtype=np.int64)] = np.arange(P)
    clock = P
    for ranks, kind, values in chunks:
        if kind == 1:
            for rs, dts in _grouped(ranks, values, P):
                run_kernels(t, dev, busy, rs, dts)
            left -= np.bincount(ranks, minlength=P)
            continue
        k = int(values[0])
        src, dst, nb, pos = run.waves[k]
        ready, _ = run.host.protocol.ready(nb, t[src], t[dst])
        order = _booking_order(src, pos, ready, rkey, bool((pos[1:] >= pos[:-1]).all()))
        left[ranks] -= 1
        going = left > 0
        floor = min(float(t[going].min()) if going.any() else np.inf, float(ready.min()))
        last = wave(src, dst, nb, ready, order, floor)
        lo, hi = dcut[k], dcut[k + 1]
        if hi > lo:   # the kernels between posting and waiting
            for rs, dts in _grouped(dr[lo:hi], dd[lo:hi], P):
                run_kernels(t, dev, busy, rs, dts)
        t[ranks] = np.maximum(t[ranks], last[ranks])
        rkey[ranks[_by_time(t[ranks], rkey[ranks])]] = clock + np.arange(len(ranks))
        clock += len(ranks)
    run.done = _by_time(t, rkey).tolist()


def waves_run(run) -> bool:
    """Time ``run`` (a :class:`~simsparse.backends.fast.bulk.BulkRun` on an
    alpha-beta network, after ``bulk_restart``) wave after wave (:func:`drive`),
    each message booked on its ports, and hand the network each port's
    bookings that a later message may meet."""
    run._reset()
    P = run.P
    net = run.host.network
    book = booker()
    ports = Rows(net, P)
    touch = bool(np.asarray(net.duration(np.zeros(1)))[0] > 0)   # every message takes time

    def wave(src, dst, nb, ready, order, floor):
        dur = np.asarray(net.duration(nb.astype(np.float64)), dtype=np.float64)
        arrmax = np.full(P, -np.inf)
        ports.PX = book(order, src, dst, ready, dur, P, ports.PX, ports.plo, ports.pn, ports.plast, floor,
                        arrmax, ports.held, touch)
        return arrmax

    drive(run, wave)
    # what a later message may meet: no message is ready before the earliest exit, the engine's
    # time or a post to a collective still gathering (the bookings over by then are dropped:
    # at P = 4096 the split and reduce books 16.8 M, nearly all over when its first rank exits)
    net.bulk_rows(*ports.rows(min(float(run.t.min()), run.now, run.pending)), ports.held)
    return True

