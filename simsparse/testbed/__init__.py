"""The emulated cluster: the machine a network description names, built on
this Linux host from network namespaces, bridges and shaped veth links, with
real MPI over real TCP between its hosts.

* :mod:`.plan`: the machine as namespaces, bridges, veth pairs and queues;
* :mod:`.host`: bring it up and down safely (``ip``, ``tc``), state files,
  clean-up after a killed run, the queues' byte and drop counters;
* :mod:`.launch`: the rank launcher (rank i runs in host namespace i).

:class:`Testbed` is what ``measure --testbed`` and ``calibrate --testbed``
use: it reuses a testbed made by ``simsparse testbed up`` for the same
description and P, else makes one for the run and removes it afterwards.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from . import host
from .host import TestbedError, why_not
from .plan import Plan, PlanError, plan

__all__ = ["Testbed", "TestbedError", "PlanError", "load_spec", "plan", "why_not", "MPI_ENV", "rank_env"]

#: MPICH over the testbed's links: no shared memory between ranks, the OFI
#: netmod with libfabric's TCP provider bound to the host namespace's eth0
#: (UCX would move data through shared memory and never touch the links)
MPI_ENV = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0",
           # the real backend: wait for sockets without spinning, one message per payload (backends/real/wire.py),
           # every rank timed from one instant, as the simulator's ranks start, not from its own staggered barrier
           # exit (backends/real/start.py; the measurements with either: docs/history/validation-journal.md, twelfth session)
           "SIMSPARSE_WAIT": "poll", "SIMSPARSE_SPLIT": "off", "SIMSPARSE_START": "common"}
#: the real backend's settings a testbed run takes from the environment over :data:`MPI_ENV`
OVERRIDES = ("SIMSPARSE_WAIT", "SIMSPARSE_SPLIT", "SIMSPARSE_START")


def rank_env() -> dict:
    """What a testbed's ranks run with: :data:`MPI_ENV`, the real backend's
    settings (:data:`OVERRIDES`) overridable from the environment."""
    return {**MPI_ENV, **{k: os.environ[k] for k in OVERRIDES if k in os.environ}}


def load_spec(name: str, base: Path | None = None):
    """The Ethernet description a testbed argument names (a preset or YAML
    file, or a ``simsparse calibrate --testbed`` profile), validated."""
    from ..experiments.config.errors import ConfigError
    from ..experiments.config.sources import network_variants
    from ..network.spec import NETWORK_SPECS

    try:
        variants = network_variants(name, (base or Path.cwd()) / "testbed")
    except ConfigError as e:
        raise ConfigError(f"testbed {name}: {e}") from None
    if len(variants) != 1:
        raise PlanError(f"testbed {name}: the description expands into {len(variants)} networks; give one")
    return NETWORK_SPECS[variants[0]["model"]].model_validate(variants[0])


class Testbed:
    """``with Testbed(spec, P) as tb:`` the emulated machine for P ranks;
    ``tb.wrap(cmd)`` is the ``mpiexec`` program list that starts each rank
    inside its host namespace, ``tb.env`` the MPI settings."""

    __test__ = False  # not a pytest class

    def __init__(self, spec, P: int):
        self.plan: Plan = plan(spec, P)
        self.owned = False
        self.state: dict | None = None
        self._old: dict = {}

    def __enter__(self) -> "Testbed":
        host.require()
        st = host.read_state(self.plan.name)
        if st is not None and st.get("owner") is None and st["spec"] == self.plan.spec and st["P"] == self.plan.P:
            self.state = st   # made by `simsparse testbed up` for this very machine
        else:
            self._trap()
            self.state = host.up(self.plan)
            self.owned = True
        return self

    def __exit__(self, *exc) -> None:
        if self.owned:
            host.down(self.plan.name)
            self.owned = False
        for sig, h in self._old.items():
            signal.signal(sig, h)
        self._old = {}

    def _trap(self) -> None:
        """SIGHUP (and SIGTERM where nothing else handles it) unwinds, so ``__exit__`` runs."""
        def handler(signum, frame):
            raise KeyboardInterrupt
        for sig in (signal.SIGHUP, signal.SIGTERM):
            try:
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: the caller's handlers apply
                pass

    @property
    def label(self) -> str:
        return f"testbed:{self.plan.name}"

    @property
    def env(self) -> dict:
        return rank_env()

    def wrap(self, cmd: list[str]) -> list[str]:
        return [sys.executable, "-m", "simsparse.testbed.launch", self.plan.name, "--", *cmd]

    def counters(self) -> list[dict]:
        return host.counters(self.state)
