"""The flow-level model's bulk paths (:mod:`simsparse.backends.fast.bulk`,
:mod:`simsparse.backends.fast.rounds`): waves of solo flows timed as arrays, and
the scratch copy a bulk evaluation replays shared flows on."""
from __future__ import annotations

import copy

import numpy as np

from .maxmin import END_TOL


class Held:
    """Marks a link a bulk evaluation used (:meth:`FlowBulk.bulk_commit`):
    its flows' bytes leave it from ``start`` until ``end``."""

    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end


class _Busy:
    """Marks a link that carries shared flows (``end`` never passes)."""

    end = np.inf


BUSY = _Busy()


class FlowBulk:
    """Mixed into :class:`~simsparse.network.flow.FlowNetwork`."""

    # -- bulk evaluation (simsparse.backends.fast.bulk) ---------------------------------------
    # A wave is timed as arrays while every flow is solo, as ``transfer``
    # would find it: its links free when it is posted, and flows sharing a
    # link one after another in posting order. Otherwise the evaluation
    # replays the collective on a scratch copy of this model
    # (``bulk_scratch``), which shares bandwidth as the event simulation
    # does; that is exact unless a flow crossed a link that traffic from
    # outside the collective held (``bulk_replayed``).

    def capabilities(self, P: int) -> frozenset:
        """For P ranks: ``arrays`` not with adaptive routing (a route depends on the load
        when the message starts); neither ``arrays`` nor ``flow_waves`` with a
        LogGP gap (an endpoint's messages queue in posting order), shaped
        links (a message's head start depends on how long each link has been
        idle) or acknowledgements slowed by full ports (a port's rate depends
        on the reverse traffic: .ack_queue). ``repeatable`` without shaped
        links: their buckets carry over to the next run (:meth:`_carry`);
        adaptive routing draws from a generator seeded anew each run."""
        repeatable = () if self.burst else ("repeatable",)
        if self.gap > 0.0 or self.burst or self.ack_eff < 1.0:
            return frozenset(repeatable)
        return frozenset(("flow_waves",) if self.machine(P)[0].adaptive else ("arrays", "flow_waves")) | set(repeatable)

    def bulk_start(self, P: int, earliest: float = 0.0, keep: bool = True) -> None:
        """Begin a bulk evaluation on the network as it is now (no message of
        it ready before ``earliest``; ``keep``: hold its links for later
        messages, :meth:`bulk_commit`)."""
        self._keep = keep
        self.bulk_restart()

    def bulk_restart(self) -> None:
        """Forget what this evaluation timed so far. A link's state (when its
        solo flow's bytes have left, BUSY: never, and when that flow started)
        is read from ``_own`` when the evaluation first uses the link
        (:meth:`_look`): a Dragonfly has 10^5 links, a collective touches a
        few (reading them all took 13 ms a collective)."""
        n = len(self._own)
        self._link_end = np.full(n, -np.inf)
        self._link_now = np.full(n, -np.inf)
        self._seen = np.zeros(n, dtype=bool)
        self._stamp = np.zeros(n, dtype=np.intp)   # scratch: finds a link used twice in one wave
        self._last_batch = None
        self._bulk_links = []

    def _look(self, links: np.ndarray) -> None:
        """Read the state of ``links`` not read yet in this evaluation."""
        new = links[~self._seen[links]]
        if not len(new):
            return
        own, end, start = self._own, self._link_end, self._link_now
        for x in new.tolist():
            g = own[x]
            if g is not None:
                end[x] = g.end          # BUSY: inf
                if g is not BUSY:
                    start[x] = g.start
        self._seen[new] = True

    def _batch_routes(self, src, dst):
        """For messages src[i] -> dst[i]: their route ids, their links as one
        flat array (padding dropped), the message each link belongs to, and
        whether no link occurs twice. The last answer is kept, as a schedule
        often repeats its messages (the ring's every round)."""
        last = self._last_batch
        if last is not None and np.array_equal(last[0], src) and np.array_equal(last[1], dst):
            return last[2]
        rt, ep, ne = self._routes, self._ep, self._n_ep
        rids = []
        for s, d in zip(src.tolist(), dst.tolist()):
            es, ed = ep[s], ep[d]
            r = rt.pair.get(es * ne + ed)
            rids.append(self.route_id(es, ed) if r is None else r)
        rid = np.array(rids, dtype=np.intp)
        R = rt.R[rid]
        real = R != rt.dummy
        links = R[real]
        owner = np.nonzero(real)[0]
        stamp = self._stamp
        stamp[links] = np.arange(len(links))
        got = (rid, links, owner, bool((stamp[links] == np.arange(len(links))).all()))
        self._last_batch = (src, dst, got)
        return got

    def bulk_wave_possible(self, src, dst, pos) -> bool:
        """Whether flows are solo depends on when they run: worth a try."""
        return True

    def bulk_wave(self, ready, src, dst, nbytes, pos, firm):
        """Arrivals of messages posted at ``ready`` (arrays) if every flow is
        solo, exactly as ``transfer`` gives them; else (None, False)."""
        rt = self._routes
        rid, links, owner, distinct = self._batch_routes(src, dst)
        t0 = ready + self.o_s
        tail = rt.lat[rid]
        out = np.empty(len(ready))
        empty = nbytes <= 0    # no bytes: no link held, latency only
        if empty.any():
            out[empty] = ready[empty] + (((t0[empty] - ready[empty]) + tail[empty]) + self.o_r)
            keep = ~empty[owner]   # the links of messages with bytes, numbered among those
            links, owner = links[keep], np.cumsum(~empty)[owner[keep]] - 1
        f = ~empty
        nf = ready[f]
        end = t0[f] + nbytes[f] / rt.bneck[rid[f]]
        if not self._solo_batch(links, owner, distinct, nf, end):
            return None, False
        if self._keep:
            self._bulk_links.append(links)
        out[f] = nf + (((end + tail[f]) + self.o_r) - nf)
        return out, True

    def bulk_scratch(self, env, P: int):
        """This model (same machine, placement and routes) idle on ``env``."""
        twin = copy.copy(self)
        twin.reset(env, P)
        return twin

    def bulk_transfer(self, src: int, dst: int, nbytes: int, done, firm: bool) -> bool:
        """``transfer`` on a scratch copy; the order of same-time starts never
        changes max-min shares, so it is always as the event simulation's."""
        self.transfer(src, dst, nbytes, done)
        return True

    def bulk_replayed(self, flows: list) -> bool:
        """Hold the links of a replay's flows, (src, dst, start, arrival)
        each, until their bytes left; whether none crossed a link busy with
        traffic from outside the collective when it started."""
        if not flows:
            return True
        src, dst, start, arrival = (np.array(c) for c in zip(*flows))
        rid, links, owner, _ = self._batch_routes(src.astype(np.intp), dst.astype(np.intp))
        self._look(links)
        free = bool((self._link_end[links] <= start[owner] * (1.0 + END_TOL)).all())
        left = arrival - self._routes.lat[rid] - self.o_r   # when each flow's last byte left
        np.maximum.at(self._link_end, links, left[owner])
        np.maximum.at(self._link_now, links, start[owner])
        self._bulk_links.append(links)
        return free

    def _solo_batch(self, links, flow, distinct, now, end) -> bool:
        """Whether flows posted at ``now`` ending at ``end`` all start solo,
        as :meth:`_solo` would find them (``links`` flat, ``flow`` the flow
        of each, ``distinct``: no link twice), and if so claim their links.
        Flows of one batch that share a link must follow one another, in
        posting order."""
        self._look(links)
        horizon = now * (1.0 + END_TOL)
        if distinct:   # no link twice: no order to check
            if (self._link_end[links] > horizon[flow]).any() or (self._link_now[links] >= now[flow]).any():
                return False
            self._link_end[links] = end[flow]
            self._link_now[links] = now[flow]
            return True
        flat, fnow, fend = links, now[flow], end[flow]
        order = np.lexsort((fnow, flat))
        flat, fnow, fend = flat[order], fnow[order], fend[order]
        horizon = fnow * (1.0 + END_TOL)
        same = flat[1:] == flat[:-1]    # the next flow on the same link, later posted
        if (same & ((fend[:-1] > horizon[1:]) | (fnow[:-1] >= fnow[1:]))).any():
            return False
        first = np.ones(len(flat), dtype=bool)
        first[1:] = ~same
        fl = flat[first]
        if ((self._link_end[fl] > horizon[first]) | (self._link_now[fl] >= fnow[first])).any():
            return False
        last = np.ones(len(flat), dtype=bool)
        last[:-1] = ~same
        self._link_end[flat[last]] = fend[last]
        self._link_now[flat[last]] = fnow[last]
        return True

    def bulk_commit(self, now: float) -> None:
        """Mark the links the evaluation used as held until their last flow's
        bytes have left: a later flow that finds one still held runs beside
        them (counted in ``bulk_touched``)."""
        own, horizon = self._own, now * (1.0 + END_TOL)
        if not self._bulk_links:
            return
        for x in np.unique(np.concatenate(self._bulk_links)).tolist():
            end = float(self._link_end[x])
            g = own[x]
            if end > horizon and (g is None or (g is not BUSY and g.end < end)):
                own[x] = Held(float(self._link_now[x]), end)
