"""Validated network descriptions (the ``network:`` key of a config).

Every model shares the MPI protocol settings (eager/rendezvous switch); each
model adds its own keys. ``NETWORK_SPECS`` maps the ``model:`` value to its
schema: ``alphabeta`` (contention-free fast path) and the flow-level models
``fattree``, ``dragonfly`` and ``ethernet``, which share the node, placement
and LogGP keys of :class:`FlowSpecBase`.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..size_scale import SizeScale


def bandwidth_field(default: float, what: str):
    """A link's bandwidth key: bytes per second per direction, positive."""
    return Field(default, gt=0, description=f"{what} bandwidth per direction (bytes/s)")


def latency_field(what: str):
    """A link's latency key: seconds, default 0."""
    return Field(0.0, ge=0, description=f"latency of {what}")


class NetworkSpecBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="label for tables and plots")
    source: str | None = Field(None, description="where the numbers come from")
    eager_threshold_B: int = Field(65536, ge=0, description="messages up to this size are sent eagerly (MPI eager protocol)")
    rendezvous_rtt_s: float = Field(0.0, ge=0, description="extra RTS/CTS handshake time for larger (rendezvous) messages")
    unexpected_window_B: int | None = Field(
        None, ge=0, description="messages up to this size move when sent, before their receive is posted, because "
        "the transport buffers them at the receiver (TCP sockets: the receive window, net.ipv4.tcp_rmem); they "
        "still pay rendezvous_rtt_s past the eager threshold. Default: the eager threshold (RDMA rendezvous and "
        "shared-memory copies wait for the receive). `calibrate --testbed` measures it with a late receiver")

    def build(self):  # pragma: no cover - interface
        raise NotImplementedError

    def protocol(self) -> dict:
        """The MPI protocol settings, as :class:`~simsparse.backends.events.sim.Simulator` takes them."""
        return {"eager_threshold_B": self.eager_threshold_B, "rendezvous_rtt_s": self.rendezvous_rtt_s,
                "unexpected_window_B": self.unexpected_window_B}

    def label(self) -> str:
        return self.name or self.model

    def check_P(self, P: int) -> str | None:
        """Why this network cannot host P ranks, or None."""
        return None


class AlphaBetaSpec(NetworkSpecBase):
    """Contention-free alpha-beta network (see :mod:`simsparse.network.alphabeta`)."""

    model: Literal["alphabeta"] = "alphabeta"
    alpha_s: float = Field(1e-6, ge=0, description="per-message latency in seconds")
    bandwidth_Bps: float = Field(1e10, gt=0, description="per-endpoint bandwidth in bytes per second")
    size_scale: SizeScale | None = Field(
        None, description="[[bytes, factor], ...]: a message of m bytes takes (alpha_s + m / bandwidth_Bps) times "
        "the factor at m, interpolated in log size and constant beyond the ends (SMPI's piecewise factors). "
        "`simsparse calibrate` sets it where the measured exchanges leave the line by more than 15 %: through "
        "shared memory, eager copies, cache sizes and fresh receive buffers change the cost per byte")

    def build(self):
        from .alphabeta import AlphaBetaNetwork

        return AlphaBetaNetwork(self.alpha_s, self.bandwidth_Bps, self.size_scale)

    def label(self) -> str:
        return self.name or f"alphabeta(a={self.alpha_s:g}s,B={self.bandwidth_Bps:g}B/s)"


_MACHINES: dict = {}   # (topology keys as JSON, nodes) -> machine; building Piz Daint takes ~0.3 s
_MACHINE_CACHE_SIZE = 8


class FlowSpecBase(NetworkSpecBase):
    """Keys shared by the flow-level models: nodes, placement, LogGP overheads
    (see :mod:`simsparse.network.flow`, :mod:`.node`, :mod:`.topology`)."""

    gpus_per_node: int = Field(1, ge=1, le=64, description="GPUs (ranks) per node; they share the node's NIC(s)")
    nics_per_node: int = Field(1, ge=1, le=64, description="NICs per node; GPU g uses NIC g mod nics_per_node")
    intra: Literal["pcie", "nvlink", "nvswitch"] = Field(
        "pcie", description="GPU-to-GPU path inside a node: via the PCIe root, a direct NVLink per pair, or an NVSwitch")
    pcie_bw_Bps: float = Field(16e9, gt=0, description="PCIe bandwidth per direction of each GPU's and NIC's link to the root")
    nvlink_bw_Bps: float | None = Field(None, gt=0, description="NVLink bandwidth per direction: per GPU pair (nvlink) "
                                                                "or per GPU port (nvswitch)")
    intra_latency_s: float = latency_field("each link inside a node")
    placement: Literal["linear", "round_robin", "random", "list"] = Field(
        "linear", description="ranks onto endpoints: linear, round_robin (across nodes), random (placement_seed), "
                              "list (endpoints)")
    placement_seed: int = Field(0, ge=0, description="seed of the random placement")
    endpoints: list[int] | None = Field(None, description="endpoint index of every rank, for placement: list")
    send_overhead_s: float = Field(0.0, ge=0, description="LogGP o at the sender: time before a message enters the network")
    recv_overhead_s: float = Field(0.0, ge=0, description="LogGP o at the receiver: time after its last byte arrives")
    gap_s: float = Field(0.0, ge=0, description="LogGP g: least time between two messages entering the network "
                                                "from one endpoint")
    routing_seed: int = Field(0, ge=0, description="seed of random routing choices (Valiant, ECMP hash)")

    @model_validator(mode="after")
    def _consistent(self):
        if (self.placement == "list") != (self.endpoints is not None):
            raise ValueError("give 'endpoints' exactly when placement is 'list'")
        if self.gpus_per_node > 1 and self.intra != "pcie" and self.nvlink_bw_Bps is None:
            raise ValueError(f"intra = {self.intra!r} needs nvlink_bw_Bps")
        if self.nics_per_node > max(1, self.gpus_per_node):
            raise ValueError("nics_per_node must be at most gpus_per_node")
        return self

    # -- what each family provides ---------------------------------------------------
    def nodes_for(self, P: int) -> int:
        """Nodes in the machine that runs P ranks."""
        return math.ceil(P / self.gpus_per_node)

    def fabric(self, hosts: int):  # pragma: no cover - interface
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------
    def machine(self, P: int):
        """The :class:`~.node.Machine` for P ranks and every rank's endpoint
        (machines are cached by their spec and size)."""
        from .node import Machine
        from .topology import place

        nodes = self.nodes_for(P)
        if P > nodes * self.gpus_per_node:
            raise ValueError(f"P = {P} ranks do not fit on {nodes} nodes x {self.gpus_per_node} GPUs of "
                             f"{self.label()}")
        key = (self.model_dump_json(include=self._topology_keys()), nodes)
        m = _MACHINES.get(key)
        if m is None:
            m = Machine(self.fabric(nodes * self.nics_per_node), nodes, self.gpus_per_node, self.nics_per_node,
                        self.intra, self.pcie_bw_Bps, self.nvlink_bw_Bps, self.intra_latency_s)
            if len(_MACHINES) >= _MACHINE_CACHE_SIZE:
                _MACHINES.pop(next(iter(_MACHINES)))
            _MACHINES[key] = m
        return m, place(P, m.n_endpoints, self.gpus_per_node, self.placement, self.placement_seed, self.endpoints)

    def check_P(self, P: int) -> str | None:
        try:
            self.machine(P)
        except ValueError as e:
            return str(e)
        return None

    def _topology_keys(self) -> set[str]:
        """The keys the machine depends on (not protocol, overheads or placement)."""
        return set(type(self).model_fields) - {"name", "source", "eager_threshold_B", "rendezvous_rtt_s",
                                                "unexpected_window_B",
                                                "send_overhead_s", "recv_overhead_s", "gap_s", "placement",
                                                "ack_queue_efficiency",
                                                "placement_seed", "endpoints"}

    def build(self):
        from .flow import FlowNetwork

        return FlowNetwork(lambda P: self.machine(P)[0], lambda m, P: self.machine(P)[1],
                           self.send_overhead_s, self.recv_overhead_s, self.gap_s, self.routing_seed,
                           self.burst_payload_B(), self.ack_efficiency())

    def ack_efficiency(self) -> float:
        """Share of a switch port's rate TCP flows keep when their
        acknowledgements wait in a full port (:mod:`.ack_queue`; 1: lossless)."""
        return 1.0

    def burst_payload_B(self) -> float:
        """Payload bytes a link lets pass at once after an idle period (0: a wire)."""
        return 0.0


class _SizedSpec(FlowSpecBase):
    """A machine whose size may be fixed in nodes (fat tree, Ethernet)."""

    nodes: int | None = Field(None, ge=1, description="machine size in nodes (default: just enough for P)")

    def nodes_for(self, P: int) -> int:
        return self.nodes or super().nodes_for(P)


class FatTreeSpec(_SizedSpec):
    """InfiniBand-style fat tree (see :mod:`simsparse.network.fattree`)."""

    model: Literal["fattree"] = "fattree"
    link_rate: Literal["FDR", "EDR", "HDR", "NDR"] = Field("EDR", description="InfiniBand 4x generation (data rate)")
    link_bw_Bps: float | None = Field(None, gt=0, description="link bandwidth per direction; overrides link_rate")
    link_latency_s: float = latency_field("every link (cable + the switch it enters)")
    radix: int = Field(36, ge=4, le=1024, description="ports per switch")
    levels: Literal[2, 3] = Field(2, description="switch levels: 2 (leaf-spine) or 3 (leaf-aggregation-core)")
    hosts_per_leaf: int | None = Field(None, ge=1, description="hosts per leaf switch (default radix/2)")
    oversubscription: float = Field(1.0, ge=1, le=64, description="leaf down:up bandwidth ratio (2 means 2:1)")
    leaves_per_pod: int | None = Field(None, ge=1, description="leaves per pod in a 3-level tree (default radix/2)")
    upper_oversubscription: float = Field(1.0, ge=1, le=64, description="aggregation down:up bandwidth ratio (3-level)")
    routing: Literal["dmodk", "ecmp"] = Field("dmodk", description="dmodk (destination mod k) or ecmp (hash of src, dst)")

    def bandwidth(self) -> float:
        from .fattree import IB_RATES_Bps

        return self.link_bw_Bps or IB_RATES_Bps[self.link_rate]

    def fabric(self, hosts: int):
        from .fattree import FatTree

        return FatTree(hosts, self.radix, self.levels, self.bandwidth(), self.link_latency_s, self.hosts_per_leaf,
                       self.oversubscription, self.leaves_per_pod, self.upper_oversubscription, self.routing,
                       self.routing_seed, name=self.label())

    def label(self) -> str:
        over = f",{self.oversubscription:g}:1" if self.oversubscription != 1 else ""
        return self.name or f"fattree({self.levels}L,{self.link_rate if not self.link_bw_Bps else 'custom'}{over})"


class DragonflySpec(FlowSpecBase):
    """Cray Aries-style dragonfly (see :mod:`simsparse.network.dragonfly`)."""

    model: Literal["dragonfly"] = "dragonfly"
    groups: int | None = Field(None, ge=1, description="groups in the machine (default: just enough for P)")
    chassis_per_group: int = Field(6, ge=1, description="chassis per group (rank-2 all-to-all between them)")
    routers_per_chassis: int = Field(16, ge=1, description="routers per chassis (rank-1 all-to-all)")
    nodes_per_router: int = Field(4, ge=1, description="nodes per router")
    global_links_per_router: int = Field(10, ge=0, description="rank-3 (global) links per router")
    rank2_links: int = Field(3, ge=1, description="parallel rank-2 cables between two routers (one link of their sum)")
    injection_bw_Bps: float = bandwidth_field(10.2e9, "node <-> router")
    rank1_bw_Bps: float = bandwidth_field(5.25e9, "rank-1 link")
    rank2_bw_Bps: float = bandwidth_field(5.25e9, "rank-2 cable")
    rank3_bw_Bps: float = bandwidth_field(4.7e9, "rank-3 (global) link")
    injection_latency_s: float = latency_field("a node <-> router link")
    rank1_latency_s: float = latency_field("a rank-1 hop")
    rank2_latency_s: float = latency_field("a rank-2 hop")
    rank3_latency_s: float = latency_field("a rank-3 hop")
    routing: Literal["minimal", "valiant", "ugal"] = Field("minimal", description="minimal, valiant or ugal")

    def nodes_for(self, P: int) -> int:
        return self._groups(P) * self.chassis_per_group * self.routers_per_chassis * self.nodes_per_router

    def _groups(self, P: int) -> int:
        from .dragonfly import Dragonfly

        need = Dragonfly.groups_for(math.ceil(P / self.gpus_per_node), self.chassis_per_group,
                                    self.routers_per_chassis, self.nodes_per_router)
        if self.groups is not None and need > self.groups:
            cap = self.groups * self.chassis_per_group * self.routers_per_chassis * self.nodes_per_router
            raise ValueError(f"P = {P} ranks need {need} groups; {self.label()} has {self.groups} "
                             f"({cap * self.gpus_per_node} ranks)")
        return self.groups or need

    def fabric(self, hosts: int):
        from .dragonfly import Dragonfly

        return Dragonfly(hosts // (self.chassis_per_group * self.routers_per_chassis * self.nodes_per_router),
                         self.chassis_per_group, self.routers_per_chassis, self.nodes_per_router,
                         self.global_links_per_router, self.injection_bw_Bps, self.rank1_bw_Bps,
                         self.rank2_links * self.rank2_bw_Bps, self.rank3_bw_Bps, self.injection_latency_s,
                         self.rank1_latency_s, self.rank2_latency_s, self.rank3_latency_s, self.routing,
                         name=self.label())

    def label(self) -> str:
        return self.name or f"dragonfly({self.routing})"


#: bytes of an Ethernet frame on the wire beyond its MTU-sized payload: header 14, FCS 4, preamble and SFD 8,
#: inter-frame gap 12 (IEEE 802.3 clauses 3.1.1 and 4.4.2)
ETHERNET_FRAMING_B = 38
#: IPv4 (20) and TCP (20) headers plus the TCP timestamp option (12, on by default in Linux: RFC 7323)
TCP_IP_HEADERS_B = 52


class EthernetSpec(_SizedSpec):
    """Ethernet: one switch (star) or a leaf-spine (see :mod:`simsparse.network.ethernet`);
    the TCP stack's per-message cost is ``send_overhead_s`` + ``recv_overhead_s``.

    ``framing: tcp`` reads ``link_bw_Bps`` as the line rate and gives flows
    the TCP payload rate: every full frame carries ``mtu_B - 52`` payload
    bytes for ``mtu_B + 38`` on the wire (94.1 % at MTU 1500, 99.0 % at
    9000). ``framing: none`` reads it as the payload rate itself (a measured
    goodput). ``port_buffer_B`` is a switch port's queue; the flow model
    assumes it never overflows, and the testbed (:mod:`simsparse.testbed`)
    builds it and counts its drops; what TCP loses to its drops where
    acknowledgements wait in a full port is ``ack_queue_efficiency``
    (:mod:`.ack_queue`). ``congestion_control`` is the hosts' TCP: the
    flow model is that of a loss-based one (cubic, reno) that fills its
    share of the link; BBR's per-connection pacing is not modelled.
    ``shaper_burst_B`` describes links that
    are token buckets (the testbed's): a message on links idle for long
    enough passes its first bytes at once (``FlowNetwork._head_start``)."""

    model: Literal["ethernet"] = "ethernet"
    topology: Literal["star", "leafspine"] = Field("star", description="star (one switch) or leafspine")
    link_bw_Bps: float = Field(125e6, gt=0, description="link bandwidth per direction (bytes/s): the line rate with "
                                                        "framing: tcp, the payload rate with framing: none")
    framing: Literal["none", "tcp"] = Field("none", description="tcp: link_bw_Bps is the line rate and flows get "
                                                                "(mtu-52)/(mtu+38) of it; none: link_bw_Bps is the "
                                                                "payload rate")
    mtu_B: int = Field(1500, ge=576, le=65535, description="IP MTU of every link (1500 standard, 9000 jumbo frames)")
    port_buffer_B: int = Field(1 << 20, ge=0, description="queue of a switch output port in bytes (the testbed builds "
                                                           "it; the flow model assumes it never overflows)")
    shaper_burst_B: int = Field(0, ge=0, description="links are token-bucket shapers that let this many bytes (on the "
                                                     "wire) pass at once after an idle period: the testbed's tbf burst; "
                                                     "0 for a wire")
    link_latency_s: float = latency_field("every link (cable + the switch it enters)")
    congestion_control: Literal["cubic", "reno", "bbr"] = Field(
        "cubic", description="the hosts' TCP congestion control (the testbed sets it on every host's route): cubic, "
                             "Linux's default, or reno keep a link busy as the flow model assumes; bbr paces each "
                             "connection at its own estimate, which the model does not describe (docs/validation.md)")
    switch_ports: int | None = Field(None, ge=2, description="ports per switch (star: limits hosts; leafspine: radix, "
                                                             "default 64)")
    hosts_per_leaf: int | None = Field(None, ge=1, description="leafspine: hosts per leaf (default ports/2)")
    oversubscription: float = Field(1.0, ge=1, le=64, description="leafspine: leaf down:up bandwidth ratio")
    routing: Literal["ecmp", "dmodk"] = Field("ecmp", description="leafspine: ecmp (hash) or dmodk")
    ack_queue_efficiency: float = Field(1.0, gt=0, le=1, description="share of a switch port's rate that TCP flows "
                                        "sharing it keep while their acknowledgements wait in another full port "
                                        "(network/ack_queue.py); calibrate --testbed fits it from the crossing "
                                        "pattern; 1: no loss")

    def ack_efficiency(self) -> float:
        return self.ack_queue_efficiency

    def payload_efficiency(self) -> float:
        """TCP payload bytes per byte on the wire for full frames."""
        return (self.mtu_B - TCP_IP_HEADERS_B) / (self.mtu_B + ETHERNET_FRAMING_B)

    def burst_payload_B(self) -> float:
        return self.shaper_burst_B * self.payload_efficiency()

    def payload_rate(self) -> float:
        """What one TCP flow alone on a host link moves per second."""
        return self.link_bw_Bps * (self.payload_efficiency() if self.framing == "tcp" else 1.0)

    def fabric(self, hosts: int):
        from .ethernet import Star
        from .fattree import FatTree

        bw = self.payload_rate()
        if self.topology == "star":
            return Star(hosts, bw, self.link_latency_s, self.switch_ports, name=self.label())
        return FatTree(hosts, self.switch_ports or 64, 2, bw, self.link_latency_s, self.hosts_per_leaf,
                       self.oversubscription, routing=self.routing, seed=self.routing_seed, name=self.label())

    def label(self) -> str:
        return self.name or f"ethernet({self.topology},{self.link_bw_Bps * 8 / 1e9:g}Gb/s)"


NETWORK_SPECS: dict[str, type[NetworkSpecBase]] = {
    "alphabeta": AlphaBetaSpec,
    "fattree": FatTreeSpec,
    "dragonfly": DragonflySpec,
    "ethernet": EthernetSpec,
}
