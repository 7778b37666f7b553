"""The clock the simulator and the network models run on: one small interface,
two engines.

An engine has a current time ``now``, schedules ``fn(arg)`` to be called
``delay`` seconds from now with :meth:`at` (``priority`` orders calls at the
same time: lower first; among equals, first scheduled first; :meth:`soon`
is ``at(0.0, fn, arg)``; :meth:`at_time` takes the time itself, to the last
bit, where ``now + delay`` would round), runs until no
call is left with :meth:`run`, and counts the calls it scheduled in
``events``. Nothing else of an engine is used by the simulator, the rank
programs' driver or the networks.

* :class:`SimPyEngine` is the reference: every call is a SimPy event on a
  ``simpy.Environment``, ordered by SimPy's own (time, priority, event id).
* :class:`HeapEngine` is the lean one: the same ordering key on a plain
  ``heapq`` of tuples, without SimPy's event objects and dispatch. Given the
  same calls in the same order it calls them in exactly the same order, so
  simulated times are identical (``tests/backends/test_engine.py`` checks a grid of
  algorithms, networks and schedules on both).
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Callable

#: SimPy's priorities: URGENT 0, NORMAL 1; later priorities run after every
#: ordinary call of the same time (the flow model's rate updates)
NORMAL = 1

ENGINES = ("lean", "simpy")


class HeapEngine:
    """A binary heap of (time, priority, sequence, fn, arg), plus a FIFO of
    the zero-delay ordinary calls (a blocked program's resumption, most of a
    run's calls): those go last among the calls of the current time and
    priority, so a queue in scheduling order keeps exactly the heap's order at
    O(1) a call instead of O(log n). Each step runs whichever of the heap's
    top and the queue's head has the smaller (time, priority, sequence)."""

    __slots__ = ("now", "_heap", "_seq", "_soon")

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self._soon: deque = deque()   # (sequence, fn, arg) due at now with priority NORMAL

    def at(self, delay: float, fn: Callable, arg=None, priority: int = NORMAL) -> None:
        self._seq += 1
        if delay == 0.0 and priority == NORMAL:
            self._soon.append((self._seq, fn, arg))
        else:
            heapq.heappush(self._heap, (self.now + delay, priority, self._seq, fn, arg))

    def soon(self, fn: Callable, arg=None) -> None:
        """``at(0.0, fn, arg)``: last among the ordinary calls due now."""
        self._seq += 1
        self._soon.append((self._seq, fn, arg))

    def at_time(self, t: float, fn: Callable, arg=None) -> None:
        """``fn(arg)`` at time ``t`` (>= now) exactly, priority NORMAL."""
        if t <= self.now:
            self.soon(fn, arg)
            return
        self._seq += 1
        heapq.heappush(self._heap, (t, NORMAL, self._seq, fn, arg))

    @property
    def events(self) -> int:
        return self._seq

    def run(self, until: float | None = None) -> None:
        """Call everything scheduled (before ``until``, which becomes the time)."""
        heap, pop, soon, next_soon = self._heap, heapq.heappop, self._soon, self._soon.popleft
        end = float("inf") if until is None else until
        while True:
            if soon:
                if self.now >= end:
                    break
                if heap:
                    top = heap[0]
                    # the heap's top goes first if it is due now with a lower
                    # priority, or with NORMAL priority but scheduled earlier
                    if top[0] == self.now and (top[1] < NORMAL or (top[1] == NORMAL and top[2] < soon[0][0])):
                        pop(heap)
                        top[3](top[4])
                        continue
                _, fn, arg = next_soon()
                fn(arg)
                continue
            if not heap or heap[0][0] >= end:
                break
            t, _, _, fn, arg = pop(heap)
            self.now = t
            fn(arg)
        if until is not None:
            self.now = until


class SimPyEngine:
    """SimPy as the engine: each call is an event with one callback."""

    def __init__(self):
        import simpy

        self.env = simpy.Environment()
        self._Event = simpy.events.Event
        self._calls = 0

    @property
    def now(self) -> float:
        return self.env._now

    def at(self, delay: float, fn: Callable, arg=None, priority: int = NORMAL) -> None:
        ev = self._Event(self.env)
        ev._ok = True
        ev._value = arg
        ev.callbacks.append(lambda e: fn(e._value))
        self.env.schedule(ev, priority, delay)
        self._calls += 1

    def soon(self, fn: Callable, arg=None) -> None:
        self.at(0.0, fn, arg)

    def at_time(self, t: float, fn: Callable, arg=None) -> None:
        if t <= self.env._now:
            self.soon(fn, arg)
            return
        ev = self._Event(self.env)
        ev._ok = True
        ev._value = arg
        ev.callbacks.append(lambda e: fn(e._value))
        # Environment.schedule computes now + delay; the queue takes the time itself
        heapq.heappush(self.env._queue, (t, NORMAL, next(self.env._eid), ev))
        self._calls += 1

    @property
    def events(self) -> int:
        return self._calls

    def run(self, until: float | None = None) -> None:
        self.env.run(until)


def make_engine(name: str = "lean"):
    if name == "lean":
        return HeapEngine()
    if name == "simpy":
        return SimPyEngine()
    raise ValueError(f"engine {name!r}; allowed: {', '.join(ENGINES)}")
