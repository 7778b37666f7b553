"""TernGrad (Wen et al., NIPS'17), the FFT paper's quantization baseline
(Wang et al., HPDC'20, section 4.2: "TernGrad-noclip", 2 bits per entry).

Per segment (a layer with ``layerwise``: Wen et al.'s layer-wise
ternarizing; else the whole vector) the scale is ``s = max |g|`` and every
entry becomes ``s * sign(g) * b`` with ``b ~ Bernoulli(|g| / s)``, so the
result is unbiased and each entry is within ``s`` of g. Optional gradient
clipping (Wen et al. section 3.3) first limits |g| to ``clip * sigma`` (sigma:
the segment's standard deviation; they use 2.5); the FFT paper's baseline
does not clip, which is the default. The Bernoulli draws come from the
counter-hash of :mod:`.rng`, so numpy and torch give identical results.

Not modelled: Wen et al.'s scaler sharing (all workers use the maximum
scale, an extra allreduce of one float per layer), which only matters for a
parameter server or an allreduce of integer sums, not for an allgather.

Size on the wire: ``ceil(n / 4)`` bytes of 2-bit codes + 4 bytes per segment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compute.kernels import Work, _isz, kernel
from ..ops import Payload
from . import rangequant as rq
from .rng import uniform_np, uniform_torch


@dataclass(frozen=True, slots=True)
class Ternary(Payload):
    """Ternarized vector: ``codes`` (uint8, 2 bits per entry: 0 = -s, 1 = 0,
    2 = +s) and one float32 scale per segment; ``n`` entries."""

    codes: Any
    scales: Any
    n: int
    ARRAYS = ("codes", "scales")


def wire_bytes(n: int, segments: int) -> int:
    return rq.packed_bytes(n, 2) + 4 * segments


def _starts(sizes) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def _clip_np(x, sizes, clip):
    if clip is None:
        return x.astype(np.float32)
    sig = np.array([np.std(s, dtype=np.float64) for s in np.split(x, np.cumsum(sizes)[:-1])])
    bound = np.repeat(clip * sig, sizes).astype(np.float32)
    return np.clip(x.astype(np.float32), -bound, bound)


def _q_work(out, x, sizes, seed, clip=None):
    return Work(len(x), len(x) * _isz(x) + out.nbytes)


@kernel("terngrad_quantize", work=_q_work)
def terngrad_quantize(x, sizes, seed, clip=None):
    """Stochastic ternarization of x, one scale per segment of ``sizes``."""
    g = _clip_np(x, sizes, clip)
    a = np.abs(g)
    scales = np.maximum.reduceat(a, _starts(sizes)) if len(a) else np.zeros(0, np.float32)
    s = np.repeat(np.where(scales > 0, scales, np.float32(1)), sizes)
    b = uniform_np(seed, len(g)) < a / s
    codes = 1 + np.sign(g).astype(np.int64) * b
    return Ternary(rq.pack_bits(codes, 2), scales.astype(np.float32), len(x))


@terngrad_quantize.torch
def _terngrad_quantize_torch(x, sizes, seed, clip=None):
    import torch

    g = x.to(torch.float32)
    sz = torch.tensor(sizes, device=x.device)
    if clip is not None:
        sig = torch.stack([s.to(torch.float64).std(unbiased=False) for s in torch.split(x, list(sizes))])
        bound = torch.repeat_interleave((clip * sig).to(torch.float32), sz)
        g = torch.maximum(torch.minimum(g, bound), -bound)
    a = g.abs()
    seg = torch.repeat_interleave(torch.arange(len(sizes), device=x.device), sz)
    scales = torch.zeros(len(sizes), dtype=torch.float32, device=x.device).scatter_reduce(0, seg, a, "amax",
                                                                                          include_self=False)
    s = torch.where(scales > 0, scales, torch.ones_like(scales))[seg]
    b = (uniform_torch(seed, len(g), g) < a / s).to(torch.int64)
    codes = 1 + torch.sign(g).to(torch.int64) * b
    return Ternary(rq.pack_bits_torch(codes, 2), scales, len(x))


def _dq_work(out, t, sizes, like):
    return Work(t.n, t.nbytes + t.n * _isz(like))


@kernel("terngrad_dequantize", work=_dq_work, memo=True)
def terngrad_dequantize(t, sizes, like):
    """Dense vector (dtype of ``like``) from a :class:`Ternary`."""
    codes = rq.unpack_bits(t.codes, t.n, 2)
    return ((codes - 1).astype(np.float32) * np.repeat(t.scales, sizes)).astype(like.dtype)


@terngrad_dequantize.torch
def _terngrad_dequantize_torch(t, sizes, like):
    import torch

    codes = rq.unpack_bits_torch(t.codes, t.n, 2)
    s = torch.repeat_interleave(t.scales, torch.tensor(sizes, device=t.scales.device))
    return ((codes - 1).to(torch.float32) * s).to(like.dtype)
