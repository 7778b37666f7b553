"""What the experiment loop needs of a backend (:class:`ExperimentBackend`)."""
from __future__ import annotations

from typing import Protocol, Sequence

from ...backends.driver import IterationStats
from ..config.point import Point


class ExperimentBackend(Protocol):
    """Runs a point's iterations on the ranks it holds: all of them in the
    simulator (:class:`~.simulate.SimBackend`), its own in an MPI process
    (:class:`~.worker.MPIBackend`)."""

    name: str                     # "sim" or "mpi": the row's backend
    root: bool                    # this process writes the row
    trace: bool
    point: Point                  # the point as this backend runs it (the simulator's at data_scale)
    local_ranks: Sequence[int]
    values: str                   # the row's values column: "full" (checked), "sizes" or "sampled" (not)
    repeats: bool                 # an iteration of a kind already run times as that one did (resolve.repeats)

    def gather(self, values: list) -> list | None:
        """Per-rank values of the local ranks, gathered on the root (None elsewhere)."""

    def iteration(self, jobs: dict, it: int) -> IterationStats:
        """Run iteration ``it`` of every local rank's job."""
