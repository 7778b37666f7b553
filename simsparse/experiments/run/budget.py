"""Work estimates: no unbounded run by surprise.

Before anything runs, :func:`estimate` counts the points of a config and
estimates the wall seconds and the memory of its largest point; :func:`check`
refuses a config past the :class:`Budget` with the estimate and the key
that drives it (``--force`` runs anyway). While points run, a
:class:`Watchdog` stops a point that still outgrows the budget (memory, or
wall time per point) by interrupting the main thread, so the points
finished before it are kept.

The estimates, measured on this project's simulator:

* seconds: the point's resolution estimates them (``resolve.Resolved.estimate``:
  the evaluators the table chose, the values carried);
* memory, an upper bound, at ``n = n x data_scale`` elements of ``w`` bytes per rank:
  ``P n`` times ``2 w`` (the gradients; the algorithm's input or dense
  result), ``+ 2 w`` when a point runs more than one iteration (the
  error-feedback residuals, the last iteration's inputs), ``+ 8 + w`` when
  its results are checked (the float64 reference and the inputs it is
  checked on); plus the workload's cache of generated gradients (at most
  1 GiB) and, when ``drift`` < 1, its AR(1) noise states (1 GiB, or every
  rank's up to 4 GiB: ``Workload.hold_states``); nothing per element
  when only sizes travel; with sampled values ``w + 4`` bytes for each
  of a rank's about ``sampling.margin`` x k sampled entries (value and index;
  4 k unless the algorithm says; T times that where the draws span T
  iterations, :mod:`simsparse.sampling.paths`, with their values at the
  T - 1 other iterations where those take at most 2 GiB: they are kept
  then, :func:`kept_paths_B`; and the paths a process keeps for later
  points, at most 512 MiB) and SELECTED_PER_K x k entries for its selections and the
  messages made of them, and what its results hold (a union of
  the selections, or a dense sum of n elements: :func:`sampled_results_B`);
  plus 300 bytes per trace record; a schedule's plan microbenchmarks,
  which run first, ``2 w`` per element of their largest size (at most
  ``resolve.PLAN_MAX_ELEMS`` over the ranks), where that is more, and
  :data:`BUCKET_PAIR_B` per pair of ranks and bucket. Peak RSS measured
  for float32 at P = 64..256 and n = 1M, over 9 algorithms: 4.2 to 8.1
  bytes per element for one unchecked iteration, up to 24.6 checked over
  three (28 estimated), plus the caches at small P.

A point whose lockstep rounds decline at run time is stopped
(:func:`declined`) where its events are estimated past the limit.

Limits come from :class:`Budget` (defaults below, 80% of this machine's
memory, or less under an address-space limit: :func:`memory_limit_B`) and
may be changed with ``SIMSPARSE_BUDGET="points=100,seconds=600,memory_gb=2"``.
"""
from __future__ import annotations

import _thread
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field

from ...period import iterations_run
from ...sampling import point_law
from ...sampling.paths import SHARED_PATHS_MAX_B
from ..config.point import Point
from .resolve import PLAN_MAX_ELEMS, messages, values_of

BASE_B = 200e6  # the interpreter, numpy, pandas and the network model
_CACHE_B = float(1 << 30)  # the bound of each of the workload's caches (simsparse.lru.LRU)
_STATES_MAX_B = float(4 << 30)  # the most the noise states' cache grows to (simsparse.workload.STATE_MAX_B)
#: sampled paths are kept from a rank's first iteration to its last (drawn once) while their values at
#: every iteration take at most this; beyond it they are drawn again at each (the same values)
KEEP_PATHS_MAX_B = float(2 << 30)


def physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 8e9


#: what the process maps beyond BASE_B before a point's data (ulimit -v counts it all): VmPeak is 454 MB after
#: importing the simulator (numba, llvmlite), 664 MB with pandas and pyarrow, and the quickstart at P = 2 and 4
#: (tiny data) runs under ulimit -v 780 MB, not 770 MB
AS_MARGIN_B = 600e6


def address_space_limit() -> float | None:
    """This process's address-space limit in bytes (``ulimit -v``, RLIMIT_AS), None where there is none."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, AttributeError, OSError, ValueError):  # pragma: no cover - not POSIX
        return None
    return None if soft == resource.RLIM_INFINITY else float(soft)


def memory_limit_B() -> float:
    """The default memory limit: 80% of physical memory, or the address-space
    limit less :data:`AS_MARGIN_B` where that is smaller."""
    limit, space = 0.8 * physical_memory(), address_space_limit()
    return limit if space is None else max(0.0, min(limit, space - AS_MARGIN_B))


class BudgetError(Exception):
    """A config past the budget, or a point stopped for outgrowing it."""


@dataclass(frozen=True)
class Budget:
    max_points: int = 10_000
    #: the estimated wall seconds of the largest point (and what the watchdog lets a point run)
    max_seconds: float = 4 * 3600.0
    max_memory_B: float = field(default_factory=memory_limit_B)

    @classmethod
    def from_env(cls) -> "Budget":
        """Defaults, overridden by ``SIMSPARSE_BUDGET`` (points=, seconds=, memory_gb=)."""
        text = os.environ.get("SIMSPARSE_BUDGET", "").strip()
        if not text:
            return cls()
        names = {"points": "max_points", "seconds": "max_seconds", "memory_gb": "max_memory_B"}
        kw = {}
        for item in text.split(","):
            key, _, val = item.partition("=")
            try:
                num = float(val)
            except ValueError:
                num = float("nan")
            if key.strip() == "events":
                raise BudgetError("SIMSPARSE_BUDGET: 'events' was replaced by 'seconds' (the estimated wall seconds "
                                  "of the largest point, from the evaluators that will time it); use points=N, "
                                  "seconds=N and memory_gb=N")
            if key.strip() not in names or not (math.isfinite(num) and num > 0):
                raise BudgetError(f"SIMSPARSE_BUDGET: {item.strip()!r} is not allowed; use points=N, seconds=N and "
                                  f"memory_gb=N, positive numbers separated by commas")
            kw[names[key.strip()]] = {"memory_gb": num * 1e9, "points": int(num)}.get(key.strip(), num)
        return cls(**kw)


# -- estimates ------------------------------------------------------------------------

#: a sampled rank's selections and the messages made of them, in entries per k (TopkA at P = 4096: about 2)
SELECTED_PER_K = 4
#: bytes a compressing schedule holds per pair of ranks and bucket beyond its values, calibrated on
#: benchmarks/bench_scale.py's bert_omgs rows (OMGS-SGD over Ok-Topk of BERT, 207 buckets counted, 79 run:
#: peak RSS 0.49 to 0.60 GB at P = 256, 2.40 GB at P = 1024, against 0.45 and 0.78 GB estimated without
#: it). Not one structure: at P = 512 the Python objects were 0.1 GB of the 0.52 GB malloc had in use
BUCKET_PAIR_B = 7.5


@dataclass(frozen=True)
class PointEstimate:
    seconds: float
    memory_B: float
    how: str   # the evaluators and values the estimate assumed


def point_estimate(point: Point, trace: bool = False, resolved=None) -> PointEstimate:
    """What simulating ``point`` will take: the seconds its resolution
    estimates (:attr:`.resolve.Resolved.estimate`) and its memory."""
    from .resolve import resolve

    r = resolved or resolve(point, network_of(point), trace)
    seconds, how = r.estimate
    return PointEstimate(seconds, memory_B(point, "sim", trace), f"{how}, {r.values} values")


_NETWORKS: dict = {}


def network_of(point: Point):
    """The point's network model, built once per description (an estimate of a grid builds each once)."""
    key = json.dumps(point.network, sort_keys=True, default=str)
    if key not in _NETWORKS:
        if len(_NETWORKS) > 32:
            _NETWORKS.clear()
        _NETWORKS[key] = point.network_spec().build()
    return _NETWORKS[key]


def memory_B(point: Point, backend: str = "sim", trace: bool = False, caches: bool = True) -> float:
    """Peak memory of one point, an upper bound (module docstring); without
    ``caches``, what the point itself holds (not the process-wide caches of
    gradients, noise states and shared paths that outlive it)."""
    w = _itemsize(point)
    sim = backend == "sim"
    n = point.workload["n"] * (point.data_scale if sim else 1.0)
    carried = 0.0
    values = values_of(point) if sim else "full"
    if values == "sampled":
        # each rank's entries above the floor (about margin x k of them: value and int32 index; over
        # several iterations a union, kept with its values at every one), its selections and the messages
        # made of them (SELECTED_PER_K x k)
        k = max(1.0, point.workload["density"] * n)
        law = point_law(point)
        T = 1 if law is None else law.T
        drawn = point.algorithm_cls.sampling.margin_for(k) * T
        kept = kept_paths_B(point)
        carried = point.P * k * (drawn * (w + 4) + SELECTED_PER_K * (w + 4)) + kept * (kept <= KEEP_PATHS_MAX_B) \
            + sampled_results_B(point, n, k, w) + (SHARED_PATHS_MAX_B if law is not None and caches else 0.0)
    elif values != "sizes":
        T = iterations_run(point)
        per = 2 * w + (2 * w if T > 1 else 0) + (8 + w if point.check else 0)
        carried = point.P * n * per
        if sim and caches:   # the workload's caches: gradient sets, and every rank's AR(1) noise state when they drift
            carried += min(_CACHE_B, T * point.P * n * w)
            drift = point.workload.get("drift", 1.0)
            if drift < 1:
                states = point.P * n * w
                carried += max(_CACHE_B, min(states, _STATES_MAX_B)) if drift > 0 else min(_CACHE_B, states)
    if point.schedule and values != "sizes":   # the plan's microbenchmarks, run first: their largest size's
        # full gradients and results (drawn once: workload.drawn_once); then every bucket's collective
        carried = max(carried, 2 * w * min(point.P * point.workload["n"], PLAN_MAX_ELEMS)) \
            + point.P ** 2 * messages(point)[1] * BUCKET_PAIR_B
    records = 0.0
    if trace:   # a record per send and receive of every message, in every iteration run
        M, calls = messages(point)
        records = 2 * M * calls * iterations_run(point) * 300
    return BASE_B + carried + records


def _itemsize(point: Point) -> int:
    return 8 if point.workload.get("dtype") == "float64" else 4


def kept_paths_B(point: Point) -> float:
    """What keeping a sampled point's paths to their last iteration adds: the
    values at the T - 1 other iterations of each rank's about margin x k x T
    drawn entries (0 where one draw per iteration is exact)."""
    law = point_law(point)
    if law is None:
        return 0.0
    k = max(1.0, point.workload["density"] * point.workload["n"] * point.data_scale)
    return point.P * k * point.algorithm_cls.sampling.margin_for(k) * law.T * (law.T - 1) * _itemsize(point)


def sampled_results_B(point: Point, n: float, k: float, w: int) -> float:
    """What the results of a sampled point hold beyond the ranks' entries, by
    the algorithm's ``sampling.result``: a union of the P selections (and the
    blocks it is built from), a dense sum of n elements, or one per rank.
    Measured at n = 4M..16M, P = 4..32: within these."""
    P = point.P
    union = min(n, P * k) * (w + 4) * 2
    kind = point.algorithm_cls.sampling.result
    # a dense sum of the gathered selections is one array every rank shares (the memoised kernels run once on
    # the one gathered tuple: benchmarks/bench_scale.py, TopkA, Gaussiank and Ok-Topk at P = 4096, 1.4 to
    # 2.2 GB); SparCML's unions and DSAR's dense results are each rank's own
    return {"k": 0.0, "union": P * union, "dense": 1.25 * n * w + union, "dense_per_rank": 1.5 * P * n * w}[kind]


@dataclass
class Estimate:
    points: int
    seconds: float       # of the point that takes the longest
    memory_B: float      # of the point that needs the most
    total_s: float       # of the whole grid
    most_seconds: Point | None
    most_memory: Point | None


def estimate(points: list[Point], backend: str = "sim", trace: bool = False) -> Estimate:
    """Counts and the largest needs of ``points`` (seconds: the simulator's
    estimate; the real backend's runs take the time they take)."""
    if not points:
        return Estimate(0, 0.0, 0.0, 0.0, None, None)
    if backend == "sim":
        ests = [point_estimate(p, trace) for p in points]
        secs, mem = [e.seconds for e in ests], [e.memory_B for e in ests]
    else:
        secs, mem = [0.0] * len(points), [memory_B(p, backend, trace) for p in points]
    i, j = max(range(len(secs)), key=secs.__getitem__), max(range(len(mem)), key=mem.__getitem__)
    return Estimate(len(points), secs[i], mem[j], sum(secs), points[i], points[j])


def declined(point: Point, max_seconds: float | None) -> None:
    """Called when the lockstep rounds of ``point`` declined and its events are
    to run: :class:`BudgetError` if they are estimated past ``max_seconds``
    (None: no limit)."""
    if max_seconds is None:
        return
    from .resolve import resolve

    est = point_estimate(point, resolved=resolve(point, network_of(point), expand=True))   # (the same values)
    if est.seconds > max_seconds:
        raise BudgetError(f"P = {point.P}, {point.algorithm}: the lockstep rounds declined (a message would wait "
                          f"for a busy port or link of this network), and as events the point would take about "
                          f"{est.seconds:.3g} s, over the limit of {max_seconds:.3g} s. Lower 'P' or 'iterations' + "
                          f"'warmup', or pass --force to run anyway")


def _widest_axis(points: list[Point]) -> tuple[str, int]:
    """The config key with the most distinct values among the points."""
    keys = {"P": lambda p: p.P, "algorithms": lambda p: (p.algorithm, json.dumps(p.params, sort_keys=True)),
            "network": lambda p: json.dumps(p.network, sort_keys=True, default=str),
            "compute": lambda p: json.dumps(p.compute, sort_keys=True, default=str),
            "workload": lambda p: json.dumps(p.workload, sort_keys=True, default=str),
            "schedules": lambda p: (p.schedule, json.dumps(p.schedule_params, sort_keys=True))}
    counts = {k: len({f(p) for p in points}) for k, f in keys.items()}
    key = max(counts, key=counts.get)
    return key, counts[key]


def check(points: list[Point], budget: Budget, backend: str = "sim", trace: bool = False, where="config") -> Estimate:
    """The estimate, or :class:`BudgetError` naming the limit and the key that drives it."""
    est = estimate(points, backend, trace)
    problems = []
    if est.points > budget.max_points:
        key, count = _widest_axis(points)
        problems.append(f"the grid has {est.points:,} points, over the limit of {budget.max_points:,}; the key "
                        f"'{key}' contributes {count} values")
    if backend == "sim" and est.seconds > budget.max_seconds:
        p = est.most_seconds
        pe = point_estimate(p, trace)
        hint = _faster(p, trace, budget)
        problems.append(f"the largest point (P = {p.P}, {p.algorithm}) would take about {pe.seconds:.3g} s "
                        f"({pe.how}), over the limit of {budget.max_seconds:.3g} s; driven by 'P' = {p.P} and the "
                        f"{iterations_run(p)} iterations it runs ('iterations' + 'warmup' = {p.iterations + p.warmup}, "
                        f"and one of each kind of its periodic work they miss){hint}")
    if est.memory_B > budget.max_memory_B:
        p = est.most_memory
        lighter = ""
        if backend == "sim" and p.evaluation != "fast":
            from dataclasses import replace

            fast_B = memory_B(replace(p, evaluation="fast"), backend, trace)
            if fast_B <= budget.max_memory_B:
                lighter = f"; with 'evaluation: fast' it would need about {fast_B / 1e9:.3g} GB (sampled values)"
        scale = f" x data_scale {p.data_scale:g}" if backend == "sim" and p.data_scale < 1 else ""
        problems.append(f"the largest point needs about {est.memory_B / 1e9:.3g} GB of memory, over the limit of "
                        f"{budget.max_memory_B / 1e9:.3g} GB; driven by 'workload.n' = {p.workload['n']:,}{scale} "
                        f"times 'P' = {p.P} ranks" + (("; a smaller 'data_scale' shrinks it" if p.data_scale < 1
                                                       else "; 'data_scale' below 1 shrinks it") if backend == "sim" else "")
                        + (" (the limit is this process's address-space limit, ulimit -v, less what the "
                           "interpreter maps)" if address_space_limit() is not None
                           and budget.max_memory_B == memory_limit_B() < 0.8 * physical_memory() else "") + lighter)
    if problems:
        raise BudgetError(f"{where}: " + "; ".join(problems) + ". Lower the key named, or pass --force to run anyway")
    return est


def _faster(point: Point, trace: bool, budget: Budget) -> str:
    """A setting under which ``point`` would fit the time limit, as a clause, or ''."""
    from dataclasses import replace

    for mode in ("fast", "sampled"):
        if mode == point.evaluation:
            continue
        try:
            if point_estimate(replace(point, evaluation=mode), trace).seconds <= budget.max_seconds:
                return f"; with 'evaluation: {mode}' it would take about " \
                       f"{point_estimate(replace(point, evaluation=mode), trace).seconds:.3g} s"
        except Exception:   # (a mode the point cannot take: sampled values of an algorithm that reads every value)
            continue
    return ""


# -- while running --------------------------------------------------------------------

def rss_B() -> float:
    """This process's resident memory now."""
    try:
        with open("/proc/self/statm") as f:
            return float(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_of(fn):
    """``fn()`` and this process's peak resident memory while it ran: the
    high-water mark is started afresh first (Linux's ``clear_refs`` code 5,
    since 4.0; elsewhere the process's peak since it started), so a worker's
    earlier, larger point is not the next one's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover - not Linux, or not allowed
        pass
    return fn(), _peak_rss_B()


def _peak_rss_B() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    import resource

    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Watchdog:
    """Stops the running point when this process outgrows ``max_memory_B``
    or the point runs longer than ``max_point_s``: it records why in
    :attr:`breach` and raises KeyboardInterrupt in the main thread (the
    caller turns it into :class:`BudgetError`). ``max_point_s=None``: no
    time limit (``--force``)."""

    def __init__(self, max_memory_B: float, max_point_s: float | None, poll_s: float = 0.2):
        self.max_memory_B, self.max_point_s, self.poll_s = max_memory_B, max_point_s, poll_s
        self.breach: str | None = None
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="simsparse-watchdog", daemon=True)

    def point_started(self) -> None:
        self._started = time.monotonic()

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            rss, ran = rss_B(), time.monotonic() - self._started
            if rss > self.max_memory_B:
                self.breach = f"memory reached {rss / 1e9:.3g} GB, over the limit of {self.max_memory_B / 1e9:.3g} GB"
            elif self.max_point_s is not None and ran > self.max_point_s:
                self.breach = f"the point ran {ran:.0f} s, over the limit of {self.max_point_s:.0f} s"
            if self.breach:
                _thread.interrupt_main()
                return

