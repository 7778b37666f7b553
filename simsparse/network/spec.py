"""Validated network descriptions (the ``network:`` key of a config).

Every model shares the MPI protocol settings (eager/rendezvous switch); each
model adds its own keys. ``NETWORK_SPECS`` maps the ``model:`` value to its
schema.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class NetworkSpecBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="label for tables and plots")
    source: str | None = Field(None, description="where the numbers come from")
    eager_threshold_B: int = Field(65536, ge=0, description="messages up to this size are sent eagerly (MPI eager protocol)")
    rendezvous_rtt_s: float = Field(0.0, ge=0, description="extra RTS/CTS handshake time for larger (rendezvous) messages")

    def build(self):  # pragma: no cover - interface
        raise NotImplementedError

    def label(self) -> str:
        return self.name or self.model


class AlphaBetaSpec(NetworkSpecBase):
    """Contention-free alpha-beta network (see :mod:`simsparse.network.alphabeta`)."""

    model: Literal["alphabeta"] = "alphabeta"
    alpha_s: float = Field(1e-6, ge=0, description="per-message latency in seconds")
    bandwidth_Bps: float = Field(1e10, gt=0, description="per-endpoint bandwidth in bytes per second")

    def build(self):
        from .alphabeta import AlphaBetaNetwork

        return AlphaBetaNetwork(self.alpha_s, self.bandwidth_Bps)

    def label(self) -> str:
        return self.name or f"alphabeta(a={self.alpha_s:g}s,B={self.bandwidth_Bps:g}B/s)"


NETWORK_SPECS: dict[str, type[NetworkSpecBase]] = {"alphabeta": AlphaBetaSpec}
