"""Per-rank gradients for an experiment point.

Rank r's gradient at iteration t is drawn from numpy's PCG64 seeded with
``(seed, t, r)``, so every backend and every process builds exactly the same
inputs without communicating them. Values are standard normal in ``dtype``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    n: int
    density: float = 0.01
    dtype: str = "float32"
    seed: int = 0

    def grad(self, rank: int, iteration: int = 0) -> np.ndarray:
        rng = np.random.default_rng([self.seed, iteration, rank])
        g = rng.standard_normal(self.n, dtype=np.float64 if self.dtype == "float64" else np.float32)
        g.setflags(write=False)  # rank programs must not modify their input
        return g

    def grads(self, P: int, iteration: int = 0) -> list[np.ndarray]:
        key = (self, P, iteration)
        hit = _CACHE.get(key)
        if hit is None:
            hit = [self.grad(r, iteration) for r in range(P)]
            _CACHE.put(key, hit, P * self.n * np.dtype(self.dtype).itemsize)
        return hit


class _LRU:
    """Keeps recently generated gradient sets (consecutive points of a sweep
    usually share them), bounded by total bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.items: dict = {}
        self.size = 0

    def get(self, key):
        val = self.items.pop(key, None)
        if val is not None:
            self.items[key] = val  # most recent last
            return val[0]
        return None

    def put(self, key, val, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            return
        while self.items and self.size + nbytes > self.max_bytes:
            oldest = next(iter(self.items))
            self.size -= self.items.pop(oldest)[1]
        self.items[key] = (val, nbytes)
        self.size += nbytes


_CACHE = _LRU(max_bytes=1 << 30)
