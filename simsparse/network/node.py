"""Multi-GPU nodes on a fabric: the endpoints the flow model routes between.

Each node has G GPUs (one endpoint, i.e. one rank slot, per GPU) and
``nics`` NICs, which are the fabric's hosts. GPU g sends off-node through NIC
``g mod nics`` (the NIC nearest to it, as NCCL and the DGX port map pair
them). Inside a node (G > 1):

* every GPU and every NIC hangs off the node's PCIe root by a PCIe link each
  way, so off-node traffic of all GPUs shares the NIC(s): GPU -> root -> NIC;
* GPU-to-GPU traffic goes by ``intra``: ``pcie`` (GPU -> root -> GPU, sharing
  the GPUs' PCIe links with NIC traffic), ``nvlink`` (a direct link per GPU
  pair) or ``nvswitch`` (GPU -> NVSwitch -> GPU, one port per GPU). It never
  touches a NIC.

With one GPU and one NIC per node the GPU is the host itself: the GPU-NIC
PCIe hop is not modelled (it is faster than the NIC on the machines here).
"""
from __future__ import annotations

from .topology import ENDPOINT, HUB, Fabric


class Machine:
    """Endpoints on nodes on a fabric; ``route(a, b, key)`` gives link ids
    between endpoint indices (node-major: endpoint e is GPU e % G of node e // G)."""

    def __init__(self, fabric: Fabric, nodes: int, gpus_per_node: int = 1, nics_per_node: int = 1,
                 intra: str = "pcie", pcie_bw_Bps: float = 16e9, nvlink_bw_Bps: float | None = None,
                 intra_latency_s: float = 0.0):
        G, nics = gpus_per_node, nics_per_node
        if len(fabric.hosts) != nodes * nics:
            raise ValueError(f"fabric has {len(fabric.hosts)} hosts, expected {nodes} nodes x {nics} NICs")
        if intra in ("nvlink", "nvswitch") and not nvlink_bw_Bps:
            raise ValueError(f"intra = {intra!r} needs nvlink_bw_Bps")
        self.fabric, self.topo = fabric, fabric.topo
        self.nodes, self.G, self.nics, self.intra = nodes, G, nics, intra
        self.adaptive = fabric.adaptive
        topo = self.topo
        if G == 1 and nics == 1:
            for h in fabric.hosts:
                topo.kind[h] = ENDPOINT
            self.vertex = list(fabric.hosts)
        else:
            self.vertex, self._hub, self._up, self._down = [], [], [], []
            for n in range(nodes):
                root = topo.vertex(HUB, f"n{n}.pcie", 1)
                nic = [fabric.hosts[n * nics + i] for i in range(nics)]
                for h in nic:
                    topo.duplex(root, h, pcie_bw_Bps, intra_latency_s, "pcie")
                gpus = [topo.vertex(ENDPOINT, f"n{n}.gpu{g}", 0) for g in range(G)]
                for g, v in enumerate(gpus):
                    topo.duplex(v, root, pcie_bw_Bps, intra_latency_s, "pcie")
                    self._up.append(topo.path([v, root, nic[g % nics]]))
                    self._down.append(topo.path([nic[g % nics], root, v]))
                hub = root
                if intra == "nvswitch":
                    hub = topo.vertex(HUB, f"n{n}.nvswitch", 1)
                    for v in gpus:
                        topo.duplex(v, hub, nvlink_bw_Bps, intra_latency_s, "nvlink")
                elif intra == "nvlink":
                    for va in gpus:
                        for vb in gpus:
                            if va != vb:
                                topo.link(va, vb, nvlink_bw_Bps, intra_latency_s, "nvlink")
                self._hub.append(hub)
                self.vertex.extend(gpus)
        topo.freeze()

    @property
    def n_endpoints(self) -> int:
        return self.nodes * self.G

    def host(self, e: int) -> int:
        """The fabric host (NIC) endpoint e sends through."""
        return (e // self.G) * self.nics + (e % self.G) % self.nics

    def route(self, a: int, b: int, key=None) -> list[int]:
        G = self.G
        if G == 1 and self.nics == 1:
            return self.fabric.route(a, b, key)
        na, nb = a // G, b // G
        if na == nb:
            va, vb = self.vertex[a], self.vertex[b]
            if self.intra == "nvlink":
                return [self.topo.lid(va, vb)]
            return self.topo.path([va, self._hub[na], vb])
        return self._up[a] + self.fabric.route(self.host(a), self.host(b), key) + self._down[b]

    def select(self, a: int, b: int, load, rng):
        if a // self.G == b // self.G:
            return None
        return self.fabric.select(self.host(a), self.host(b), load, rng)
