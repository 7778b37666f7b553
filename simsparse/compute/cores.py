"""Cores shared by the ranks of one host: egalitarian processor sharing.

When ranks outnumber the cores they run on (an emulated cluster of 8 ranks
on 2 cores; a node's host-side work of several GPUs), a rank's device work
does not run at full speed: with n jobs on C cores each progresses at
``min(1, C / n)`` seconds of work per second (processor sharing, Kleinrock,
*Queueing Systems* vol. 2, section 4.4; Linux's CFS approximates it for
runnable tasks of equal weight). A job's end is known only until the next
job starts or ends, so every change re-rates the jobs and reschedules the
earliest end, as the flow model does for bandwidth.

Work is in seconds of one core. A rank with no job uses no core: waiting
ranks sleep (the real backend's ``poll`` wait mode).

*Binding* (:func:`core_pools`). Unbound, the ranks share one pool of C
cores. Bound ``block`` (as the testbed's launcher binds them, and as MPI
launchers do with ``-bind-to core``), rank r runs on core floor(r C / P)
only, each core processor-shared by its own ranks: a rank's work waits for
its core even while another core idles.
"""
from __future__ import annotations

from typing import Callable

#: jobs whose remaining work is this close to zero have finished (rounding)
EPS_S = 1e-15


class SharedCores:
    """``C`` cores under processor sharing; :meth:`run` a job of ``work``
    core-seconds and ``done(arg)`` is called when it ends."""

    def __init__(self, env, cores: float):
        if not cores > 0:
            raise ValueError(f"cores = {cores}: must be > 0")
        self.env, self.C = env, float(cores)
        self.jobs: list[list] = []   # [remaining core-seconds, done, arg]
        self.last = 0.0
        self.gen = 0                 # the scheduled end event that is current
        self.busy_s = 0.0            # core-seconds of work done (for checks)

    def rate(self) -> float:
        """Core-seconds per second each running job gets."""
        return min(1.0, self.C / len(self.jobs)) if self.jobs else 1.0

    def run(self, work: float, done: Callable, arg=None) -> None:
        self._advance()
        self.jobs.append([max(float(work), 0.0), done, arg])
        self._schedule()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.last
        self.last = now
        if dt <= 0.0 or not self.jobs:
            return
        step = dt * self.rate()
        for j in self.jobs:
            j[0] -= step
        self.busy_s += step * len(self.jobs)

    def _schedule(self) -> None:
        self.gen += 1
        if self.jobs:
            t = max(min(j[0] for j in self.jobs), 0.0) / self.rate()
            self.env.at(t, self._end, self.gen)

    def _end(self, gen: int) -> None:
        if gen != self.gen:   # superseded by a later start or end
            return
        self._advance()
        tol = EPS_S * max(1.0, self.env.now)
        done = [j for j in self.jobs if j[0] <= tol]
        self.jobs = [j for j in self.jobs if j[0] > tol]
        self._schedule()
        for _, fn, arg in done:
            fn(arg)


#: how ranks are placed on shared cores: one pool, or each rank bound to a core in rank blocks
BINDINGS = ("none", "block")


def bound_core(rank: int, P: int, C: int) -> int:
    """The core (0..C-1) that ``block`` binding gives rank ``rank`` of ``P``:
    blocks of P / C ranks per core, or a core each when P <= C."""
    return rank * C // P if P > C else rank % C


def core_pools(env, cores: float, P: int, binding: str = "none") -> list[SharedCores]:
    """The cores rank r runs on, for r in 0..P-1 (the same object for ranks
    that share them). ``block`` needs a whole number of cores
    (:class:`~simsparse.compute.devices.DeviceProfile` checks it)."""
    if binding == "none":
        return [SharedCores(env, cores)] * P
    if binding != "block":
        raise ValueError(f"core binding {binding!r}: must be one of {', '.join(BINDINGS)}")
    C = int(cores)
    pools = [SharedCores(env, 1.0) for _ in range(min(C, P))]
    return [pools[bound_core(r, P, C)] for r in range(P)]
