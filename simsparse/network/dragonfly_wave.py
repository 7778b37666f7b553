"""A wave of messages routed on the Dragonfly at once, compiled: each
message's links and latency, chosen in booking order by the fabric's own
rule (:meth:`.dragonfly.Dragonfly.select` and :meth:`~.dragonfly.Dragonfly.route`),
without a row of the flow model's route table per route.

``collectives: waves`` routes every message of a wave in turn; under UGAL
each one draws a random intermediate (a group, or a router of its group), so
at P = 512 on Piz Daint an iteration of Ok-Topk of BERT had 891 k choices and
754 k distinct routes. Made one by one in Python, as the event path makes
them, the choices cost 27 s and the route table's rows 25 s and most of the
7 GB. Here the fabric is a few arrays (:class:`Tables`: the link between two
routers of a group, the rank-3 links between groups, the injection links)
and one compiled pass (:func:`_choose`) walks the wave in booking order,
builds each message's minimal path and its candidate, applies the rule on
the load its earlier messages left on the watched links, and writes the
chosen path's link ids.

The random draws are one uniform per message (``u``), scaled as
``randrange`` would be (:func:`_pick`), so the model's own Python
``select`` and ``route``, given the same draws (:class:`Drawn`), choose the
same routes: ``tests/network/test_dragonfly_wave.py`` compares every link of
every message. Only nodes of one GPU and one NIC (the Aries machines) take
this path; others keep the route table.
"""
from __future__ import annotations

import numpy as np

from ..jit import njit
from .dragonfly import Dragonfly

W = 10   #: links of the longest path: injection, 2 + 1 + 2 + 1 + 2 (Valiant between groups), ejection
MODES = {"minimal": 0, "valiant": 1, "ugal": 2}


class Tables:
    """The Dragonfly as arrays (module docstring); built once per fabric."""

    def __init__(self, fab: Dragonfly):
        topo, a, g = fab.topo, fab.a, fab.g
        ix, rv = topo._index, fab.router_v
        self.rr = np.full((g * a, a), -1, dtype=np.int64)   # router r -> router j of its group: link id
        for r in range(g * a):
            base = r - r % a
            for j in range(a):
                lid = ix.get((rv[r], rv[base + j]))
                if lid is not None:
                    self.rr[r, j] = lid
        m = max(fab.m, 1)
        self.gw = np.zeros((g, g, m), dtype=np.int64)     # A -> B, k-th link: its router in A,
        self.land = np.zeros((g, g, m), dtype=np.int64)   # its router in B
        self.glid = np.zeros((g, g, m), dtype=np.int64)   # and its id
        for A in range(g):
            for B in range(g):
                for k, (u, v, lid) in enumerate(fab.gl[A][B]):
                    self.gw[A, B, k], self.land[A, B, k], self.glid[A, B, k] = u, v, lid
        self.up = np.array([ix[(h, rv[i // fab.p])] for i, h in enumerate(fab.hosts)], dtype=np.int64)
        self.down = np.array([ix[(rv[i // fab.p], h)] for i, h in enumerate(fab.hosts)], dtype=np.int64)
        self.inv = 1.0 / topo.bw_arr
        self.lat = topo.lat_arr
        self.shape = np.array([MODES[fab.routing], a, fab.S, fab.p, g, fab.m, int(fab.local)], dtype=np.int64)


def tables(fab: Dragonfly) -> Tables:
    """The fabric's :class:`Tables` (kept on the fabric)."""
    got = getattr(fab, "_wave_tables", None)
    if got is None:
        got = fab._wave_tables = Tables(fab)
    return got


def wave_routes(fab: Dragonfly, watched: np.ndarray, es, ed, order, u, load, dummy: int):
    """Every message's links (rows of ``W``, padded with ``dummy``) and latency;
    message i goes from host ``es[i]`` to host ``ed[i]``, chosen in ``order``
    with draw ``u[i]`` on ``load`` (flows per link, a copy: it is added to)."""
    t = tables(fab)
    return _CHOOSE(np.asarray(es, np.int64), np.asarray(ed, np.int64), np.asarray(order, np.int64),
                   np.asarray(u, np.float64), load, t.shape, t.rr, t.gw, t.land, t.glid, t.up, t.down,
                   t.inv, t.lat, watched, dummy)


class Drawn:
    """A ``random.Random`` stand-in for the model's own ``select``: ``randrange``
    scales the current message's draw as :func:`_pick` does."""

    def __init__(self, u):
        self.u, self.i = u, 0

    def randrange(self, k: int) -> int:
        return min(int(self.u[self.i] * k), k - 1)


def _pick(u, k):
    """The ``randrange(k)`` of draw u in [0, 1)."""
    return min(int(u * k), k - 1)


def _skip(i, A, B):
    """The i-th index that is neither A nor B (:func:`.dragonfly._skip`)."""
    lo, hi = (A, B) if A < B else (B, A)
    if i >= lo:
        i += 1
    if i >= hi:
        i += 1
    return i


def _leg(ra, rb, avoid, a, S, rr, out, k):
    """Append the links of the minimal path ra -> rb (ra != rb) inside a
    group to ``out`` at k: one hop when they share a chassis or a slot, else
    rank-1 first then rank-2, turning at the other corner where the first
    is ``avoid`` (``Dragonfly._intra`` and the legs of ``Dragonfly._via``)."""
    base = ra - ra % a
    c1, s1 = (ra - base) // S, (ra - base) % S
    c2, s2 = (rb - base) // S, (rb - base) % S
    if c1 != c2 and s1 != s2:
        x = base + c1 * S + s2
        if x == avoid:
            x = base + c2 * S + s1
        out[k] = rr[ra, x - base]
        k += 1
        ra = x
    out[k] = rr[ra, rb - base]
    return k + 1


def _intra(ra, rb, a, S, rr, out, k):
    """Append the links of the minimal path ra -> rb inside a group
    (``Dragonfly._intra``; none when ra = rb) to ``out`` at k."""
    return k if ra == rb else _leg(ra, rb, np.int64(-1), a, S, rr, out, k)


def _via(ra, ri, rb, a, S, rr, out, k):
    """Append the links of ra -> ri -> rb inside a group (``Dragonfly._via``):
    each leg minimal, neither visiting the other end of the path."""
    return _leg(ri, rb, ra, a, S, rr, out, _leg(ra, ri, rb, a, S, rr, out, k))


def _between(ra, rb, A, B, inter, b, a, S, m, rr, gw, land, glid, out, k):
    """Append the links from router ra (group A) to rb (group B != A) over the
    ``b mod m``-th global link, through group ``inter`` when it is >= 0."""
    j = b % m
    if inter >= 0:
        k = _intra(ra, gw[A, inter, j], a, S, rr, out, k)
        out[k] = glid[A, inter, j]
        ra, A = land[A, inter, j], inter
        k += 1
    k = _intra(ra, gw[A, B, j], a, S, rr, out, k)
    out[k] = glid[A, B, j]
    return _intra(land[A, B, j], rb, a, S, rr, out, k + 1)


def _choose(es, ed, order, u, load, shape, rr, gw, land, glid, up, down, inv, lat, watched, dummy):
    """The compiled pass of :func:`wave_routes` (module docstring); the rule
    is :meth:`.dragonfly.Dragonfly.select`'s, line for line."""
    mode, a, S, p, g, m, local = shape[0], shape[1], shape[2], shape[3], shape[4], shape[5], shape[6]
    n = es.shape[0]
    L = np.full((n, W), dummy, dtype=np.int32)
    tail = np.zeros(n)
    mn = np.empty(W, dtype=np.int64)
    va = np.empty(W, dtype=np.int64)
    none, one = np.int64(-1), np.int64(1)   # (not literals: each helper compiles once)
    for i in order:
        s, d = es[i], ed[i]
        ra, rb = s // p, d // p
        A, B = ra // a, rb // a
        mn[0] = up[s]
        k = one
        kv = np.int64(0)
        if A == B:
            k = _intra(ra, rb, a, S, rr, mn, k)
            if ra != rb and local == 1 and mode > 0:
                base = A * a
                ri = base + _skip(_pick(u[i], a - 2), ra - base, rb - base)
                if mode == 1:
                    va[0] = up[s]
                    kv = _via(ra, ri, rb, a, S, rr, va, one)
                else:
                    busy = False
                    for h in range(1, k):
                        if load[mn[h]] > 0:
                            busy = True
                    if busy:
                        q_min = 0.0
                        for h in range(1, k):
                            q_min = max(q_min, (load[mn[h]] + 1.0) * inv[mn[h]])
                        va[0] = up[s]
                        kv = _via(ra, ri, rb, a, S, rr, va, one)
                        q_val = 0.0
                        for h in range(1, kv):
                            q_val = max(q_val, (load[va[h]] + 1.0) * inv[va[h]])
                        if not q_val <= q_min * (1 + 1e-12):
                            kv = 0
        else:
            k = _between(ra, rb, A, B, none, d, a, S, m, rr, gw, land, glid, mn, k)
            if g >= 3 and mode > 0:
                inter = _skip(_pick(u[i], g - 2), A, B)
                va[0] = up[s]
                kv = _between(ra, rb, A, B, inter, d, a, S, m, rr, gw, land, glid, va, one)
                if mode == 2:
                    f_min = load[glid[A, B, d % m]]
                    f_val = load[glid[A, inter, d % m]]
                    if not (kv + 1) * (f_val + 1) < (k + 1) * (f_min + 1):
                        kv = 0
        src = mn
        if kv > 0:
            src, k = va, kv
        src[k] = down[d]
        k += 1
        for h in range(k):
            x = src[h]
            L[i, h] = x
            if watched[x]:
                load[x] += 1
        tail[i] = _latency(src, k, lat)
    return L, tail


def _latency(path, k, lat):
    """The latencies of ``path[:k]`` summed as numpy sums the route table's
    (pairwise: eight partial sums from eight links on), to the last bit."""
    if k < 8:
        t = 0.0
        for h in range(k):
            t += lat[path[h]]
        return t
    t = ((lat[path[0]] + lat[path[1]]) + (lat[path[2]] + lat[path[3]])) + \
        ((lat[path[4]] + lat[path[5]]) + (lat[path[6]] + lat[path[7]]))
    for h in range(8, k):
        t += lat[path[h]]
    return t


# the helpers compiled first, so the compiled pass calls them compiled (numba resolves them by name)
_pick, _skip, _leg, _intra, _via, _between, _latency = (njit(f) or f for f in (_pick, _skip, _leg, _intra, _via,
                                                                                _between, _latency))
_CHOOSE = njit(_choose) or _choose
