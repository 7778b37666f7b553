"""Algorithm base class and registry.

An algorithm is a class registered by name. The backend makes one instance
per rank (so instances keep per-rank state across iterations: thresholds,
boundaries, residuals) and calls ``run(ctx, grad)`` once per iteration; that
method is a generator of requests (see :mod:`simsparse.ops`) whose return
value is the rank's result.

``reference(grads)`` gives what every rank's result should equal, computed
with plain numpy from all ranks' inputs; backends use it for the
``correct`` column.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

ALGORITHMS: dict[str, type["Algorithm"]] = {}


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Setup:
    """What an algorithm instance knows about its run."""

    rank: int
    P: int
    n: int
    density: float
    dtype: str = "float32"

    @property
    def k(self) -> int:
        """Elements selected per worker: round(density * n), at least 1."""
        return max(1, min(self.n, int(round(self.density * self.n))))


class Algorithm:
    """Base class. Subclasses set ``Params`` (a pydantic model, extra keys
    forbidden) and implement ``run`` and ``reference``."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = NoParams
    #: "dense" (result equals the exact sum) or "sparse" (a sparsified sum)
    family: ClassVar[str] = "dense"

    def __init__(self, setup: Setup, params: BaseModel | None = None):
        self.setup = setup
        self.params = params if params is not None else self.Params()

    @property
    def P(self) -> int:
        return self.setup.P

    @property
    def k(self) -> int:
        return self.setup.k

    def run(self, ctx, grad):  # pragma: no cover - interface
        """Generator: yields requests, returns the rank's result."""
        raise NotImplementedError

    @classmethod
    def reference(cls, grads: list[np.ndarray], setup: Setup, params: BaseModel) -> np.ndarray:
        """The dense vector every rank's result should equal."""
        raise NotImplementedError

    @classmethod
    def check_setup(cls, P: int, n: int, params: BaseModel) -> str | None:
        """Why this algorithm cannot run with these settings, or None."""
        return None

    @classmethod
    def tolerance(cls, setup: Setup) -> float:
        """Relative tolerance of the check (reduction order differs)."""
        eps = float(np.finfo(np.dtype(setup.dtype)).eps)
        return 16 * eps * max(1, setup.P)


def register(name: str):
    def deco(cls):
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} registered twice")
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco


def get_algorithm(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None


def pof2_floor(P: int) -> int:
    """Largest power of two <= P."""
    return 1 << (P.bit_length() - 1)


def log2_int(P: int) -> int:
    return int(math.log2(P))
