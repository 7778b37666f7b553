"""Cores shared by the ranks of one host: processor sharing, or round robin
with the scheduler's time slice.

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

*Time slices* (:class:`SlicedCores`, with ``core_slice_s``). Linux does
not share a core in infinitesimal steps: a runnable task keeps its core
until it blocks or has run its slice (EEVDF's base slice, 0.75 ms times
1 + log2(CPUs), 1.5 ms on 2 CPUs; the tick ends it), then the next task
runs. A rank's kernel shorter than the slice therefore runs at full speed
once it has the core, and a rank that finishes early goes on to its
messages while the others still wait for the core; under processor
sharing every one of 4 ranks on a core takes 4x its kernel's time and all
finish together. A rank keeps its core across consecutive pieces of work
(its Python, a kernel, posting its messages) issued at the same instant,
as a process that has not blocked keeps running. A rank that wakes (it
has no work queued: it slept in a wait) takes the core at once from the
rank that has run longest, which goes to the front of the queue: EEVDF
places a task that slept ahead of those that ran, and on the testbed a
rank woke behind a busy one in 46 us at the median
(docs/history/validation-journal.md, third session). But EEVDF's ``RUN_TO_PARITY``
protects a task it has just picked for one base slice (:func:`protection`):
a woken rank does not preempt a rank that took its core less than that
ago; it runs next, when that rank blocks or its slice ends. Without it, a
rank that woke to post a burst of sends lost its core to each rank woken
after it (docs/history/validation-journal.md, twenty-second session). Ranks that start at
one instant queue in order. Otherwise the queue is first come, first served.

*Binding* (:func:`core_pools`). Unbound, the ranks share one pool of C
cores. Bound ``block`` (as the testbed's launcher binds them, and as MPI
launchers do with ``-bind-to core``), rank r runs on core floor(r C / P)
only, each core processor-shared by its own ranks: a rank's work waits for
its core even while another core idles.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

#: jobs whose remaining work is this close to zero have finished (rounding)
EPS_S = 1e-15
#: Linux's ``sysctl_sched_base_slice`` before scaling (kernel/sched/fair.c, 0.75 ms since 6.6)
BASE_SLICE_S = 0.75e-3


def protection(cores: float) -> float:
    """How long EEVDF protects a task it just picked from wake-up preemption
    (``RUN_TO_PARITY``): the base slice, scaled by ``1 + ilog2(min(CPUs, 8))``
    (the default ``SCHED_TUNABLESCALING_LOG``): 1.5 ms on 2 CPUs."""
    return BASE_SLICE_S * (1 + int(max(1, min(int(cores), 8))).bit_length() - 1)


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

    def run(self, work: float, done: Callable, arg=None, owner=None) -> None:
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


class SlicedCores:
    """``C`` whole cores under round robin with time slice ``q`` (module
    docstring): :meth:`run` a job of ``work`` core-seconds for ``owner``
    (a rank) and ``done(arg)`` is called when it ends. A rank's jobs run
    one at a time, in issue order, on the core it has."""

    def __init__(self, env, cores: float, slice_s: float, protect_s: float = 0.0):
        if not (cores >= 1 and cores == int(cores)):
            raise ValueError(f"cores = {cores}: time slices need a whole number of cores")
        if not slice_s > 0:
            raise ValueError(f"core_slice_s = {slice_s}: must be > 0")
        self.env, self.C, self.q = env, int(cores), float(slice_s)
        self.protect = min(float(protect_s), self.q)   # a rank runs this long on its core before a waker preempts it
        self.queue: deque = deque()   # jobs waiting for a core: [remaining core-seconds, done, arg, owner]
        self.queued: dict = {}        # owner -> its jobs in the queue
        self.taken = 0                # cores a rank has (running, or held while it may go on)
        self.own: dict = {}           # owner with a core -> its jobs issued meanwhile, in order
        self.held: dict = {}          # owner -> the rest of its slice, while it may go on at this instant
        self.running: dict = {}       # owner -> (job, since, slice left then, generation)
        self.gen = 0
        self.busy_s = 0.0

    def run(self, work: float, done: Callable, arg=None, owner=None) -> None:
        job = [max(float(work), 0.0), done, arg, object() if owner is None else owner]
        owner = job[3]
        if owner in self.held:        # the rank did not block: it goes on with the rest of its slice
            self._start(job, self.held.pop(owner))
        elif owner in self.own:       # after what it runs now
            self.own[owner].append(job)
        elif self.taken < self.C:
            self.taken += 1
            self._take(job)
        elif not self.queued.get(owner):
            self._wake(job)           # a rank that slept
        else:
            self._enqueue([job])

    def _take(self, job) -> None:
        self.own[job[3]] = deque()
        self._start(job, self.q)

    def _start(self, job, left: float) -> None:
        self.gen += 1
        self.running[job[3]] = (job, self.env.now, left, self.gen)
        self.env.at(min(job[0], left), self._ran, (job[3], self.gen))

    def _enqueue(self, jobs, first: bool = False) -> None:
        for j in jobs:
            self.queued[j[3]] = self.queued.get(j[3], 0) + 1
        if first:
            self.queue.extendleft(reversed(jobs))
        else:
            self.queue.extend(jobs)

    def _wake(self, job) -> None:
        """A woken rank takes the core of the rank that has run longest since
        before now (EEVDF places a task that slept ahead of those that ran):
        that one's work goes to the front of the queue. Where every such rank
        took its core less than :attr:`protect` ago, the woken rank runs next
        instead; ranks that all began at this instant (they start together)
        queue in order."""
        now = self.env.now
        ran = [(since, o, self.q - left + (now - since))
               for o, (_, since, left, _) in self.running.items() if since < now]
        old = [(since, o) for since, o, run_s in ran if run_s >= self.protect]
        if old:
            _, owner = min(old, key=lambda x: x[0])
            stopped, _ = self._stop(owner)
            self._enqueue([stopped, *self.own.pop(owner)], first=True)
            self._take(job)
        else:
            self._enqueue([job], first=bool(ran))   # protected ranks run: it runs next

    def _stop(self, owner):
        """Take ``owner``'s job off its core, its run so far counted: (job, the rest of its slice)."""
        job, since, left, _ = self.running.pop(owner)
        ran = self.env.now - since
        job[0] -= ran
        self.busy_s += ran
        return job, left - ran

    def _ran(self, x) -> None:
        owner, gen = x
        got = self.running.get(owner)
        if got is None or got[3] != gen:   # it was preempted
            return
        job, left = self._stop(owner)
        tol = EPS_S * max(1.0, self.env.now)
        if job[0] > tol:              # its slice is used up: to the back of the queue, its other jobs after it
            self._enqueue([job, *self.own.pop(owner)])
            self._free()
            return
        mine = self.own[owner]
        if mine and left > tol:
            self._start(mine.popleft(), left)
        elif left > tol:
            self.held[owner] = left   # the core stays its rank's while it goes on at this instant
            job[1](job[2])
            # after the calls its end set off (due now, in order): a rank that issued no work has blocked
            self.env.at(0.0, self._release, owner)
            return
        else:
            self._enqueue(list(self.own.pop(owner)))
            self._free()
        job[1](job[2])

    def _release(self, owner) -> None:
        left = self.held.pop(owner, None)
        if left is None:
            return
        mine = self.own[owner]
        if mine:   # a job it had queued reached a core meanwhile (:meth:`_free`): it runs here, on the rest of the slice
            self._start(mine.popleft(), left)
            return
        del self.own[owner]
        self._free()

    def _free(self) -> None:
        """A core is free: the queue's first job whose rank has no core gets it with a whole slice."""
        while self.queue:
            job = self.queue.popleft()
            self.queued[job[3]] -= 1
            if job[3] in self.own:    # its rank runs on another core: after that
                self.own[job[3]].append(job)
                continue
            self._take(job)
            return
        self.taken -= 1


#: how ranks are placed on shared cores: one pool, or each rank bound to a core in rank blocks
BINDINGS = ("none", "block")


def bound_core(rank: int, P: int, C: int) -> int:
    """The core (0..C-1) that ``block`` binding gives rank ``rank`` of ``P``:
    blocks of P / C ranks per core, or a core each when P <= C."""
    return rank * C // P if P > C else rank % C


def core_pools(env, cores: float, P: int, binding: str = "none", slice_s: float | None = None) -> list:
    """The cores rank r runs on, for r in 0..P-1 (the same object for ranks
    that share them): processor-shared, or round robin with ``slice_s``.
    ``block`` and time slices need a whole number of cores
    (:class:`~simsparse.compute.devices.DeviceProfile` checks it)."""
    def pool(c):
        return SlicedCores(env, c, slice_s, protection(cores)) if slice_s else SharedCores(env, c)

    if binding == "none":
        return [pool(cores)] * P
    if binding != "block":
        raise ValueError(f"core binding {binding!r}: must be one of {', '.join(BINDINGS)}")
    C = int(cores)
    pools = [pool(1.0) for _ in range(min(C, P))]
    return [pools[bound_core(r, P, C)] for r in range(P)]
