"""The compiled replay's input: a recorded bulk collective laid out as the
arrays :func:`.replay_ab.replay` reads (every message's sender and receiver
step, each step's sends and receives in the order the Python replay takes
them, the kernels between posting and waiting), and its results put back
(:func:`replay_run`). Labels: rank i of the arrays is the i-th rank to have
resumed (``run.order``), so that ranks start in the event simulation's order.
"""
from __future__ import annotations

import numpy as np

from .ports import Rows
from .replay_ab import replay


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


def replay_run(run) -> bool:
    """Time ``run`` (a :class:`~simsparse.backends.fast.bulk.BulkRun` on an
    alpha-beta network, after ``bulk_restart``) with the compiled replay:
    its waves, steps and kernels as arrays in, exits, device times, the
    order of the returns and the exactness out, the bookings handed to the
    network as the Python replay hands them."""
    if not run.waves:   # no message: the kernels alone, as the Python replay runs them
        return run.replay()
    run._reset()
    host, P = run.host, run.P
    net = host.network
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
    rv_idx = recv_idx[host.protocol.gated(mnb[recv_idx])]
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
    rows = np.concatenate((rorder, P + rorder))   # the ports by label: send ports, then receive ports
    ports = Rows(net, P, rows)
    (t, dev, busy, done, exact_dev, exact_net, mstart, border, log_t1, log_d, held) = replay(
        P, run.entry[rorder].astype(np.float64), np.arange(P, dtype=np.int64), run.device[rorder].astype(np.float64),
        msrc, mdst, mnb, sitem, ritem, soff, seqmap, items, dt, left, rv_idx, dur_dt, ports.PX, ports.plo, ports.pn,
        ports.plast, mdur, *host.protocol.scalars)
    run.t, run.device, run.busy = (_unlabel(x, rorder) for x in (t, dev, busy))
    run.done = rorder[done].tolist()
    rank_of = rorder.astype(ix)
    msrc, mdst = rank_of[msrc], rank_of[mdst]
    held = _unlabel(held, rows)
    free = net.bulk_took(msrc, mdst, mstart, (msrc[border], mdst[border], log_t1, log_d), held)
    run.inexact["device"] += not exact_dev
    run.inexact["order"] += not exact_net
    run.inexact["outside"] += not free
    return True
