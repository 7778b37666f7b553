"""Network models. A validated spec's ``build()`` gives a model the simulator
drives (``reset(env, P)`` and ``transfer(src, dst, nbytes, done)``): the
contention-free alpha-beta fast path, or the flow-level model on a topology
(fat tree, dragonfly, Ethernet, multi-GPU nodes)."""
from .alphabeta import AlphaBetaNetwork
from .flow import FlowNetwork
from .maxmin import maxmin_rates
from .spec import NETWORK_SPECS, AlphaBetaSpec, DragonflySpec, EthernetSpec, FatTreeSpec, NetworkSpecBase  # noqa: F401

__all__ = ["AlphaBetaNetwork", "FlowNetwork", "maxmin_rates", "NETWORK_SPECS", "AlphaBetaSpec", "FatTreeSpec",
           "DragonflySpec", "EthernetSpec"]
