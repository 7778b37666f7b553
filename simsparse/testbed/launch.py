"""The rank launcher: ``mpiexec -n P python -m simsparse.testbed.launch NAME -- CMD ...``
runs rank i's CMD inside the host namespace testbed NAME gives rank i
(``PMI_RANK``, set by MPICH's Hydra, names the rank). The PMI connection is
an inherited file descriptor, so it crosses into the namespace unchanged."""
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
    os.execvp("ip", ["ip", "netns", "exec", state["ranks"][int(rank)], *cmd])
    return 1  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
