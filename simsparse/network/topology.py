"""The topology graph: vertices (endpoints, NICs, switches, routers) joined by
directed links, each with a bandwidth and a latency; and rank placement.

A builder (:mod:`.fattree`, :mod:`.dragonfly`, :mod:`.ethernet`) makes a
:class:`Fabric`: a :class:`Topology` plus routing between its *hosts* (the
vertices where node NICs attach). :mod:`.node` then attaches the GPUs of each
node to the hosts and makes the :class:`~.node.Machine` the flow model runs
on. Links are directed (a full-duplex cable is two links), and parallel
cables between the same two vertices are one link of their summed bandwidth.
"""
from __future__ import annotations

import numpy as np

# vertex kinds
ENDPOINT, NIC, SWITCH, ROUTER, HUB = "endpoint", "nic", "switch", "router", "hub"


class Topology:
    """Vertices and directed links. Frozen into numpy arrays by :meth:`freeze`."""

    def __init__(self, name: str):
        self.name = name
        self.kind: list[str] = []      # per vertex
        self.label: list[str] = []     # per vertex
        self.level: list[int] = []     # per vertex: drawing layer (0 = endpoints)
        self.src: list[int] = []       # per link
        self.dst: list[int] = []
        self.bw: list[float] = []      # bytes per second
        self.lat: list[float] = []     # seconds
        self.lkind: list[str] = []     # e.g. "injection", "rank3", "uplink"
        self._index: dict[tuple[int, int], int] = {}

    @property
    def n_vertices(self) -> int:
        return len(self.kind)

    @property
    def n_links(self) -> int:
        return len(self.src)

    def vertex(self, kind: str, label: str, level: int) -> int:
        self.kind.append(kind)
        self.label.append(label)
        self.level.append(level)
        return len(self.kind) - 1

    def link(self, u: int, v: int, bw: float, lat: float, kind: str) -> int:
        if (u, v) in self._index:
            raise ValueError(f"duplicate link {self.label[u]} -> {self.label[v]}")
        if not bw > 0 or lat < 0:
            raise ValueError(f"link {self.label[u]} -> {self.label[v]}: bandwidth must be > 0 and latency >= 0")
        self._index[(u, v)] = len(self.src)
        self.src.append(u)
        self.dst.append(v)
        self.bw.append(float(bw))
        self.lat.append(float(lat))
        self.lkind.append(kind)
        return len(self.src) - 1

    def duplex(self, u: int, v: int, bw: float, lat: float, kind: str) -> None:
        """A full-duplex connection: one link each way with the same rate."""
        self.link(u, v, bw, lat, kind)
        self.link(v, u, bw, lat, kind)

    def lid(self, u: int, v: int) -> int:
        """The id of the link u -> v."""
        return self._index[(u, v)]

    def path(self, vertices) -> list[int]:
        """Link ids along a vertex path."""
        ix = self._index
        return [ix[(a, b)] for a, b in zip(vertices[:-1], vertices[1:])]

    def freeze(self) -> None:
        """Numpy views of the link table, used by the flow model."""
        self.bw_arr = np.asarray(self.bw, dtype=np.float64)
        self.lat_arr = np.asarray(self.lat, dtype=np.float64)
        #: per link: whether it is a switch's output port
        self.from_switch = (np.asarray(self.kind) == SWITCH)[np.asarray(self.src, dtype=np.intp)]
        self._of_kind: dict[tuple, tuple] = {}

    def links_of_kind(self, kinds: tuple) -> tuple[list[bool], np.ndarray]:
        """Per link, whether its kind is one of ``kinds``, as a list and an array (kept: machines are cached)."""
        got = self._of_kind.get(kinds)
        if got is None:
            flags = [k in kinds for k in self.lkind]
            got = self._of_kind[kinds] = (flags, np.array(flags, dtype=np.bool_))
        return got

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kind if k == kind)


class Fabric:
    """A topology plus routing between hosts. ``route(a, b, key)`` gives the
    link ids from host ``a`` to host ``b`` (host indices, a != b); ``key``
    names a non-minimal choice (``None`` = the default route). Adaptive
    fabrics override :meth:`select` to make that choice per message."""

    adaptive = False
    watch_kind: str | tuple | None = None   # kind(s) of link whose load :meth:`select` reads

    def __init__(self, topo: Topology, hosts: list[int]):
        self.topo = topo
        self.hosts = hosts

    def route(self, a: int, b: int, key=None) -> list[int]:  # pragma: no cover - interface
        raise NotImplementedError

    def select(self, a: int, b: int, load: np.ndarray, rng):
        """The route key for a new message from host a to host b, given
        ``load[link]``: the flows on each link of a kind in ``watch_kind``."""
        return None


# -- placement of ranks onto endpoints ----------------------------------------------

PLACEMENTS = ("linear", "round_robin", "random", "list")


def place(P: int, n_endpoints: int, gpus_per_node: int, policy: str, seed: int = 0,
          endpoints: list[int] | None = None) -> np.ndarray:
    """Endpoint index of every rank. Endpoints are numbered node-major
    (endpoint e is GPU ``e % G`` of node ``e // G``).

    * ``linear``: rank r on endpoint r (fills a node's GPUs first);
    * ``round_robin``: across the ``ceil(P/G)`` nodes first: rank r on node
      ``r mod nodes``, GPU ``r div nodes``;
    * ``random``: P distinct endpoints of the whole machine, drawn with ``seed``;
    * ``list``: ``endpoints[r]`` (distinct, in range).
    """
    if P > n_endpoints:
        raise ValueError(f"P = {P} ranks do not fit on {n_endpoints} endpoints")
    if policy == "linear":
        return np.arange(P)
    if policy == "round_robin":
        nodes = -(-P // gpus_per_node)
        r = np.arange(P)
        return (r % nodes) * gpus_per_node + r // nodes
    if policy == "random":
        return np.random.default_rng(seed).permutation(n_endpoints)[:P]
    if policy == "list":
        eps = np.asarray(endpoints if endpoints is not None else [], dtype=np.int64)
        if len(eps) < P:
            raise ValueError(f"placement list has {len(eps)} endpoints; P = {P} needs at least {P}")
        eps = eps[:P]
        if len(np.unique(eps)) != P or eps.min() < 0 or eps.max() >= n_endpoints:
            raise ValueError(f"placement list: the first P = {P} entries must be distinct endpoint indices "
                             f"in [0, {n_endpoints})")
        return eps
    raise ValueError(f"placement {policy!r}; allowed: {', '.join(PLACEMENTS)}")


def mix(*xs: int) -> int:
    """A deterministic 64-bit hash of integers (splitmix64 steps), for
    ECMP-style path choices that must not depend on Python's hash seed."""
    h = 0x9E3779B97F4A7C15
    for x in xs:
        h = (h ^ (x & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h
