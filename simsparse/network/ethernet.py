"""Ethernet: one switch (star). A leaf-spine Ethernet is a 2-level
:class:`~.fattree.FatTree` with ECMP routing; the TCP/IP stack's cost per
message is the LogGP overhead ``o`` of the flow model (see :mod:`.spec`)."""
from __future__ import annotations

from .topology import NIC, SWITCH, Fabric, Topology


class Star(Fabric):
    """Every host on one non-blocking switch: host -> switch -> host. The only
    contention is at the hosts' own links (incast, outcast)."""

    def __init__(self, hosts: int, link_bw_Bps: float, link_latency_s: float = 0.0, ports: int | None = None,
                 name: str = "star"):
        if ports is not None and hosts > ports:
            raise ValueError(f"{hosts} hosts do not fit on one switch of {ports} ports")
        topo = Topology(name)
        host_v = [topo.vertex(NIC, f"h{h}", 2) for h in range(hosts)]
        self.switch = topo.vertex(SWITCH, "switch", 3)
        for v in host_v:
            topo.duplex(v, self.switch, link_bw_Bps, link_latency_s, "host")
        super().__init__(topo, host_v)

    def route(self, a: int, b: int, key=None) -> list[int]:
        return self.topo.path([self.hosts[a], self.switch, self.hosts[b]])
