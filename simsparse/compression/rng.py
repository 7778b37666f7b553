"""Counter-based uniform random numbers, bit-identical in numpy and torch.

Stochastic rounding (QSGD, TernGrad) must give the same result in the
simulator and in the real backend, so random numbers cannot come from two
different library generators. Instead ``u[i] = fmix32(i * golden + seed)``
(MurmurHash3's finaliser) computed with int64 arithmetic and 32-bit masks,
which numpy and torch evaluate identically on CPU and GPU.
"""
from __future__ import annotations

import numpy as np

_M32 = 0xFFFFFFFF


def _fmix(h, xp_and):
    h = xp_and(h ^ (h >> 16), _M32)
    h = xp_and(h * 0x85EBCA6B, _M32)
    h = xp_and(h ^ (h >> 13), _M32)
    h = xp_and(h * 0xC2B2AE35, _M32)
    return h ^ (h >> 16)


def seed_of(*parts: int) -> int:
    """Combine integers (rank, iteration, stage, ...) into a 32-bit seed."""
    h = 0x2545F491
    for p in parts:
        h = (h * 0x9E3779B1 + (int(p) & _M32) + 0x7F4A7C15) & _M32
        h ^= h >> 15
    return h


def uniform_np(seed: int, n: int, dtype=np.float32) -> np.ndarray:
    i = np.arange(n, dtype=np.int64)
    h = _fmix((i * 0x9E3779B1 + int(seed)) & _M32, np.bitwise_and)
    return ((h >> 8).astype(np.float64) / float(1 << 24)).astype(dtype)


def uniform_torch(seed: int, n: int, like):
    import torch

    i = torch.arange(n, dtype=torch.int64, device=like.device)
    h = _fmix((i * 0x9E3779B1 + int(seed)) & _M32, torch.bitwise_and)
    return ((h >> 8).to(torch.float64) / float(1 << 24)).to(like.dtype)
