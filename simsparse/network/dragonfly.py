"""Dragonfly as Cray Aries builds it (Kim, Dally, Scott, Abts, ISCA 2008;
Alverson et al., "Cray XC Series Network", Cray white paper WP-Aries01-1112).

A **group** has ``chassis x routers_per_chassis`` routers in a 2-D all-to-all:
rank-1 links join every pair of routers of a chassis, rank-2 links join the
routers in the same slot of every pair of chassis (Aries: 3 parallel cables,
modelled as one link of 3x the bandwidth). Each router has
``nodes_per_router`` nodes and ``global_links_per_router`` rank-3 ports; the
group's ports are spread evenly over the other groups ("consecutive"
arrangement: port q of group A goes to group ``A + 1 + q mod (g-1)``), so
every pair of groups has ``m = floor(a h / (g-1))`` rank-3 links.

Routing (per message, on one path chosen when it is injected; real Aries
adapts per packet, so here a single message never spreads: spreading comes
from the many messages of an all-to-all or between the same two routers):

* ``minimal``: inside a group at most one rank-1 then one rank-2 hop; between
  groups to the router holding the ``(dst mod m)``-th link to the destination
  group, across it, then minimally inside the destination group;
* ``valiant`` (Valiant and Brebner 1981, as Kim et al. apply it to groups):
  between groups, minimally to a random intermediate group (uniform over the
  others, seeded), then minimally to the destination. Inside a group, to a
  random intermediate router of the group (uniform over the routers other
  than source and destination) then to the destination, each leg minimal
  (so 2 to 4 local hops instead of 1 or 2), as Aries routes non-minimally
  inside a group and as CODES' Cray XC model (``dragonfly-custom``, Mubarak
  et al.) does; traffic between nodes of the same router stays on the router;
* ``ugal`` (Universal Globally-Adaptive Load-balanced, Singh 2005): per
  message, draw a Valiant candidate (an intermediate group, or inside a
  group an intermediate router) and compare it with the minimal path:

  - between groups, take it only if
    ``hops_val x (q_val + 1) < hops_min x (q_min + 1)``, hops counting the
    route's links and q the flows active on the path's first rank-3 link
    when the message starts (a global view of the load, i.e. UGAL-G on flows
    rather than queues);
  - inside a group, with no hop penalty: a message whose minimal path is
    idle goes minimally (no detour can be lighter: it crosses a link of each
    kind the minimal path has); otherwise it takes the candidate unless the
    minimal path is strictly lighter. A path's load is
    ``max (flows + 1) / bandwidth`` over its rank-1/rank-2 links, the time
    per byte of the share a new flow would get on its worst link (rank-2
    links are 3 cables wide). Aries sends a packet to the lightest-loaded
    candidate after a bias, and its increasingly-minimal-bias routing
    prefers non-minimal paths at the injection point (Cray patent
    US 9,577,918, Bataineh, Court and Roweth; NERSC: on a quiet network a
    message takes the shortest path, ``ADAPTIVE_0`` is the least bias
    towards minimal). A hop-weighted rule here lets the one rank-1 link
    between two routers collect twice the flows of a 4-hop detour, whose
    flows then finish last (the all-to-all between two routers of a chassis
    ran at 17-28 GB/s instead of 28-41, of 40.8 possible).

  A single message is still one flow on one path: a lone message between
  two routers of a chassis gets one rank-1 link (5.25 GB/s); only the many
  messages of an all-to-all spread.
"""
from __future__ import annotations

import math

from .topology import NIC, ROUTER, Fabric, Topology


class Dragonfly(Fabric):
    """A dragonfly of ``groups`` groups; see the module docstring."""

    watch_kind = "rank3"   # widened to every router-to-router link when a group has room to misroute

    def __init__(self, groups: int, chassis_per_group: int = 6, routers_per_chassis: int = 16,
                 nodes_per_router: int = 4, global_links_per_router: int = 10,
                 injection_bw_Bps: float = 10.2e9, rank1_bw_Bps: float = 5.25e9, rank2_bw_Bps: float = 15.75e9,
                 rank3_bw_Bps: float = 4.7e9, injection_latency_s: float = 0.0, rank1_latency_s: float = 0.0,
                 rank2_latency_s: float = 0.0, rank3_latency_s: float = 0.0, routing: str = "minimal",
                 name: str = "dragonfly"):
        if routing not in ("minimal", "valiant", "ugal"):
            raise ValueError(f"routing = {routing!r}; allowed: minimal, valiant, ugal")
        C, S, p, h, g = chassis_per_group, routers_per_chassis, nodes_per_router, global_links_per_router, groups
        a = C * S
        m = (a * h) // (g - 1) if g > 1 else 0
        if g > 1 and m == 0:
            raise ValueError(f"{g} groups need at least {g - 1} global ports per group; a group has {a * h} "
                             f"({a} routers x {h})")
        self.a, self.C, self.S, self.p, self.g, self.m = a, C, S, p, g, m
        self.routing = routing
        self.local = routing != "minimal" and a > 2   # an intermediate router exists inside a group
        self.adaptive = routing != "minimal" and (g > 2 or self.local)
        if self.local:
            self.watch_kind = ("rank1", "rank2", "rank3")
        topo = Topology(name)
        self.router_v = [topo.vertex(ROUTER, f"g{G}.c{r // S}.s{r % S}", 3) for G in range(g) for r in range(a)]
        host_v = [topo.vertex(NIC, f"h{i}", 2) for i in range(g * a * p)]
        for i, v in enumerate(host_v):
            topo.duplex(v, self.router_v[i // p], injection_bw_Bps, injection_latency_s, "injection")
        for G in range(g):
            base = G * a
            for r in range(a):
                c, s = divmod(r, S)
                for s2 in range(S):
                    if s2 != s:
                        topo.link(self.router_v[base + r], self.router_v[base + c * S + s2], rank1_bw_Bps,
                                  rank1_latency_s, "rank1")
                for c2 in range(C):
                    if c2 != c:
                        topo.link(self.router_v[base + r], self.router_v[base + c2 * S + s], rank2_bw_Bps,
                                  rank2_latency_s, "rank2")
        # rank-3: gl[A][B] = the m link ids from group A to group B, each with its routers
        self.gl = [[[] for _ in range(g)] for _ in range(g)]
        for A in range(g):
            for q in range(m * (g - 1)):
                off, kk = q % (g - 1) + 1, q // (g - 1)
                B = (A + off) % g
                q2 = (g - off - 1) + kk * (g - 1)
                u, v = self.router_v[A * a + q // h], self.router_v[B * a + q2 // h]
                if (u, v) in topo._index:  # parallel cables between the same two routers: one wider link
                    lid = topo.lid(u, v)
                    topo.bw[lid] += rank3_bw_Bps
                else:
                    lid = topo.link(u, v, rank3_bw_Bps, rank3_latency_s, "rank3")
                self.gl[A][B].append((A * a + q // h, B * a + q2 // h, lid))
        super().__init__(topo, host_v)
        self._cache: dict = {}
        self._lcache: dict = {}   # (ra, rb, intermediate router or -1) -> [(local link id, 1 / bandwidth)]

    @classmethod
    def groups_for(cls, hosts: int, chassis_per_group: int, routers_per_chassis: int, nodes_per_router: int) -> int:
        return max(1, math.ceil(hosts / (chassis_per_group * routers_per_chassis * nodes_per_router)))

    # -- routing ---------------------------------------------------------------------
    def _intra(self, ra: int, rb: int) -> list[int]:
        """Router indices of the minimal path ra -> rb inside one group
        (rank-1 first, then rank-2), both ends included."""
        if ra == rb:
            return [ra]
        S = self.S
        base = ra - ra % self.a
        c1, s1 = divmod(ra - base, S)
        c2, s2 = divmod(rb - base, S)
        if c1 == c2 or s1 == s2:
            return [ra, rb]
        return [ra, base + c1 * S + s2, rb]

    def _via(self, ra: int, ri: int, rb: int) -> list[int]:
        """Router indices of the non-minimal path ra -> ri -> rb inside one
        group: minimally to ri, then minimally to rb. A leg whose rank-1-first
        corner is the other end of the path turns at its rank-2-first corner
        instead, so no router is visited twice."""
        S = self.S
        base = ra - ra % self.a
        c1, s1 = divmod(ra - base, S)
        ci, si = divmod(ri - base, S)
        c2, s2 = divmod(rb - base, S)
        out = [ra]
        if ci != c1 and si != s1:
            x = base + c1 * S + si
            out.append(x if x != rb else base + ci * S + s1)
        out.append(ri)
        if ci != c2 and si != s2:
            y = base + ci * S + s2
            out.append(y if y != ra else base + c2 * S + si)
        out.append(rb)
        return out

    def _local(self, ra: int, rb: int, ri: int) -> list[tuple[int, float]]:
        """(id, 1 / bandwidth) of each rank-1/rank-2 link of the path ra -> rb
        inside a group, minimal (ri = -1) or through router ri (cached)."""
        ck = (ra, rb, ri)
        hit = self._lcache.get(ck)
        if hit is None:
            rs = self._intra(ra, rb) if ri < 0 else self._via(ra, ri, rb)
            hit = self._lcache[ck] = [(x, 1.0 / self.topo.bw[x])
                                      for x in self.topo.path([self.router_v[r] for r in rs])]
        return hit

    def _leg(self, ra: int, A: int, B: int, k: int) -> tuple[list[int], int]:
        """Routers from ra to the landing router in group B over the k-th
        A->B global link, and that link's id."""
        gw, land, lid = self.gl[A][B][k % self.m]
        return self._intra(ra, gw) + [land], lid

    def route(self, a: int, b: int, key=None) -> list[int]:
        ck = (a, b, key)
        hit = self._cache.get(ck)
        if hit is not None:
            return hit
        ra, rb = a // self.p, b // self.p
        A, B = ra // self.a, rb // self.a
        if A == B:
            rs = self._intra(ra, rb) if key is None else self._via(ra, -1 - key, rb)
        elif key is None:
            rs, _ = self._leg(ra, A, B, b)
            rs = rs + self._intra(rs[-1], rb)[1:]
        else:
            rs, _ = self._leg(ra, A, key, b)
            rs2, _ = self._leg(rs[-1], key, B, b)
            rs = rs + rs2[1:] + self._intra(rs2[-1], rb)[1:]
        rv = self.router_v
        out = self.topo.path([self.hosts[a]] + [rv[r] for r in rs] + [self.hosts[b]])
        if self.adaptive:   # (its choices read routes again; a flow model keeps each route it asked for)
            self._cache[ck] = out
        return out

    def select(self, a: int, b: int, load, rng):
        """The route key: None (minimal), an intermediate group (between
        groups) or ``-1 - router`` (an intermediate router inside a group)."""
        if self.routing == "minimal":
            return None
        ra, rb = a // self.p, b // self.p
        A, B = ra // self.a, rb // self.a
        if A == B:
            if ra == rb or not self.local:
                return None
            base = A * self.a
            if self.routing == "valiant":
                return -1 - (base + _skip(rng.randrange(self.a - 2), ra - base, rb - base))
            # see the module docstring: minimal if its path is idle (every detour crosses a link of each
            # kind the minimal path has, so none is lighter), else the candidate unless minimal is lighter;
            # a path's load is its worst link's (flows + 1) / bandwidth, the time per byte of a fair share
            lm = self._local(ra, rb, -1)
            for x, _ in lm:
                if load[x]:
                    break
            else:
                return None
            ri = base + _skip(rng.randrange(self.a - 2), ra - base, rb - base)
            q_min = max([(load[x] + 1) * inv for x, inv in lm])
            q_val = max([(load[x] + 1) * inv for x, inv in self._local(ra, rb, ri)])
            return -1 - ri if q_val <= q_min * (1 + 1e-12) else None
        if self.g < 3:
            return None
        inter = _skip(rng.randrange(self.g - 2), A, B)
        if self.routing == "valiant":
            return inter
        q_min = load[self.gl[A][B][b % self.m][2]]
        q_val = load[self.gl[A][inter][b % self.m][2]]
        if len(self.route(a, b, inter)) * (q_val + 1) < len(self.route(a, b)) * (q_min + 1):
            return inter
        return None


def _skip(i: int, A: int, B: int) -> int:
    """The i-th index (group or router) that is neither A nor B."""
    for x in sorted((A, B)):
        if i >= x:
            i += 1
    return i
