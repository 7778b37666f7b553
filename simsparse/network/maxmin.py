"""Max-min fair rates of flows on links: the flow-level model's solver.

:func:`maxmin_rates` is compiled with numba (a wheel on every platform,
nothing to build) outside :func:`simsparse.jit.python`; the pure numpy
path, :func:`maxmin_rates_numpy`, gives the same rates to the last bit
(the same operations in the same order; ``tests/network/test_flow_model.py``
compares them) and runs otherwise. The flow model's tick calls
:func:`_classify` and :func:`_solve_shared` (compiled, through
:mod:`.flow_solve`): a solve on Piz Daint's Ok-Topk of BERT has about 125
flows at P = 64 and 430 at P = 256, where numpy calls over the whole link
numbering had cost more than the filling itself.
"""
from __future__ import annotations

import numpy as np

from .. import jit
from ..jit import njit

REL_TOL = 1e-9               # bottleneck shares this close are equal
END_TOL = 1e-12              # flows ending within now * END_TOL of a tick end at it


def maxmin_rates_numpy(routes: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Max-min fair rates by progressive filling (Bertsekas and Gallager,
    *Data Networks*, section 6.5.2), freezing many bottlenecks per round.

    ``routes`` is flows x hops of link ids padded with a link whose capacity
    is ``inf`` (the flow model uses the last one). A link's *level* is the
    rate its unfrozen flows would get if it were their bottleneck:
    (capacity - rates of its frozen flows) / (its unfrozen flows). Levels
    never decrease as flows freeze, so a link whose level is the lowest among
    all links its flows cross is a bottleneck at that level: every round
    freezes the flows of all such links at once (the global minimum is always
    one, so each round makes progress). A round is a few numpy passes over
    the flows x hops array; the link space is first compacted to the links in
    use when that is smaller."""
    F, H = routes.shape
    rate = np.empty(F)
    if F == 0:
        return rate
    if len(cap) > 2 * routes.size:   # np.unique(return_inverse), without its sort
        used = np.zeros(len(cap), dtype=bool)
        used[routes] = True
        ids = np.flatnonzero(used)
        number = np.cumsum(used) - 1
        routes, cap = number[routes], cap[ids]
    nl = len(cap)
    cnt = np.bincount(routes.ravel(), minlength=nl).astype(np.float64)
    avail = cap.astype(np.float64)            # the padding link keeps inf: never a bottleneck
    todo = np.arange(F)
    R = routes
    with np.errstate(divide="ignore", invalid="ignore"):
        while True:
            lv = (avail / cnt)[R]                  # the level of every (flow, link)
            mine = lv.min(axis=1)                  # each unfrozen flow's lowest level
            # a link is a bottleneck unless one of its flows sees a lower level elsewhere
            lower = mine[:, None] * (1.0 + REL_TOL) < lv
            neck = np.bincount(R[lower], minlength=nl) == 0
            hit = neck[R].any(axis=1)
            rate[todo[hit]] = mine[hit]
            if hit.all():
                return rate
            Rh = R[hit]
            avail -= np.bincount(Rh.ravel(), weights=np.repeat(mine[hit], H), minlength=nl)
            cnt -= np.bincount(Rh.ravel(), minlength=nl)
            keep = ~hit
            R, todo = R[keep], todo[keep]


def _solve(R, cap, tol):
    """:func:`maxmin_rates_numpy` as loops, for numba."""
    F, H = R.shape
    nl = len(cap)
    cnt = np.zeros(nl)
    for f in range(F):
        for h in range(H):
            cnt[R[f, h]] += 1.0
    avail = cap.astype(np.float64)
    rate = np.empty(F)
    todo = np.arange(F)
    level = np.empty(nl)
    mine = np.empty(F)
    lower = np.zeros(nl, dtype=np.bool_)
    used = np.zeros(nl)
    sub = np.zeros(nl)
    while len(todo):
        for i in range(len(todo)):   # the level of every (flow, link), each flow's lowest
            m = np.inf
            for h in range(H):
                x = R[todo[i], h]
                level[x] = avail[x] / cnt[x]
                if level[x] < m:
                    m = level[x]
            mine[i] = m
        for i in range(len(todo)):   # a link is a bottleneck unless a flow of it sees a lower level elsewhere
            for h in range(H):
                x = R[todo[i], h]
                if mine[i] * (1.0 + tol) < level[x]:
                    lower[x] = True
        keep = np.empty(len(todo), dtype=np.int64)
        nk = 0
        for i in range(len(todo)):
            hit = False
            for h in range(H):
                if not lower[R[todo[i], h]]:
                    hit = True
            if hit:
                rate[todo[i]] = mine[i]
                for h in range(H):
                    x = R[todo[i], h]
                    used[x] += mine[i]
                    sub[x] += 1.0
            else:
                keep[nk] = todo[i]
                nk += 1
        for i in range(len(todo)):   # what the frozen flows take off their links
            for h in range(H):
                x = R[todo[i], h]
                lower[x] = False
                if sub[x] > 0.0:
                    avail[x] -= used[x]
                    cnt[x] -= sub[x]
                    used[x] = 0.0
                    sub[x] = 0.0
        todo = keep[:nk]
    return rate


_SOLVE = njit(_solve)


def _classify(Rt, bneck, rid, cnt, old, floor, slot, tol):
    """The first half of ``FlowNetwork._solve`` as loops: every flow's rate
    at its route's bottleneck (``bneck``), unless it shares a link (a
    ``cnt`` above 1): then its old rate where it is slower than ``floor``
    (it keeps it, state 2), else to solve (state 1). Returns the rates, the
    states, the flows to solve, those kept and whether any flow crosses a
    link not yet numbered (``slot`` -1)."""
    F, H = rid.shape[0], Rt.shape[1]
    rate = np.empty(F)
    state = np.zeros(F, dtype=np.int8)
    nsh = nkept = 0
    unnumbered = False
    for f in range(F):
        r = rid[f]
        rate[f] = bneck[r]
        for h in range(H):
            x = Rt[r, h]
            if slot[x] < 0:
                unnumbered = True
            if cnt[x] > 1.0:
                state[f] = 1
        if state[f] == 1:
            if floor > 0.0 and old[f] < floor * (1.0 - tol):
                rate[f] = old[f]
                state[f] = 2
                nkept += 1
            else:
                nsh += 1
    return rate, state, nsh, nkept, unnumbered


def _solve_shared(Rt, rid, state, rate, slot, slot_cap, loc, nsh, nkept, tol):
    """The second half: max-min rates of the flows in state 1 (written into
    ``rate``) on the links' capacities (``slot_cap`` by ``slot`` number)
    less what the kept flows (state 2) take. The solve sees only the links
    those flows cross, numbered as they first appear (``loc``: scratch, -1
    everywhere, and so again on return); a link's arithmetic is the numpy
    path's, in the same order, so the rates are its to the last bit."""
    H = Rt.shape[1]
    L = np.empty((nsh, H), dtype=np.int64)
    ids = np.empty(nsh * H, dtype=np.int64)
    n = j = 0
    for f in range(rid.shape[0]):
        if state[f] == 1:
            for h in range(H):
                x = slot[Rt[rid[f], h]]
                if loc[x] < 0:
                    loc[x] = n
                    ids[n] = x
                    n += 1
                L[j, h] = loc[x]
            j += 1
    cap = np.empty(n)
    for i in range(n):
        cap[i] = slot_cap[ids[i]]
    if nkept:
        used = np.zeros(n)
        for f in range(rid.shape[0]):
            if state[f] == 2:
                for h in range(H):
                    i = loc[slot[Rt[rid[f], h]]]
                    if i >= 0:
                        used[i] += rate[f]
        for i in range(n):
            c = cap[i] - used[i]
            cap[i] = c if c > 0.0 else 0.0
    for i in range(n):
        loc[ids[i]] = -1
    got = _SOLVE(L, cap, tol)
    j = 0
    for f in range(rid.shape[0]):
        if state[f] == 1:
            rate[f] = got[j]
            j += 1


_CLASSIFY = njit(_classify)
_SOLVE_SHARED = njit(_solve_shared) if _SOLVE is not None else None


def maxmin_rates(routes: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """:func:`maxmin_rates_numpy`, compiled when numba is there (module docstring)."""
    if _SOLVE is None or len(routes) == 0 or not jit.enabled():
        return maxmin_rates_numpy(routes, cap)
    return _SOLVE(np.ascontiguousarray(routes, dtype=np.int64), np.asarray(cap, dtype=np.float64), REL_TOL)
