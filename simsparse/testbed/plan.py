"""What an emulated cluster is made of: the simulator's own machine, as
namespaces, bridges, veth pairs and shaped egress queues.

:func:`plan` takes an Ethernet network description (the YAML the simulator
reads) and P, builds the simulator's :class:`~simsparse.network.node.Machine`
for P ranks, and maps it one to one:

* every endpoint that holds a rank is a **host**: a network namespace whose
  only interface ``eth0`` has an address in 198.18.0.0/15 (RFC 2544's range
  for benchmarking, never routed);
* every switch vertex is a Linux **bridge** in one ``fabric`` namespace;
* every duplex link is a **veth pair**: host <-> switch (``eth0`` <-> port
  ``h<e>``) or switch <-> switch (``s<u>-<v>`` <-> ``s<v>-<u>``);
* every directed link is the **egress queue** of the veth end it leaves from
  (:class:`Queue`): the link's rate, its latency and a queue. The queue of a
  host's own link is its NIC's transmit queue (deep: TCP's small-queue
  limit, not drops, bounds it); a switch's is its output port buffer
  (``port_buffer_B``), where incast queues and, when full, drops.

Rates are on the wire: a link whose TCP payload rate is B (the simulator's
link bandwidth) is shaped to ``B / payload_efficiency`` and charged 24 bytes
per frame that Linux does not see (preamble, SFD, FCS's share beyond the
14-byte header, inter-frame gap), so a full frame costs ``mtu + 38`` bytes of
line time as on real Ethernet (:data:`~simsparse.network.spec.ETHERNET_FRAMING_B`).

Bridges forward on a spanning tree, so the machine must be a tree (one path
between any two hosts): a star, or leaves under one spine. Routes in a tree
are unique, so the simulator and the bridges agree on every path.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from ..network.spec import ETHERNET_FRAMING_B, EthernetSpec
from ..network.topology import ENDPOINT, SWITCH

#: the testbed's addresses (RFC 2544: benchmarking, not routed on the Internet)
SUBNET = ipaddress.ip_network("198.18.0.0/15")
#: bytes per frame the wire carries and Linux does not count (skb length includes the 14-byte header)
WIRE_EXTRA_B = ETHERNET_FRAMING_B - 14
#: a host NIC's transmit queue: deep enough never to drop (TCP Small Queues bound a socket to 4 MiB
#: here, net.ipv4.tcp_limit_output_bytes; several sockets share the queue)
HOST_QUEUE_B = 16 << 20
#: namespace names start with this, and nothing else is ever touched
PREFIX = "simsparse-tb-"


class PlanError(ValueError):
    """A network description the testbed cannot build (one sentence)."""


@dataclass(frozen=True)
class Queue:
    """The egress of one veth end: one direction of a link."""

    ns: str            # namespace key: "fabric" or "h<endpoint>"
    dev: str
    rate_Bps: float    # wire rate (line rate)
    latency_s: float
    limit_B: int
    link: int          # the simulator's link id
    role: str          # "host" (NIC transmit queue) or "port" (switch output port)


@dataclass(frozen=True)
class Veth:
    a_ns: str
    a_dev: str
    a_bridge: str | None
    b_ns: str
    b_dev: str
    b_bridge: str | None


@dataclass
class Plan:
    """Everything :mod:`.host` creates, by namespace key (see :meth:`netns`)."""

    name: str
    P: int
    mtu: int
    burst_B: int                       # every queue's token bucket (wire bytes)
    endpoints: list[int]               # per rank
    hosts: dict[str, str]              # namespace key -> address (with prefix length)
    bridges: list[str]
    veths: list[Veth]
    queues: list[Queue]
    spec: dict = field(default_factory=dict)

    def netns(self, key: str) -> str:
        """The real namespace name of a key ("fabric", "h3")."""
        return f"{PREFIX}{self.name}-{key}"

    def rank_netns(self, rank: int) -> str:
        return self.netns(f"h{self.endpoints[rank]}")

    def rank_address(self, rank: int) -> str:
        return self.hosts[f"h{self.endpoints[rank]}"].split("/")[0]

    def namespaces(self) -> list[str]:
        return [self.netns("fabric")] + [self.netns(k) for k in self.hosts]


def testbed_name(spec: EthernetSpec) -> str:
    """A short name for namespaces: the spec's name, cleaned."""
    raw = spec.name or f"{spec.topology}-{spec.link_bw_Bps * 8 / 1e6:g}M"
    name = re.sub(r"[^a-zA-Z0-9]+", "-", raw).strip("-").lower()[:24]
    return name or "testbed"


def plan(spec: EthernetSpec, P: int) -> Plan:
    """The testbed of ``spec`` for P ranks (see the module docstring)."""
    if not isinstance(spec, EthernetSpec):
        raise PlanError(f"the testbed emulates Ethernet; network model {spec.model!r} is not Ethernet "
                        f"(use model: ethernet, topology star or leafspine)")
    if spec.gpus_per_node != 1:
        raise PlanError(f"the testbed puts one rank in each host namespace; gpus_per_node = {spec.gpus_per_node} "
                        f"needs 1")
    if P < 1:
        raise PlanError(f"P = {P}: a testbed needs at least one rank")
    machine, eps = spec.machine(P)
    topo = machine.topo
    eff = spec.payload_efficiency()
    used = {int(e) for e in eps}
    hosts = {f"h{e}": f"{SUBNET.network_address + 1 + e}/{SUBNET.prefixlen}" for e in sorted(used)}
    vertex_ns, dev_of, bridges = {}, {}, []
    for v, kind in enumerate(topo.kind):
        if kind == SWITCH:
            bridges.append(f"br{v}")
        elif kind != ENDPOINT:
            raise PlanError(f"vertex {topo.label[v]} of kind {kind!r} cannot be emulated (hosts and switches only)")
    host_of = {v: e for e, v in enumerate(machine.vertex)}
    veths: list[Veth] = []
    queues: list[Queue] = []
    pairs = sorted({(min(u, v), max(u, v)) for u, v in zip(topo.src, topo.dst)})
    switch_links = 0
    for u, v in pairs:
        ku, kv = topo.kind[u], topo.kind[v]
        if ku == ENDPOINT and kv == ENDPOINT:
            raise PlanError("hosts joined without a switch cannot be emulated")
        if ku == SWITCH and kv == SWITCH:
            switch_links += 1
            veths.append(Veth("fabric", f"s{u}-{v}", f"br{u}", "fabric", f"s{v}-{u}", f"br{v}"))
            vertex_ns[(u, v)], dev_of[(u, v)] = "fabric", f"s{u}-{v}"
            vertex_ns[(v, u)], dev_of[(v, u)] = "fabric", f"s{v}-{u}"
            continue
        h, s = (u, v) if ku == ENDPOINT else (v, u)
        e = host_of[h]
        if e not in used:
            continue
        veths.append(Veth("fabric", f"h{e}", f"br{s}", f"h{e}", "eth0", None))
        vertex_ns[(h, s)], dev_of[(h, s)] = f"h{e}", "eth0"
        vertex_ns[(s, h)], dev_of[(s, h)] = "fabric", f"h{e}"
    if switch_links != len(bridges) - 1:
        raise PlanError(f"the testbed needs a loop-free tree (bridges forward on one path): this machine has "
                        f"{len(bridges)} switches and {switch_links} switch-to-switch links; with leafspine choose "
                        f"hosts_per_leaf and oversubscription so that every leaf has one uplink "
                        f"(ceil(hosts_per_leaf / oversubscription) = 1)")
    for lid, (u, v) in enumerate(zip(topo.src, topo.dst)):
        if (u, v) not in vertex_ns:
            continue  # a link of a host without a rank
        role = "host" if topo.kind[u] == ENDPOINT else "port"
        queues.append(Queue(vertex_ns[(u, v)], dev_of[(u, v)], float(topo.bw[lid]) / eff, float(topo.lat[lid]),
                            HOST_QUEUE_B if role == "host" else spec.port_buffer_B, lid, role))
    return Plan(testbed_name(spec), P, spec.mtu_B, burst_of(spec), [int(e) for e in eps], hosts, bridges, veths,
                queues, spec.model_dump())


def burst_of(spec: EthernetSpec) -> int:
    """The token bucket of every queue: the description's ``shaper_burst_B``,
    and at least two full frames (see :mod:`.host`)."""
    return max(spec.shaper_burst_B, 2 * (spec.mtu_B + ETHERNET_FRAMING_B))
