"""Algorithm base class and registry.

An algorithm is a class registered by name. The backend makes one instance
per rank (so instances keep per-rank state across iterations: thresholds,
boundaries, residuals) and calls ``iteration(ctx, grad)`` once per
iteration. That wraps the algorithm's own ``run(ctx, x)`` -- a generator of
requests (see :mod:`simsparse.ops`) whose return value is the rank's result --
with error feedback when the params ask for it.

Correctness: ``reference(inputs, setup, params, states)`` gives what every
rank's result should equal, computed with plain numpy from every rank's
actual input to ``run`` (the gradient plus residual under error feedback) and
every rank's ``check_state()`` (e.g. the thresholds it used); backends use it
for the ``correct`` column.

Sparse algorithms set ``self.contributed`` in ``run``: the indices of the
input whose values reached the result (Ok-Topk's index intersection; the
local top-k for TopkA). Error feedback zeroes those in the accumulator and
keeps the rest as the residual.

Periodic work: ``periodic_work(params)`` names the tasks that run only in
some iterations, ``{task: period}``; a task runs in iteration t (the
instance's ``iteration_no``, from 0) when ``t % period == 0``, and ``run``
asks :meth:`Algorithm.due`, so the declaration is what decides. The default
is none. A role that moves to another rank every iteration (DEFT's decision
worker, CLT-k's leader) is the same work in every iteration, so it is not
periodic work. The experiment loop reports the mean over whole periods
(:mod:`simsparse.period`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..registry import Registry, subclass_of


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SparseParams(BaseModel):
    """Parameters every sparse algorithm accepts."""

    model_config = ConfigDict(extra="forbid")
    error_feedback: bool = Field(
        False, description="keep unsent values as a residual added to the next gradient "
                           "(Ok-Topk Alg. 2, SparCML Alg. 1, DEFT Alg. 1)")


@dataclass(frozen=True)
class Setup:
    """What an algorithm instance knows about its run."""

    rank: int
    P: int
    n: int
    density: float
    dtype: str = "float32"
    #: sizes of the model's layers (tensors) in gradient order, summing to n
    layers: tuple | None = None

    @property
    def layer_sizes(self) -> tuple:
        return self.layers if self.layers else (self.n,)

    @property
    def k(self) -> int:
        """Elements selected per worker: round(density * n), at least 1."""
        return max(1, min(self.n, int(round(self.density * self.n))))


@dataclass(frozen=True)
class Sampling:
    """What an algorithm needs of a sampled gradient (``values: sampled``,
    :mod:`simsparse.sampling`), which carries only the entries above a floor
    near its top k: the algorithm reads only its input's largest entries (a
    top-k, thresholds near the k-th magnitude), its moments, and values at a
    few indices."""

    #: the gradient carries about ``margin x k`` entries: every threshold the
    #: algorithm applies must stay above its floor (else a clear error)
    margin: float = 4.0
    #: reads its input only through an exact top-k (TopkA, gTopk, SparCML, CLT-k)
    top_k: bool = False
    #: what a rank's result holds, for the memory budget: ``k`` entries, the
    #: ``union`` of every rank's selection (up to P k), a ``dense`` sum of n
    #: elements that every rank computes from the same gathered blocks (one
    #: per point) besides that union, or a ``dense_per_rank`` sum
    result: str = "k"

    def margin_for(self, k: float) -> float:
        """The margin a rank's sampled gradient is drawn with when it selects
        about k entries: ``margin``, or less where the algorithm's thresholds
        stay within a few sqrt(k) of k. An exact top-k needs only its k-th
        magnitude above the floor: the count above it is binomial with mean
        margin x k, so eight standard deviations past k suffice."""
        if self.top_k:
            return min(self.margin, 1.0 + 8.0 / math.sqrt(max(k, 1.0)))
        return self.margin

    def floors_learnt(self, params: BaseModel) -> bool:
        """Whether, under error feedback, its selections are expected to reach
        below floors set for k (thresholds carried from one iteration to the
        next): the simulator then learns the floors from a pilot at a few
        ranks first (:mod:`simsparse.experiments.run.simulate`)."""
        return False


class Algorithm:
    """Base class. Subclasses set ``Params`` (a pydantic model, extra keys
    forbidden) and implement ``run`` and ``reference``."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = NoParams
    #: an exact dense allreduce (ring, recursive doubling, Rabenseifner), as
    #: opposed to a compressing (sparse or quantized) one
    dense: ClassVar[bool] = False
    #: neither its time nor its bytes depend on the values (only on sizes), so
    #: the simulator may run it on size-only vectors (``values: auto``)
    value_free: ClassVar[bool] = False
    #: ``run`` of a value-free schedule as lockstep rounds, if it has them:
    #: ``rounds(P, n)`` yields (destination per rank, elements per rank, kernel
    #: the receivers apply) per round; the simulator may then evaluate it in
    #: bulk (:mod:`simsparse.backends.fast.rounds`)
    rounds: ClassVar = None
    #: how it runs on a sampled gradient (``values: sampled``); None: it reads
    #: every value of its input, which a sampled gradient does not carry
    sampling: ClassVar[Sampling | None] = None

    def __init__(self, setup: Setup, params: BaseModel | None = None):
        self.setup = setup
        self.params = params if params is not None else self.Params()
        self.residual = None      # error-feedback accumulator remainder
        self.contributed = None   # set by sparse run(): input indices that reached the result
        self.last_input = None    # what run() was given in the last iteration (if keep_input)
        self.keep_input = True    # keep it: the loop's check reads it
        self.iteration_no = 0     # iterations completed by this instance

    @property
    def P(self) -> int:
        return self.setup.P

    @property
    def k(self) -> int:
        return self.setup.k

    def iteration(self, ctx, grad):
        """What backends call once per iteration: error feedback around run().
        Without error feedback or ``keep_input`` this frame lets go of the
        gradient, so that run() may drop it once it has selected."""
        x = grad
        del grad
        ef = getattr(self.params, "error_feedback", False)
        # unchecked (no keep_input), the residual's buffer takes the gradient and then becomes the next
        # residual: the same values, without two fresh vectors a rank and iteration
        own = ef and self.residual is not None and not self.keep_input
        if ef and self.residual is not None:   # (own: add into the residual's buffer, which then is x)
            with ctx.phase("error_feedback"):
                x = yield (ctx.compute("add", self.residual, x, inplace=True) if own
                           else ctx.compute("add", x, self.residual))
            self.residual = None
        self.last_input = x if self.keep_input else None
        self.contributed = None
        if not ef:
            run = self.run(ctx, x)
            del x
            result = yield from run
        else:
            result = yield from self.run(ctx, x)
            with ctx.phase("error_feedback"):
                self.residual = yield from self.residual_after(ctx, x, own)
        self.iteration_no += 1
        return result

    @classmethod
    def periodic_work(cls, params: BaseModel) -> dict[str, int]:
        """``{task: period}`` of the work that runs only in some iterations:
        in iteration t when ``t % period == 0`` (module docstring); none by default."""
        return {}

    def due(self, task: str) -> bool:
        """Whether periodic ``task`` runs in this iteration (``iteration_no``)."""
        return self.iteration_no % self.periodic_work(self.params)[task] == 0

    def skip_to(self, t: int) -> None:
        """Go on as iteration ``t``: the experiment loop skips the iterations
        whose kind it has measured. The state (thresholds, boundaries,
        residuals) stays that of the last iteration run."""
        if t < self.iteration_no:
            raise ValueError(f"{self.name}: cannot go back from iteration {self.iteration_no} to {t}")
        self.iteration_no = t

    def residual_after(self, ctx, x, own: bool = False):
        """Generator: the error-feedback residual after ``run(ctx, x)``; by
        default x with the ``contributed`` entries zeroed (``own``: x is this
        instance's buffer, to be zeroed where it lies). Compressors whose
        result is no subset of the input (FFT, quantizers) override it."""
        if self.contributed is None:
            raise RuntimeError(f"{self.name} does not report contributed indices; error feedback impossible")
        return (yield ctx.compute("zero_at", x, self.contributed, inplace=own))

    def run(self, ctx, x):  # pragma: no cover - interface
        """Generator: yields requests, returns the rank's result."""
        raise NotImplementedError

    def check_state(self) -> dict:
        """Small per-rank state the reference needs (thresholds used, ...),
        as plain Python/numpy values; gathered from all ranks."""
        return {}

    @classmethod
    def reference(cls, inputs: list[np.ndarray], setup: Setup, params: BaseModel, states: list[dict]) -> np.ndarray:
        """The dense vector every rank's result should equal, given every
        rank's input to run() and check_state()."""
        raise NotImplementedError

    @classmethod
    def messages(cls, P: int, n: int, k: int, params) -> float:
        """Point-to-point messages one iteration sends, all ranks together (the cost model's count).

        ``params`` is the validated ``Params`` instance; ``n`` and ``k`` are
        the point's full sizes (k per rank, :attr:`Setup.k`). Subclasses
        count their schedule (the helpers below: :func:`rd_messages`, ...);
        this default is a conservative guess for one that does not, four
        all-to-alls' worth, ``4P(P-1)``: at least the budget's ``2P(P-1) +
        2P ceil(log2 P)`` and every registered algorithm's count with its
        default params (TopkDSA reaches it with ring allgathers); some params
        exceed it (Ok-Topk's exact thresholds in every iteration)."""
        return float(4 * P * (P - 1))

    @classmethod
    def check_setup(cls, P: int, n: int, params: BaseModel) -> str | None:
        """Why this algorithm cannot run with these settings, or None."""
        return None

    @classmethod
    def tolerance(cls, setup: Setup) -> float:
        """Relative tolerance of the check (reduction order differs)."""
        eps = float(np.finfo(np.dtype(setup.dtype)).eps)
        return 16 * eps * max(1, setup.P)

    @classmethod
    def tolerance_for(cls, setup: Setup, params: BaseModel) -> float:
        """Tolerance when it depends on the params (e.g. a quantizer's bits);
        defaults to ``tolerance(setup)``."""
        return cls.tolerance(setup)


def agreed_state(states: list[dict], key: str, what: str):
    """The value of ``key`` that every rank's check_state() reports; raises
    when ranks disagree (a schedule bug, not a rounding difference)."""
    values = {s[key] for s in states}
    if len(values) != 1:
        raise AssertionError(f"ranks disagree on {what}: {sorted(values)}")
    return values.pop()


def host_indices(a) -> np.ndarray | None:
    """Indices (numpy or a torch tensor, any device) as host int64, for a
    check state; None stays None."""
    if a is None:
        return None
    return np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a, dtype=np.int64)


def topk_choice(x: np.ndarray, k: int, chosen=None) -> np.ndarray:
    """The indices of a top-k of x by magnitude: ``chosen`` (a rank's own
    selection) when it is one -- k distinct indices whose smallest magnitude
    is at least the largest magnitude left out -- else numpy's choice. Ties
    at the k-th magnitude make several selections valid, and torch.topk and
    numpy break them differently."""
    from ..compute.kernels import topk as topk_kernel

    x = np.asarray(x)
    k = min(int(k), len(x))
    if chosen is not None:
        chosen = np.asarray(chosen, dtype=np.int64)
        if len(chosen) == k and len(np.unique(chosen)) == k:
            mag = np.abs(x)
            rest = np.ones(len(x), bool)
            rest[chosen] = False
            if k == 0 or not rest.any() or mag[chosen].min() >= mag[rest].max():
                return chosen
    return np.asarray(topk_kernel.numpy(x, k).indices, dtype=np.int64)


#: the algorithms by name: the package's, a dotted path, or entry points of group ``simsparse.algorithms``
ALGORITHMS = Registry("algorithm", "simsparse.algorithms", subclass_of(Algorithm),
                      "a subclass of simsparse.algorithms.Algorithm")


#: class decorator: ``@register("name")`` registers the class under that name
register = ALGORITHMS.named
#: the algorithm class a name resolves to (:class:`~simsparse.registry.Registry`)
get_algorithm = ALGORITHMS.__getitem__


def dense_sum(inputs, setup, params, states) -> np.ndarray:
    """The exact sum of the P gradients: the reference of the dense allreduces."""
    out = np.zeros(setup.n)
    for g in inputs:
        out += g
    return out


def pof2_floor(P: int) -> int:
    """Largest power of two <= P."""
    return 1 << (P.bit_length() - 1)


# -- message counts of the helper collectives (all P ranks together; Algorithm.messages) ----------

def fold_messages(P: int) -> int:
    """MPICH's fold (:class:`~.collectives.Fold`): ``rem = P - pof2`` messages
    in (even to odd), ``rem`` back out."""
    return 2 * (P - pof2_floor(P))


def rd_messages(P: int) -> int:
    """Recursive doubling over any P with MPICH's fold (the dense allreduce,
    :class:`~.collectives.AllreduceHost`, the ``rd`` :class:`~.collectives.Allgather`):
    ``pof2 log2(pof2) + 2 (P - pof2)``; 0 at P = 1."""
    pof2 = pof2_floor(P)
    return pof2 * (pof2.bit_length() - 1) + fold_messages(P)


def rabenseifner_messages(P: int) -> int:
    """Rabenseifner (recursive halving, then doubling) with the fold:
    ``2 pof2 log2(pof2) + 2 (P - pof2)``."""
    pof2 = pof2_floor(P)
    return 2 * pof2 * (pof2.bit_length() - 1) + fold_messages(P)


def ring_allreduce_messages(P: int) -> int:
    """Ring allreduce: 2(P-1) steps, every rank sending once a step: ``2P(P-1)``."""
    return 2 * P * (P - 1)


def allgather_messages(P: int, algorithm: str = "rd") -> int:
    """An :class:`~.collectives.Allgather`: ``rd`` as :func:`rd_messages`
    (the fold's return is one bundle), ``ring`` ``P(P-1)``."""
    if algorithm == "ring":
        return P * (P - 1)
    if algorithm == "rd":
        return rd_messages(P)
    raise ValueError(f"allgather algorithm {algorithm!r}; allowed: rd, ring")


def alltoall_messages(P: int) -> int:
    """An :class:`~.collectives.Alltoall` (rotated or not) or a split that sends
    every other rank its part, empty or not: ``P(P-1)``."""
    return P * (P - 1)


def bcast_messages(P: int) -> int:
    """A binomial-tree :class:`~.collectives.Bcast`: every rank but the root receives once, ``P-1``."""
    return P - 1


#: :func:`~.dense.allreduce`'s ``auto`` switch: recursive doubling up to this many bytes, Rabenseifner above
AUTO_ALLREDUCE_RD_MAX_B = 2048


def auto_allreduce_messages(P: int, count: float, itemsize: int = 4) -> int:
    """:func:`~.dense.allreduce` ``auto`` on ``count`` values of ``itemsize``
    bytes (full size, float32 by default): recursive doubling up to 2048
    bytes, Rabenseifner above."""
    if count * itemsize <= AUTO_ALLREDUCE_RD_MAX_B:
        return rd_messages(P)
    return rabenseifner_messages(P)
