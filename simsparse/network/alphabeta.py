"""Alpha-beta (Hockney) network with per-endpoint send and receive ports.

A message of ``m`` bytes from ``src`` to ``dst`` holds the send port of
``src`` and the receive port of ``dst`` for ``alpha + m * beta`` seconds
(``beta = 1 / bandwidth``). Each port serves its messages one at a time in
the order they become ready (a NIC serialises its own messages), so an
endpoint may send and receive at once (full duplex) and ``P - 1`` senders to
one receiver take ``(P - 1)(alpha + m beta)``. There is no link contention:
this is the fast path, and the reference for closed-form checks.

Because durations are known when a transfer starts, each port is a single
"free at" time and each message costs one simulator event.
"""
from __future__ import annotations

from typing import Callable


class AlphaBetaNetwork:
    """The contention-free fast path. ``transfer`` is called by the simulator
    when a message may start moving; ``done`` is called when it has arrived."""

    def __init__(self, alpha_s: float, bandwidth_Bps: float):
        if alpha_s < 0 or bandwidth_Bps <= 0:
            raise ValueError("alpha_s must be >= 0 and bandwidth_Bps > 0")
        self.alpha = float(alpha_s)
        self.beta = 1.0 / float(bandwidth_Bps)
        self.env = None

    def reset(self, env, P: int) -> None:
        """Bind to a fresh simulation of ``P`` ranks (idle network)."""
        self.env = env
        self._send_free = [0.0] * P
        self._recv_free = [0.0] * P

    def transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None]) -> None:
        env = self.env
        now = env.now
        sf, rf = self._send_free, self._recv_free
        start = now
        if sf[src] > start:
            start = sf[src]
        if rf[dst] > start:
            start = rf[dst]
        end = start + self.alpha + nbytes * self.beta
        sf[src] = rf[dst] = end
        env.timeout(end - now).callbacks.append(lambda _ev: done())

    def describe(self) -> str:
        return f"alpha-beta: alpha={self.alpha:.3g} s, bandwidth={1 / self.beta:.4g} B/s"
