"""Network models. ``build_network(spec)`` turns a validated spec into a model
the simulator drives (``reset(env, P)`` and ``transfer(src, dst, nbytes, done)``)."""
from .alphabeta import AlphaBetaNetwork
from .spec import NETWORK_SPECS, AlphaBetaSpec, NetworkSpecBase  # noqa: F401


def build_network(spec: NetworkSpecBase):
    return spec.build()


__all__ = ["AlphaBetaNetwork", "build_network", "NETWORK_SPECS", "AlphaBetaSpec"]
