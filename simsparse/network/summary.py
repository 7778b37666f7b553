"""What ``simsparse topo`` prints and draws: the machine a network spec
builds for P ranks, where the ranks sit on it, and its counts, bisection
bandwidth and diameter.

* **machine**: a preset may fix its size (Piz Daint has 14 groups whatever P
  is); the ranks then occupy a small part of it, which ``placement`` names
  (``ranks 0-3 on nodes 0-3 at router 0 of group 0``);
* **bisection bandwidth** (of the whole machine): the maximum flow (scipy)
  from the first half of the endpoints (in index order) to the second half,
  one direction. This is the cut between the two halves a linear placement
  uses, an upper bound on the minimum over all bisections, and equal to it
  for these symmetric topologies;
* **diameter**: the most links on a shortest path between two endpoints of
  the machine, and between two of the ranks' endpoints (routing may use
  longer paths, e.g. Valiant).

The drawing shows the part of the machine that holds the ranks: their nodes
and, on a dragonfly, only the routers (and groups) that host them, with the
links between those; when that is still too much to draw, one vertex per
group with the number of global links between groups.
"""
from __future__ import annotations

import re

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow, shortest_path

from .topology import ENDPOINT, HUB, NIC, ROUTER, SWITCH

DRAW_LIMIT = 600  # vertices
RUNS_SHOWN = 8    # placement lines before the middle is elided


def summary(spec, P: int) -> dict:
    if P < 1:
        raise ValueError(f"P = {P}: a machine needs at least 1 rank")
    m, eps = spec.machine(P)
    t = m.topo
    ends = [m.vertex[e] for e in range(m.n_endpoints)]
    rank_ends = [m.vertex[int(e)] for e in eps]
    info = {
        "network": f"{spec.label()} ({spec.model}" + (f", {spec.routing} routing)" if hasattr(spec, "routing") else ")"),
        "ranks": f"{P}, placement {getattr(spec, 'placement', 'linear')}, on {len(set(int(e) // m.G for e in eps))} "
                 f"of the machine's {m.nodes} nodes" + (f" ({m.G} GPUs per node)" if m.G > 1 else ""),
    }
    fixed = _fixed_size(spec, P)
    if fixed:
        info["machine"] = fixed
    info["placement"] = placement(m, eps)
    info.update({
        "endpoints": m.n_endpoints,
        "nodes": m.nodes,
        "nics": t.count(NIC) if (m.G > 1 or m.nics > 1) else m.nodes,
        "switches": t.count(SWITCH),
        "routers": t.count(ROUTER),
        "node_hubs": t.count(HUB),
        "links": t.n_links,
        "bisection_GBps": bisection_bandwidth(t, ends) / 1e9,
        "diameter_hops": diameter(t, ends),
        "rank_diameter_hops": diameter(t, rank_ends),
    })
    if m.n_endpoints > P:
        info["note"] = "the counts from endpoints to diameter_hops are of the whole machine; " \
                       "rank_diameter_hops is between the ranks' endpoints"
    return info


def _fixed_size(spec, P: int) -> str | None:
    """Why the machine is larger than P ranks need, if it is."""
    for key in ("groups", "nodes"):
        val = getattr(spec, key, None)
        if val is not None:
            return f"the network fixes {key} = {val}, whatever P is"
    return None


# -- where the ranks sit ---------------------------------------------------------------------

def _attachments(m) -> dict[int, int]:
    """Fabric host vertex -> the switch or router it hangs off."""
    t = m.topo
    hosts = set(m.fabric.hosts)
    att = {}
    for u, v in zip(t.src, t.dst):
        if u in hosts and u not in att and t.kind[v] in (SWITCH, ROUTER):
            att[u] = v
    return att


def where(m, v: int) -> str:
    """A switch or router in words (a dragonfly router by its group)."""
    t, f = m.topo, m.fabric
    hit = re.fullmatch(r"g(\d+)\.c(\d+)\.s(\d+)", t.label[v])
    if t.kind[v] == ROUTER and hit and hasattr(f, "S"):
        G, c, s = map(int, hit.groups())
        return f"router {c * f.S + s} of group {G}"
    return f"{t.kind[v]} {t.label[v]}"


def _span(a: int, b: int, word: str = "") -> str:
    """``rank 3`` or ``ranks 0-3`` (without a word: ``3``, ``0-3``)."""
    if not word:
        return str(a) if a == b else f"{a}-{b}"
    return f"{word} {a}" if a == b else f"{word}es {a}-{b}" if word.endswith("h") else f"{word}s {a}-{b}"


def placement(m, eps) -> list[str]:
    """Runs of consecutive ranks on consecutive nodes at one switch/router."""
    att = _attachments(m)
    runs = []  # [first rank, last rank, first node, last node, attachment]
    for r, e in enumerate(int(x) for x in eps):
        node, sw = e // m.G, att.get(m.fabric.hosts[m.host(e)])
        last = runs[-1] if runs else None
        if last and last[4] == sw and last[1] == r - 1 and node in (last[3], last[3] + 1):
            last[1], last[3] = r, node
        else:
            runs.append([r, r, node, node, sw])
    if len(runs) > RUNS_SHOWN and hasattr(m.fabric, "router_v"):
        return _placement_by_group(m, runs)
    lines = []
    for r0, r1, n0, n1, sw in runs:
        lines.append(f"{_span(r0, r1, 'rank')} on {_span(n0, n1, 'node')}"
                     + (f" at {where(m, sw)}" if sw is not None else ""))
    if len(lines) > RUNS_SHOWN:
        lines = lines[:RUNS_SHOWN - 2] + [f"... ({len(lines) - RUNS_SHOWN + 1} more)"] + lines[-1:]
    used = {sw for *_, sw in runs if sw is not None}
    if used:
        kind = m.topo.kind[next(iter(used))]
        groups = {where(m, v).split(" of ")[-1] for v in used} if kind == ROUTER else set()
        plural = "" if len(used) == 1 else "es" if kind == SWITCH else "s"
        lines.append(f"the ranks use {len(used)} {kind}{plural}"
                     + (f" in {len(groups)} group{'s' if len(groups) > 1 else ''}" if groups else "")
                     + f" of the machine's {m.topo.count(kind)}")
    return lines


def _placement_by_group(m, runs) -> list[str]:
    """A dragonfly's runs merged per group: ``ranks 0-383 on nodes 0-383 at routers 0-95 of group 0``."""
    f = m.fabric
    rix = {v: i for i, v in enumerate(f.router_v)}
    merged = []  # [r0, r1, n0, n1, group, first router, last router, routers]
    for r0, r1, n0, n1, sw in runs:
        G, ri = divmod(rix[sw], f.a)
        last = merged[-1] if merged else None
        if last and last[4] == G and last[1] == r0 - 1:
            last[1], last[3], last[6] = r1, n1, ri
            last[7].add(ri)
        else:
            merged.append([r0, r1, n0, n1, G, ri, ri, {ri}])
    lines = [f"{_span(r0, r1, 'rank')} on {_span(n0, n1, 'node')} at {_span(a, b, 'router')} of group {G}"
             + ("" if len(rs) == b - a + 1 else f" ({len(rs)} of them)")
             for r0, r1, n0, n1, G, a, b, rs in merged]
    if len(lines) > RUNS_SHOWN:
        lines = lines[:RUNS_SHOWN - 2] + [f"... ({len(lines) - RUNS_SHOWN + 1} more)"] + lines[-1:]
    used = {sw for *_, sw in runs}
    lines.append(f"the ranks use {len(used)} routers in {len({g[4] for g in merged})} groups of the machine's "
                 f"{len(f.router_v)} routers")
    return lines


# -- bisection and diameter -------------------------------------------------------------------

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


# -- drawing ----------------------------------------------------------------------------------

def _drawn(m, eps) -> set[int]:
    """The vertices to draw: the ranks' nodes (every GPU, hub and NIC of
    them), the fabric hosts of those nodes; on a dragonfly only the routers
    that host ranks (with all their hosts), elsewhere every switch."""
    t, f = m.topo, m.fabric
    nodes = sorted({int(e) // m.G for e in eps})
    keep = set()
    for n in nodes:
        keep.update(m.vertex[n * m.G + g] for g in range(m.G))
        keep.update(f.hosts[n * m.nics + i] for i in range(m.nics))
    if m.G > 1 or m.nics > 1:  # the nodes' PCIe roots and NVSwitches
        keep |= {w for u, w in zip(t.src, t.dst) if u in keep and t.kind[w] == HUB}
    if hasattr(f, "router_v"):  # a dragonfly: the routers of the ranks and their hosts
        att = _attachments(m)
        routers = {att[h] for h in keep if h in att}
        keep |= routers
        keep |= {h for h, r in att.items() if r in routers}
    else:
        keep |= {v for v, k in enumerate(t.kind) if k == SWITCH}
    return keep


def draw(spec, P: int, path) -> str:
    """Draw the part of the machine that holds the P ranks to a PNG; returns
    what was drawn, in words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..files import atomic_write

    m, eps = spec.machine(P)
    keep = _drawn(m, eps)
    fig, ax = plt.subplots(figsize=(12, 7))
    if len(keep) > DRAW_LIMIT:
        if not hasattr(m.fabric, "router_v"):
            raise ValueError(f"the {P} ranks' part of the machine has {len(keep)} vertices, too many to draw "
                             f"(limit {DRAW_LIMIT}); use a smaller -P")
        what = _draw_groups(ax, m, eps)
    else:
        what = _draw_vertices(ax, m, eps, keep, plt)
    ax.set_title(f"{spec.label()}: P = {P}, {what}")
    ax.set_axis_off()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=130, format="png"))
    plt.close(fig)
    return what


def _draw_vertices(ax, m, eps, keep: set[int], plt) -> str:
    t = m.topo
    xy = _dragonfly_layout(m, keep) if hasattr(m.fabric, "router_v") else _layered_layout(t, keep)
    kinds = sorted({k for u, v, k in zip(t.src, t.dst, t.lkind) if u in keep and v in keep})
    cmap = plt.get_cmap("tab10")
    seen = set()
    for u, v, k in zip(t.src, t.dst, t.lkind):
        if u not in keep or v not in keep or (v, u) in seen:
            continue
        seen.add((u, v))
        ax.plot([xy[u][0], xy[v][0]], [xy[u][1], xy[v][1]], color=cmap(kinds.index(k) % 10), lw=0.7, alpha=0.6,
                zorder=1)
    for k in kinds:
        ax.plot([], [], color=cmap(kinds.index(k) % 10), label=f"{k} link")
    used = {m.vertex[int(e)] for e in eps}
    style = {ENDPOINT: ("o", 14), NIC: ("s", 12), HUB: ("D", 18), SWITCH: ("s", 40), ROUTER: ("h", 40)}
    for kind, (mk, size) in style.items():
        vs = [i for i in sorted(keep) if t.kind[i] == kind]
        if vs:
            ax.scatter([xy[i][0] for i in vs], [xy[i][1] for i in vs], marker=mk, s=size, zorder=2, label=kind,
                       c=["black" if (kind == ENDPOINT and i in used) else "white" for i in vs],
                       edgecolors="black", linewidths=0.6)
    ax.legend(loc="upper right", fontsize=7)
    sws = [v for v in sorted(keep) if t.kind[v] in (SWITCH, ROUTER)]
    if len(sws) <= 40:
        for v in sws:
            ax.annotate(where(m, v).replace(" of ", "\n").replace("switch ", ""), xy[v], fontsize=6, ha="center",
                        xytext=(0, 6), textcoords="offset points", zorder=3)
    n_sw = len(sws)
    part = "" if len(keep) >= t.n_vertices else f" (of {t.n_vertices})"
    return f"{len(keep)} vertices{part}, {n_sw} switches/routers; filled endpoints hold ranks"


def _draw_groups(ax, m, eps) -> str:
    """A dragonfly too big to draw router by router: one vertex per group
    hosting ranks, edges weighted by the global links between groups."""
    f = m.fabric
    per_router = f.p
    by_group: dict[int, list[int]] = {}
    for r, e in enumerate(int(x) for x in eps):
        host = m.host(e)
        by_group.setdefault(host // (f.a * per_router), []).append(r)
    groups = sorted(by_group)
    xy = {G: _on_circle(i, len(groups), 3.0) for i, G in enumerate(groups)}
    for i, A in enumerate(groups):
        for B in groups[i + 1:]:
            n = len(f.gl[A][B])
            if n:
                ax.plot([xy[A][0], xy[B][0]], [xy[A][1], xy[B][1]], color="tab:blue", lw=0.5 + np.log2(1 + n) / 2,
                        alpha=0.5, zorder=1)
                mx, my = (xy[A][0] + xy[B][0]) / 2, (xy[A][1] + xy[B][1]) / 2
                ax.text(mx, my, str(n), fontsize=6, color="tab:blue", ha="center")
    for G in groups:
        rs = by_group[G]
        ax.scatter([xy[G][0]], [xy[G][1]], s=3200, marker="h", c="white", edgecolors="black", zorder=2)
        ax.text(xy[G][0], xy[G][1], f"group {G}\nranks {rs[0]}-{rs[-1]}\n({len(rs)})", fontsize=7, ha="center",
                va="center", zorder=3)
    ax.margins(0.12)
    return f"{len(groups)} groups hosting ranks (numbers on the edges: global links between two groups)"


def _on_circle(i: int, n: int, radius: float) -> tuple[float, float]:
    if n == 1:
        return 0.0, 0.0
    a = 2 * np.pi * i / n
    return radius * np.cos(a), radius * np.sin(a)


def _layered_layout(t, keep: set[int]) -> dict[int, tuple[float, float]]:
    rows: dict[int, list[int]] = {}
    for v in sorted(keep):
        rows.setdefault(t.level[v], []).append(v)
    xy = {}
    for y, lv in enumerate(sorted(rows)):
        vs = rows[lv]
        for j, v in enumerate(vs):
            xy[v] = ((j + 0.5) / len(vs), float(y))
    return xy


def _dragonfly_layout(m, keep: set[int]) -> dict[int, tuple[float, float]]:
    """Groups on a circle, each group's drawn routers on a circle around its
    centre, every router's hosts (and their GPUs) further out."""
    f, t = m.fabric, m.topo
    xy = _layered_layout(t, keep)
    routers = [r for r in range(len(f.router_v)) if f.router_v[r] in keep]
    groups = sorted({r // f.a for r in routers})
    centre = {G: _on_circle(i, len(groups), 3.0 + 0.15 * len(routers) / max(1, len(groups)) ** 0.5)
              for i, G in enumerate(groups)}
    att = _attachments(m)
    below: dict[int, list[int]] = {}  # host -> the endpoints and hubs drawn behind it
    for v in keep:
        if t.kind[v] in (ENDPOINT, HUB) and v not in att:
            below.setdefault(_host_of(m, v), []).append(v)
    for G in groups:
        mine = [r for r in routers if r // f.a == G]
        cx, cy = centre[G]
        for i, r in enumerate(mine):
            ca = 2 * np.pi * i / len(mine)
            rad = 0.0 if len(mine) == 1 else 1.0
            rx, ry = cx + rad * np.cos(ca), cy + rad * np.sin(ca)
            xy[f.router_v[r]] = (rx, ry)
            for h in range(f.p):  # the router's hosts fan out away from the group's centre
                hv = f.hosts[r * f.p + h]
                ang = ca + (h - (f.p - 1) / 2) * min(0.35, 2.4 / f.p)
                xy[hv] = (rx + 0.45 * np.cos(ang), ry + 0.45 * np.sin(ang))
                for j, w in enumerate(sorted(below.get(hv, []))):
                    xy[w] = (rx + (0.7 + 0.12 * j) * np.cos(ang), ry + (0.7 + 0.12 * j) * np.sin(ang))
    return xy


def _host_of(m, v: int) -> int | None:
    """The fabric host behind an endpoint or node hub (multi-GPU nodes)."""
    for n in range(m.nodes):
        gpus = [m.vertex[n * m.G + g] for g in range(m.G)]
        if v in gpus or (hasattr(m, "_hub") and m._hub[n] == v):
            return m.fabric.hosts[n * m.nics]
    return None
