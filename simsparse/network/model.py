"""What the simulator needs of a network model (:class:`NetworkModel`)."""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np


#: what a network model may declare (:meth:`NetworkModel.capabilities`):
#:
#: * ``arrays``: a wave of messages that each start when ready is timed as ``transfer`` times them
#:   (``bulk_wave``), and a collective replayed on a scratch copy (``bulk_scratch``, ``bulk_transfer``);
#: * ``port_waves``: its messages may be booked wave after wave on its ports (alpha-beta);
#: * ``flow_waves``: its flows may be solved wave after wave, routes chosen in booking order;
#: * ``compiled_replay``: the compiled replay models it (alpha-beta);
#: * ``repeatable``: a run starts from the same state whatever ran before it (nothing carries over from
#:   one iteration to the next, as shaped links' token buckets do), so equal iterations time equally.
CAPABILITIES = ("arrays", "port_waves", "flow_waves", "compiled_replay", "repeatable")


class NetworkModel(Protocol):
    """A network model the simulator drives: the event core, messages one by
    one as the engine reaches them (``reset``, ``transfer``), and the array
    capability the evaluators of :mod:`simsparse.backends.fast` use where
    :meth:`capabilities` declares it (the ``bulk_*`` methods).
    :class:`~.alphabeta.AlphaBetaNetwork` and :class:`~.flow.FlowNetwork`
    implement it."""

    #: messages of the event simulation that found a port or link a bulk evaluation still held
    bulk_touched: int

    def reset(self, env, P: int, idle_s: float = 0.0) -> None:
        """Bind to a fresh simulation of P ranks (idle network) on an engine; ``idle_s``: how long the
        network idled since the last run (what state it carries, a shaper's token buckets, recovers)."""

    def transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None]) -> None:
        """A message may start moving now; call ``done()`` when it has arrived."""

    def capabilities(self, P: int) -> frozenset:
        """What the array evaluators may do here for P ranks (:data:`CAPABILITIES`); the
        evaluator table (``simsparse.backends.evaluators``) reads only this."""

    def bulk_start(self, P: int, earliest: float = 0.0, keep: bool = True) -> None:
        """Begin a bulk evaluation on the network as it is now (``keep``: hold what it books for later messages)."""

    def bulk_restart(self) -> None:
        """Forget what this evaluation timed so far."""

    def bulk_wave(self, ready: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, pos: np.ndarray,
                  firm: np.ndarray) -> tuple[np.ndarray | None, bool]:
        """Arrivals of messages ready at ``ready`` if each starts then, exactly
        as ``transfer`` gives them; else (None, False)."""

    def bulk_wave_possible(self, src: np.ndarray, dst: np.ndarray, pos: np.ndarray) -> bool:
        """False if ``bulk_wave`` can never time these messages (whatever the
        times): the evaluation then goes straight to the replay."""

    def bulk_scratch(self, env, P: int) -> "NetworkModel":
        """A copy of this model for a replay on a private engine."""

    def bulk_transfer(self, src: int, dst: int, nbytes: int, done: Callable[[], None], firm: bool) -> bool:
        """``transfer`` on a scratch copy; whether its outcome cannot depend on
        an order the event simulation may have chosen differently."""

    def bulk_replayed(self, flows: list) -> bool:
        """Take over a replay's messages (src, dst, start, arrival); whether
        none met traffic from outside the evaluation."""

    def bulk_commit(self, now: float) -> None:
        """Keep what the evaluation used for the messages that come later."""
