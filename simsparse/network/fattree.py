"""Fat trees (folded Clos) of 2 or 3 levels, as InfiniBand clusters build them.

Structure (radix-k switches, the classic k-ary fat tree when every default
is taken; Leiserson 1985, Al-Fares et al. 2008):

* a **leaf** switch has ``d`` hosts (default k/2) and ``u = ceil(d / o)``
  uplinks, ``o`` the leaf oversubscription; the uplinks together carry
  ``d B / o`` (each ``B`` when ``d / o`` is an integer, else proportionally
  thinner, so the ratio is exact for any ``o``);
* **2 levels**: ``u`` spine switches, every leaf has one uplink to each; at
  most k leaves (the spine radix);
* **3 levels**: leaves are grouped in pods of ``lp`` leaves (default k/2)
  with ``u`` aggregation switches each (one uplink from every leaf of the pod
  to each); an aggregation switch has ``c = ceil(lp / o2)`` uplinks carrying
  ``lp B_up / o2``, ``o2`` the upper oversubscription; core plane j has ``c``
  switches and aggregation switch j of every pod links to each of them; at
  most k pods.

The tree is sized to the hosts asked for (``ceil(hosts / d)`` leaves); a
machine too big for the radix is an error that names the limit.

Routing is deterministic per (source, destination) pair, as InfiniBand's
linear forwarding tables make it:

* ``dmodk`` (destination-mod-k, Zahavi et al., "Optimized InfiniBand fat-tree
  routing for shift all-to-all communication patterns", CCPE 2010): going up
  from a leaf take uplink ``dst mod u``, from an aggregation switch uplink
  ``(dst div u) mod c``; the way down is then unique. A shift permutation on
  a full tree is contention-free;
* ``ecmp``: the uplink at each level from a hash of (src, dst, seed), as
  Ethernet ECMP hashes a flow's header.
"""
from __future__ import annotations

import math

from .topology import NIC, SWITCH, Fabric, Topology, mix

# InfiniBand 4x data rates after 64b/66b encoding (IBTA InfiniBand specification:
# FDR 14.0625 Gb/s per lane -> 54.5 Gb/s; EDR 100, HDR 200, NDR 400 Gb/s).
IB_RATES_Bps = {
    "FDR": 4 * 14.0625e9 * 64 / 66 / 8,   # 6.82 GB/s
    "EDR": 100e9 / 8,                      # 12.5 GB/s
    "HDR": 200e9 / 8,                      # 25 GB/s
    "NDR": 400e9 / 8,                      # 50 GB/s
}


class FatTree(Fabric):
    """A 2- or 3-level fat tree; see the module docstring."""

    def __init__(self, hosts: int, radix: int, levels: int = 2, link_bw_Bps: float = 12.5e9,
                 link_latency_s: float = 0.0, hosts_per_leaf: int | None = None, oversubscription: float = 1.0,
                 leaves_per_pod: int | None = None, upper_oversubscription: float = 1.0,
                 routing: str = "dmodk", seed: int = 0, name: str = "fattree"):
        if levels not in (2, 3):
            raise ValueError(f"levels = {levels}; allowed: 2 or 3")
        if routing not in ("dmodk", "ecmp"):
            raise ValueError(f"routing = {routing!r}; allowed: dmodk, ecmp")
        k, B, lat = radix, link_bw_Bps, link_latency_s
        d = hosts_per_leaf or k // 2
        u = math.ceil(d / oversubscription)
        bw_up = d * B / (oversubscription * u)
        if d + u > k:
            raise ValueError(f"a leaf with {d} hosts and {u} uplinks needs {d + u} ports; radix is {k}")
        n_leaves = math.ceil(hosts / d)
        topo = Topology(name)
        host_v = [topo.vertex(NIC, f"h{h}", 2) for h in range(hosts)]
        leaf_v = [topo.vertex(SWITCH, f"leaf{i}", 3) for i in range(n_leaves)]
        for h, v in enumerate(host_v):
            topo.duplex(v, leaf_v[h // d], B, lat, "host")
        self.d, self.u, self.levels, self.routing, self.seed = d, u, levels, routing, seed
        self.host_v, self.leaf_v = host_v, leaf_v
        if levels == 2:
            if n_leaves > k:
                raise ValueError(f"{hosts} hosts need {n_leaves} leaves of {d}, but a 2-level tree of radix {k} "
                                 f"has at most {k} leaves ({k * d} hosts); use levels: 3")
            self.spine_v = [topo.vertex(SWITCH, f"spine{j}", 4) for j in range(u)] if n_leaves > 1 else []
            for lv in leaf_v:
                for sv in self.spine_v:
                    topo.duplex(lv, sv, bw_up, lat, "uplink")
        else:
            lp = leaves_per_pod or k // 2
            c = math.ceil(lp / upper_oversubscription)
            bw_core = lp * bw_up / (upper_oversubscription * c)
            if lp + c > k:
                raise ValueError(f"an aggregation switch with {lp} leaves and {c} uplinks needs {lp + c} ports; "
                                 f"radix is {k}")
            n_pods = math.ceil(n_leaves / lp)
            if n_pods > k:
                raise ValueError(f"{hosts} hosts need {n_pods} pods of {lp * d}, but a 3-level tree of radix {k} "
                                 f"has at most {k} pods ({k * lp * d} hosts)")
            self.lp, self.c = lp, c
            self.agg_v = [[topo.vertex(SWITCH, f"agg{p}.{j}", 4) for j in range(u)] for p in range(n_pods)]
            self.core_v = [[topo.vertex(SWITCH, f"core{j}.{i}", 5) for i in range(c)] for j in range(u)] \
                if n_pods > 1 else []
            for i, lv in enumerate(leaf_v):
                for av in self.agg_v[i // lp]:
                    topo.duplex(lv, av, bw_up, lat, "uplink")
            for pod in self.agg_v:
                for j, av in enumerate(pod):
                    for cv in (self.core_v[j] if self.core_v else []):
                        topo.duplex(av, cv, bw_core, lat, "core")
        super().__init__(topo, host_v)

    def _up(self, src: int, dst: int) -> tuple[int, int]:
        """Uplink choices (leaf level, aggregation level) for src -> dst."""
        if self.routing == "dmodk":
            return dst % self.u, (dst // self.u) % getattr(self, "c", 1)
        return mix(src, dst, self.seed, 1) % self.u, mix(src, dst, self.seed, 2) % getattr(self, "c", 1)

    def route(self, a: int, b: int, key=None) -> list[int]:
        d = self.d
        la, lb = a // d, b // d
        hv, lv = self.host_v, self.leaf_v
        if la == lb:
            return self.topo.path([hv[a], lv[la], hv[b]])
        j, i = self._up(a, b)
        if self.levels == 2:
            return self.topo.path([hv[a], lv[la], self.spine_v[j], lv[lb], hv[b]])
        pa, pb = la // self.lp, lb // self.lp
        if pa == pb:
            return self.topo.path([hv[a], lv[la], self.agg_v[pa][j], lv[lb], hv[b]])
        return self.topo.path([hv[a], lv[la], self.agg_v[pa][j], self.core_v[j][i], self.agg_v[pb][j], lv[lb], hv[b]])
