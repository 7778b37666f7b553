"""What ``simsparse topo`` prints and draws: counts, bisection bandwidth and
diameter of the machine a network spec builds for P ranks.

* **bisection bandwidth**: the maximum flow (scipy) from the first half of the
  endpoints (in index order) to the second half, one direction. This is the
  cut between the two halves a linear placement uses, an upper bound on the
  minimum over all bisections, and equal to it for these symmetric topologies;
* **diameter**: the most links on a shortest path between two endpoints
  (routing may use longer paths, e.g. Valiant).
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow, shortest_path

from .topology import ENDPOINT, HUB, NIC, ROUTER, SWITCH

DRAW_LIMIT = 600  # vertices


def summary(spec, P: int) -> dict:
    m, _ = spec.machine(P)
    t = m.topo
    ends = [m.vertex[e] for e in range(m.n_endpoints)]
    return {
        "network": spec.label(),
        "P": P,
        "endpoints": m.n_endpoints,
        "nodes": m.nodes,
        "nics": t.count(NIC) if (m.G > 1 or m.nics > 1) else m.nodes,
        "switches": t.count(SWITCH),
        "routers": t.count(ROUTER),
        "node_hubs": t.count(HUB),
        "links": t.n_links,
        "bisection_GBps": bisection_bandwidth(t, ends) / 1e9,
        "diameter_hops": diameter(t, ends),
    }


def _adjacency(t, extra_src=(), extra_dst=(), extra_cap=(), n_extra=0, unit=1e6):
    n = t.n_vertices + n_extra
    cap = np.concatenate([np.round(t.bw_arr / unit), np.asarray(extra_cap, dtype=np.float64)]).astype(np.int32)
    src = np.concatenate([np.asarray(t.src), np.asarray(extra_src, dtype=np.int64)])
    dst = np.concatenate([np.asarray(t.dst), np.asarray(extra_dst, dtype=np.int64)])
    return csr_matrix((cap, (src, dst)), shape=(n, n))


def bisection_bandwidth(t, ends: list[int]) -> float:
    """Max flow in bytes/s from the first half of ``ends`` to the second."""
    half = len(ends) // 2
    if half == 0:
        return 0.0
    S, T = t.n_vertices, t.n_vertices + 1
    big = 1 << 30
    a, b = ends[:half], ends[half:2 * half]
    g = _adjacency(t, [S] * half + b, a + [T] * half, [big] * (2 * half), n_extra=2)
    return float(maximum_flow(g, S, T).flow_value) * 1e6


def diameter(t, ends: list[int]) -> int:
    """Most links on a shortest path between two endpoints."""
    if len(ends) < 2:
        return 0
    g = _adjacency(t)
    nbr = {e: g.indices[g.indptr[e]:g.indptr[e + 1]] for e in ends}
    if all(len(v) == 1 for v in nbr.values()):
        # every endpoint hangs off one vertex: d(e1, e2) = d(n1, n2) + 2
        att = sorted({int(v[0]) for v in nbr.values()})
        if len(att) == 1:
            return 2
        d = shortest_path(g, unweighted=True, indices=att)[:, att]
        return int(d.max()) + 2
    d = shortest_path(g, unweighted=True, indices=ends)[:, ends]
    return int(d.max())


def draw(spec, P: int, path) -> None:
    """Draw the machine for P ranks to a PNG: vertices by kind, links by kind
    (a full-duplex pair as one line); groups of a dragonfly on a circle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, eps = spec.machine(P)
    t = m.topo
    if t.n_vertices > DRAW_LIMIT:
        raise ValueError(f"{t.n_vertices} vertices are too many to draw (limit {DRAW_LIMIT}); use a smaller -P")
    xy = _circle_layout(m) if hasattr(m.fabric, "gl") else _layered_layout(t)
    fig, ax = plt.subplots(figsize=(12, 7))
    kinds = sorted(set(t.lkind))
    cmap = plt.get_cmap("tab10")
    seen = set()
    for u, v, k in zip(t.src, t.dst, t.lkind):
        if (v, u) in seen:
            continue
        seen.add((u, v))
        ax.plot([xy[u][0], xy[v][0]], [xy[u][1], xy[v][1]], color=cmap(kinds.index(k) % 10), lw=0.6, alpha=0.6,
                zorder=1)
    for k in kinds:
        ax.plot([], [], color=cmap(kinds.index(k) % 10), label=f"{k} link")
    used = {m.vertex[e] for e in eps}
    style = {ENDPOINT: ("o", 14), NIC: ("s", 12), HUB: ("D", 18), SWITCH: ("s", 40), ROUTER: ("h", 40)}
    for kind, (mk, size) in style.items():
        vs = [i for i, kk in enumerate(t.kind) if kk == kind]
        if vs:
            ax.scatter([xy[i][0] for i in vs], [xy[i][1] for i in vs], marker=mk, s=size, zorder=2, label=kind,
                       c=["black" if (kind == ENDPOINT and i in used) else "white" for i in vs],
                       edgecolors="black", linewidths=0.6)
    ax.set_title(f"{spec.label()}: P = {P} (filled endpoints hold ranks)")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _layered_layout(t) -> list[tuple[float, float]]:
    levels = sorted(set(t.level))
    rows = {lv: [i for i, x in enumerate(t.level) if x == lv] for lv in levels}
    xy = [(0.0, 0.0)] * t.n_vertices
    for y, lv in enumerate(levels):
        vs = rows[lv]
        for j, v in enumerate(vs):
            xy[v] = ((j + 0.5) / len(vs), float(y))
    return xy


def _circle_layout(m) -> list[tuple[float, float]]:
    f, t = m.fabric, m.topo
    xy = _layered_layout(t)
    n_r = f.g * f.a
    for r in range(n_r):
        G, i = divmod(r, f.a)
        cg = 2 * np.pi * G / f.g
        ci = 2 * np.pi * i / f.a
        cx, cy = 3 * np.cos(cg), 3 * np.sin(cg)
        xy[f.router_v[r]] = (cx + np.cos(ci), cy + np.sin(ci))
        for h in range(f.p):
            ang = ci + (h - (f.p - 1) / 2) * 0.25 / max(1, f.a / 4)
            xy[f.hosts[r * f.p + h]] = (cx + 1.5 * np.cos(ang), cy + 1.5 * np.sin(ang))
    return xy
