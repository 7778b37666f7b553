"""Per-rank gradients for an experiment point: synthetic, or replayed from files.

``Workload(**point.workload)`` (the config's ``workload:`` keys are its fields)
gives rank r's gradient at iteration t with ``grad(r, t)``, a read-only numpy
array; every backend and process builds exactly the same inputs from
(seed, iteration, rank) without communicating them.

Synthetic gradients are ``g[r,t] = L * F(u[r,t])``:

* ``u[r,t]``: standard normal noise, i.i.d. over coordinates and ranks, drawn
  from numpy's PCG64 seeded with ``(seed, t, r)``. **drift** makes it change
  slowly: ``u[r,0] = e[r,0]``, ``u[r,t] = rho u[r,t-1] + sqrt(1-rho^2) e[r,t]``
  with ``rho = 1 - drift``, so ``u`` is N(0,1) at every t and
  ``corr(u_t, u_t+s) = rho^s``. ``drift = 1`` (default): independent
  iterations; ``drift = 0``: the same gradient every iteration. The last state
  per rank is cached, so consecutive iterations cost one draw each.
* ``F``: the marginal **distribution**, by a Gaussian copula: the sign of ``u``
  and ``|x| = Q(2 Phi(-|u|))`` with ``Q`` the upper quantile of ``|X|``:
  ``normal`` (F is the identity), ``laplace`` (unit variance) or
  ``student_t`` with ``df > 2`` degrees of freedom (scaled to unit variance):
  heavy tails, while ``u`` keeps the temporal correlation.
* **Hot sets** (used when ``overlap`` is set or ``skew > 0``): rank r has a
  set ``H_r`` of ``k = round(density n)`` coordinates whose magnitudes are the
  upper ``k/n`` tail of ``|X|`` (``tau' = (k/n) tau``) and all others the rest
  (``tau' = k/n + (1 - k/n) tau``), where ``tau = 2 Phi(-|u|)``. So ``H_r`` is
  exactly the rank's top-k set, the marginal distribution is unchanged, and
  ``H_r`` is fixed over iterations (the values in it drift with ``u``).

  - **overlap** ``f`` in [0, 1]: ``H_r = S + D_r`` with ``round(f k)``
    coordinates ``S`` shared by all ranks and the rest ``D_r`` disjoint across
    ranks: 1 gives identical top-k sets, 0 disjoint ones (needs ``P k <= n``).
    The Jaccard index of two ranks' top-k sets is ``f / (2 - f)``.
  - overlap unset (default): independent ranks. Without skew no hot set is
    planted at all (i.i.d. values; two top-k sets share ``k^2/n`` coordinates
    on average, the same as ``f = k/n``); with skew each rank draws its own.
  - **skew** ``s`` in [0, 1): hot coordinates are placed with density
    ``proportional to (i/n)^-s``, the same law on every rank, so the fraction of
    them in the first ``q`` of the index space is ``q^(1-s)`` (``s = 0``:
    uniform). Drawn without replacement (Efraimidis-Spirakis keys), so the law
    holds only where it asks for less than one hot coordinate per index: up to
    about ``i/n = ((1-s) k/n)^(1/s)`` nearly every index is hot and the rest spreads further
    (negligible for s <= 0.5 at 1 % density; at s = 0.8 a fraction 0.56, not
    0.66, lies in the first eighth). With ``overlap`` the ``D_r`` are
    consecutive blocks of one weighted order, so when ``P k`` is a large part
    of ``n`` later ranks' sets are less skewed.
* ``L``: the per-layer scale. With **layers** (sizes in gradient order) or
  **model** (per-tensor parameter counts from ``simsparse/data/layer_params.json``),
  layer l is multiplied by ``10^(-layer_spread U_l)`` with ``U_l ~ U(0, 1)``
  drawn from the seed: per-layer RMS values log-uniform over ``layer_spread``
  decades, the same on every rank and iteration (DEFT's layer norm
  differences). The top-k then concentrates in high-norm layers, so hot sets
  are the exact top-k only with equal layer norms (``layer_spread: 0``).

**source** ``{path, key}`` replays recorded gradients instead: rank r at
iteration t reads array ``key`` of ``path.format(rank=r, iteration=t)`` (an
``.npz``, relative to the working directory). :func:`.gradient_files.record_gradients` writes
such files from a torch model's ``.grad``\\ s.
"""
from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

import numpy as np

from .gradient_files import FileSource
from .lru import LRU

DISTRIBUTIONS = ("normal", "laplace", "student_t")
#: entropy tags of the auxiliary random streams (never an iteration number)
_TAG_HOT, _TAG_LAYERS = 2**40 + 1, 2**40 + 2


@dataclass(frozen=True)
class Workload:
    n: int
    density: float = 0.01
    dtype: str = "float32"
    seed: int = 0
    distribution: str = "normal"
    df: float = 3.0
    overlap: float | None = None
    skew: float = 0.0
    drift: float = 1.0
    model: str | None = None
    layers: tuple | None = None
    layer_spread: float = 2.0
    source: FileSource | None = None

    def __post_init__(self):
        if isinstance(self.source, dict):
            object.__setattr__(self, "source", FileSource(**self.source))
        object.__setattr__(self, "layers", resolve_layers(self.model, self.layers, self.n)[0])
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"workload.distribution = {self.distribution!r}; allowed: {', '.join(DISTRIBUTIONS)}")
        if self.distribution == "student_t" and not self.df > 2:
            raise ValueError(f"workload.df = {self.df}; student_t needs df > 2 (finite variance)")
        if self.overlap is not None and not 0 <= self.overlap <= 1:
            raise ValueError(f"workload.overlap = {self.overlap}; allowed: 0 (disjoint) to 1 (identical), or unset")
        if not 0 <= self.skew < 1:
            raise ValueError(f"workload.skew = {self.skew}; allowed: 0 <= skew < 1")
        if not 0 <= self.drift <= 1:
            raise ValueError(f"workload.drift = {self.drift}; allowed: 0 (static) to 1 (independent iterations)")

    # -- public ---------------------------------------------------------------
    def scaled(self, data_scale: float) -> "Workload":
        """The same workload at a reduced dimension (the simulator's
        ``data_scale``): every layer shrinks by the factor (at least one
        element), n is their sum, everything else is kept."""
        if data_scale >= 1:
            return self
        if self.source is not None:
            raise ValueError("data_scale < 1 cannot shrink gradients replayed from files (workload.source)")
        sizes = self.layers or (self.n,)
        small = tuple(max(1, int(round(s * data_scale))) for s in sizes)
        return replace(self, n=sum(small), layers=small if self.layers else None, model=None)

    @property
    def k(self) -> int:
        """Hot-set size: round(density n), as ``Setup.k``."""
        return max(1, min(self.n, int(round(self.density * self.n))))

    @property
    def planted(self) -> bool:
        return self.source is None and (self.overlap is not None or self.skew > 0)

    def check_P(self, P: int) -> str | None:
        """Why this workload cannot feed P ranks, or None."""
        if self.planted and self.overlap is not None:
            m, k = self._shared(), self.k
            if m + P * (k - m) > self.n:
                return (f"overlap = {self.overlap} keeps {k - m} of each rank's top-k = {k} coordinates disjoint from "
                        f"the other ranks', which needs {m} + P*{k - m} = {m + P * (k - m)} <= n = {self.n}; "
                        f"raise n or overlap, or lower density")
        return None

    def hot_set(self, rank: int) -> np.ndarray | None:
        """Rank's planted top-k coordinates (sorted), or None when nothing is planted."""
        if not self.planted:
            return None
        if self.overlap is None:
            return _independent_hot(self.n, self.k, self.seed, self.skew, rank)
        m, k = self._shared(), self.k
        if m + (rank + 1) * (k - m) > self.n:
            raise ValueError(f"workload: rank {rank}: {self.check_P(rank + 1)}")
        order = _weighted_order(self.n, self.seed, self.skew)
        lo = m + rank * (k - m)
        return np.sort(np.concatenate([order[:m], order[lo:lo + k - m]]))

    def grad(self, rank: int, iteration: int = 0) -> np.ndarray:
        if self.source is not None:
            g = self._replay(rank, iteration)
        else:
            g = self._shape(self._noise(rank, iteration), rank)
            if self.layers is not None and self.layer_spread > 0:
                g = (g * _scale_vector(self)).astype(self.dtype, copy=False)   # float32 already: no second copy
        g.setflags(write=False)  # rank programs must not modify their input
        return g

    def hold_states(self, P: int) -> None:
        """Make the AR(1) noise cache hold this workload's ``P`` ranks (one
        vector each, up to :data:`STATE_MAX_B`) when it drifts, dropping
        other streams' states first: a simulation that draws every rank's
        gradient each iteration then draws one noise vector per rank and
        iteration (:class:`.lru.LRU`)."""
        need = P * self.n * np.dtype(self.dtype).itemsize if 0 < self.drift < 1 else 0
        _STATE.resize(max(STATE_MIN_B, min(need, STATE_MAX_B)))

    def grads(self, P: int, iteration: int = 0) -> list[np.ndarray]:
        key = (self, P, iteration)
        hit = _CACHE.get(key)
        if hit is None:
            problem = self.check_P(P)
            if problem:
                raise ValueError(f"workload with P = {P}: {problem}")
            hit = [self.grad(r, iteration) for r in range(P)]
            if _KEEP[-1]:
                _CACHE.put(key, hit, P * self.n * np.dtype(self.dtype).itemsize)
        return hit

    # -- the pieces ---------------------------------------------------------------
    def _shared(self) -> int:
        return int(round(self.overlap * self.k))

    def _noise(self, rank: int, t: int) -> np.ndarray:
        """u[rank, t]: N(0,1) per coordinate, AR(1) over iterations."""
        dt = np.dtype(self.dtype)
        if self.drift >= 1:
            return _normal(self.seed, t, rank, self.n, dt)
        key = (self.n, self.dtype, self.seed, self.drift, rank)
        hit = _STATE.get(key)
        t0, u = hit if hit is not None and hit[0] <= t else (0, _normal(self.seed, 0, rank, self.n, dt))
        rho = 1.0 - self.drift
        c = math.sqrt(1.0 - rho * rho)
        if c > 0:
            for s in range(t0 + 1, t + 1):   # u = rho u + c e, in u's buffer where no gradient is that buffer
                if u.flags.writeable:
                    e = _normal(self.seed, s, rank, self.n, dt, out=_scratch(self.n, dt))
                    e *= c
                    u *= rho
                    u += e
                else:
                    e = _normal(self.seed, s, rank, self.n, dt)
                    e *= c
                    e += rho * u
                    u = e
        _STATE.put(key, (t, u), u.nbytes)
        return u

    def _shape(self, u: np.ndarray, rank: int) -> np.ndarray:
        """The copula: marginal distribution and planted hot set."""
        from .quantile import special

        hot = self.hot_set(rank)
        if hot is None and self.distribution == "normal":
            return u
        logtau = math.log(2.0) + special.log_ndtr(-np.abs(u, dtype=np.float64))  # log P(|Z| > |u|)
        if hot is not None:
            d = self.k / self.n
            if d < 1:
                cold = np.logaddexp(math.log(d), math.log1p(-d) + logtau)
                cold[hot] = math.log(d) + logtau[hot]
                logtau = cold
        mag = _abs_quantile(self.distribution, self.df)(logtau)
        return np.copysign(mag, u).astype(self.dtype)

    def _replay(self, rank: int, t: int) -> np.ndarray:
        g, _ = self.source.read(rank, t)
        if len(g) != self.n:
            raise ValueError(f"workload.source: {self.source.file(rank, t)} holds {len(g)} values "
                             f"({self.source.key!r}), but workload.n = {self.n}")
        return g.astype(self.dtype)


# -- layers --------------------------------------------------------------------------

@lru_cache(maxsize=1)
def model_layer_params() -> dict:
    """Per-tensor parameter counts of known models (``simsparse/data/layer_params.json``)."""
    return json.loads(resources.files("simsparse").joinpath("data", "layer_params.json").read_text())


def model_sizes(model: str) -> tuple:
    """Per-tensor parameter counts of ``model`` in registration order: a packaged model, or
    one from elsewhere (:func:`simsparse.compute.models.model_table`)."""
    known = model_layer_params()
    if model in known:
        return tuple(known[model]["sizes_in_registration_order"])
    from .compute.models import model_table
    try:
        return tuple(int(t["size"]) for t in model_table(model)["tensors"])
    except KeyError as e:
        raise ValueError(f"workload.model: {e.args[0]}") from None


def resolve_layers(model: str | None, layers, n: int | None) -> tuple[tuple | None, int | None]:
    """(layer sizes, n) from ``model`` or ``layers``; n is checked or filled in."""
    if model is not None:
        sizes = model_sizes(model)
        if layers is not None and tuple(layers) != sizes:
            raise ValueError(f"workload: give either layers or model ({model!r}), not both")
        layers = sizes
    if layers is None:
        return None, n
    layers = tuple(int(s) for s in layers)
    if any(s <= 0 for s in layers):
        raise ValueError("workload.layers: every layer size must be > 0")
    total = sum(layers)
    if n is not None and n != total:
        what = f"model {model!r} has" if model else "the layers sum to"
        raise ValueError(f"workload.n = {n} but {what} {total} parameters; omit n or set it to {total}")
    return layers, total


def layer_scales(w: Workload) -> np.ndarray:
    """Per-layer RMS multipliers ``10^(-layer_spread U_l)`` of a workload (one 1 without layers)."""
    if w.layers is None:
        return np.ones(1)
    return 10.0 ** (-w.layer_spread * np.random.default_rng([w.seed, _TAG_LAYERS]).random(len(w.layers)))


@lru_cache(maxsize=4)
def _scale_vector(w: Workload) -> np.ndarray:
    v = np.repeat(layer_scales(w), w.layers).astype(w.dtype)
    v.setflags(write=False)
    return v


# -- hot sets -------------------------------------------------------------------------

def _position_weights(n: int, skew: float) -> np.ndarray:
    """Probability mass of each index under the position law F(x) = x^(1-skew)."""
    edges = (np.arange(n + 1, dtype=np.float64) / n) ** (1.0 - skew)
    return np.diff(edges)


def _keys(n: int, skew: float, rng) -> np.ndarray:
    """Efraimidis-Spirakis keys: ordering by them descending is a weighted
    sample without replacement."""
    u = rng.random(n)
    if skew == 0:
        return u
    with np.errstate(divide="ignore"):
        return np.log(u) / _position_weights(n, skew)


@lru_cache(maxsize=4)
def _weighted_order(n: int, seed: int, skew: float) -> np.ndarray:
    order = np.argsort(-_keys(n, skew, np.random.default_rng([seed, _TAG_HOT])), kind="stable")
    order.setflags(write=False)
    return order


@lru_cache(maxsize=1024)
def _independent_hot(n: int, k: int, seed: int, skew: float, rank: int) -> np.ndarray:
    keys = _keys(n, skew, np.random.default_rng([seed, _TAG_HOT, rank + 1]))
    hot = np.sort(np.argpartition(-keys, k - 1)[:k]) if k < n else np.arange(n)
    hot.setflags(write=False)
    return hot


# -- distributions -------------------------------------------------------------------

def _normal(seed: int, t: int, rank: int, n: int, dt, out: np.ndarray | None = None) -> np.ndarray:
    """N(0, 1) draws of (seed, t, rank); ``out``: into that buffer (the same values)."""
    dtype = np.float64 if dt == np.float64 else np.float32
    rng = np.random.default_rng([seed, t, rank])
    if out is None:
        return rng.standard_normal(n, dtype=dtype)
    return rng.standard_normal(dtype=dtype, out=out)


#: one scratch vector for the AR(1) innovations: fresh memory's first touch costs this host more than the draw
_SCRATCH: dict = {}


def _scratch(n: int, dt) -> np.ndarray:
    key = (n, np.dtype(dt).str)
    buf = _SCRATCH.get(key)
    if buf is None:
        _SCRATCH.clear()
        buf = _SCRATCH[key] = np.empty(n, dtype=dt)
    return buf


@lru_cache(maxsize=8)
def _abs_quantile(distribution: str, df: float):
    """Q(log tau): the magnitude whose upper tail probability under |X| is tau."""
    from .quantile import special

    if distribution == "normal":
        return lambda logtau: -special.ndtri(0.5 * np.exp(logtau))
    if distribution == "laplace":  # scale b = 1/sqrt(2): unit variance
        return lambda logtau: -logtau / math.sqrt(2.0)
    # student_t: stdtrit is slow (~0.4 us/value), so interpolate h = log(m / -g)
    # on a fine grid of g = log tau (smooth; 1e-7 relative, 40 ms to build);
    # h is flat towards g = 0 (m ~ -g / (2 f(0))), np.interp holds it there;
    # beyond the grid the tail is a power law, m ~ tau^(-1/df).
    g = np.linspace(-100.0, -1e-6, 100001)
    m = -special.stdtrit(df, 0.5 * np.exp(g))
    h = np.log(m / -g)
    unit = math.sqrt((df - 2.0) / df)

    def q(logtau):
        lt = np.minimum(logtau, 0.0)
        out = np.exp(np.interp(lt, g, h)) * -lt
        deep = lt < g[0]
        if deep.any():
            out[deep] = m[0] * np.exp((g[0] - lt[deep]) / df)
        return unit * out

    return q


# -- caches --------------------------------------------------------------------------

_CACHE = LRU(max_bytes=1 << 30)
#: the last AR(1) noise state per (stream, rank): iteration t costs one draw after t-1; at least
#: STATE_MIN_B, and as large as a simulated point's every rank up to STATE_MAX_B (Workload.hold_states)
STATE_MIN_B, STATE_MAX_B = 1 << 30, 4 << 30
_STATE = LRU(max_bytes=STATE_MIN_B, sweeps=True)
#: whether gradient sets drawn now are kept for later points (:func:`drawn_once`)
_KEEP = [True]


@contextmanager
def drawn_once():
    """Gradient sets drawn inside are not kept in the cache: points that no
    later point repeats (a schedule's plan microbenchmarks, each size once;
    kept, they were 0.55 GB of OMGS-SGD's 1.1 GB at P = 256)."""
    _KEEP.append(False)
    try:
        yield
    finally:
        _KEEP.pop()
