"""Max-min fair rates of flows on links: the flow-level model's solver."""
from __future__ import annotations

import numpy as np

REL_TOL = 1e-9               # bottleneck shares this close are equal
END_TOL = 1e-12              # flows ending within now * END_TOL of a tick end at it


def maxmin_rates(routes: np.ndarray, cap: np.ndarray) -> np.ndarray:
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
