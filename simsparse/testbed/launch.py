"""The rank launcher: ``mpiexec -n P python -m simsparse.testbed.launch NAME -- CMD ...``
runs rank i's CMD inside the host namespace testbed NAME gives rank i
(``PMI_RANK``, set by MPICH's Hydra, names the rank). The PMI connection is
an inherited file descriptor, so it crosses into the namespace unchanged.

Each rank is bound to one core of those this process may use, in blocks
(rank r of P on core floor(r C / P)), as MPI launchers bind ranks
(``-bind-to core``); the model binds them alike (``core_binding: block``,
:mod:`simsparse.compute.cores`). Unbound, Linux kept a runnable rank queued
on one core while the other core idled or ran a waiting rank's yield loop
(which no idle balancing interrupts): at P = 4, QSGD's quantize of 1e5 began
on the last rank 4.8 ms after the start, where the work of all four takes
3.9 ms on two cores, and the points of n = 1e4 and 1e5 measured 10 to 40 %
slower and twice as spread as bound."""
from __future__ import annotations

import os
import sys

from .host import read_state


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m simsparse.testbed.launch NAME -- CMD ...", file=sys.stderr)
        return 2
    name, cmd = argv[0], argv[2:]
    state = read_state(name)
    rank = os.environ.get("PMI_RANK")
    if state is None or rank is None or not rank.isdigit() or int(rank) >= len(state["ranks"]):
        print(f"simsparse.testbed.launch: no rank {rank!r} in testbed {name!r} (is it up?)", file=sys.stderr)
        return 2
    bind(int(rank), int(os.environ.get("PMI_SIZE", len(state["ranks"]))))
    os.execvp("ip", ["ip", "netns", "exec", state["ranks"][int(rank)], *cmd])
    return 1  # pragma: no cover - execvp does not return


def bind(rank: int, size: int) -> None:
    """Bind this process to rank ``rank``'s core (blocks of ranks per core, as the model binds them)."""
    from ..compute.cores import bound_core

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[bound_core(rank, size, len(cpus))]})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
