"""QSGD stochastic quantization (Alistarh et al., NIPS'17) as SparCML uses it
for its dense stage (Renggli et al., SC'19, section 5.4).

A dense vector is cut into buckets of ``bucket`` consecutive entries (SparCML:
"in the order of 1024"); each bucket keeps one float32 scaling factor and
stores every entry in ``bits`` bits (2, 4 or 8): a sign and a level
``l in 0..s`` with ``s = 2^(bits-1) - 1``. With ``r = |v| / scale * s``,
``l = floor(r) + [u < r - floor(r)]`` for a uniform ``u``, so the quantized
value ``sign(v) * scale * l / s`` is unbiased and within ``scale / s`` of v.

Choices (the paper does not fix them): the scale is the bucket's max |v|
(exactly reproducible across numpy and torch, unlike an l2 norm whose
summation order differs); the random numbers are the counter-based hash of
:mod:`.rng`, so the simulator and the real backend quantize identically.
Size on the wire: ``ceil(n/bucket) * 4 + ceil(n * bits / 8)`` bytes (codes
only for the n entries; the last bucket may be short).
"""
from __future__ import annotations

import math

import numpy as np

from ..compute.kernels import Work, _isz, kernel
from ..ops import Quantized
from .rng import uniform_np, uniform_torch

BITS = (2, 4, 8)


def levels(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def wire_bytes(n: int, bits: int, bucket: int) -> int:
    """Exact payload size of a quantized vector of n entries."""
    return 4 * max(1, math.ceil(n / bucket)) + math.ceil(n / (8 // bits))


def _check(bits, bucket):
    if bits not in BITS:
        raise ValueError(f"QSGD bits must be one of {BITS}, got {bits}")
    if bucket < 1:
        raise ValueError("QSGD bucket must be >= 1")


def _q_work(out, x, bits, bucket, seed):
    return Work(len(x), len(x) * _isz(x) + out.nbytes)


@kernel("qsgd_quantize", work=_q_work)
def qsgd_quantize(x, bits, bucket, seed):
    """Bucket-wise stochastic quantization of a dense vector to ``bits`` bits."""
    _check(bits, bucket)
    n, s, per = len(x), levels(bits), 8 // bits
    nb = max(1, math.ceil(n / bucket))
    xp = np.zeros(nb * bucket, dtype=np.float32)
    xp[:n] = x
    xp = xp.reshape(nb, bucket)
    scales = np.abs(xp).max(axis=1)
    safe = np.where(scales > 0, scales, np.float32(1))
    r = np.abs(xp) / safe[:, None] * np.float32(s)
    low = np.floor(r)
    u = uniform_np(seed, nb * bucket).reshape(nb, bucket)
    lvl = low + (u < (r - low))
    codes = (np.sign(xp) * lvl + s).astype(np.int32).reshape(-1)[:n]
    codes = np.concatenate([codes, np.zeros(-len(codes) % per, np.int32)]).reshape(-1, per)
    packed = np.zeros(len(codes), dtype=np.int32)
    for j in range(per):
        packed |= codes[:, j] << (bits * j)
    return Quantized(packed.astype(np.uint8), scales.astype(np.float32), n, bits, bucket)


@qsgd_quantize.torch
def _qsgd_quantize_torch(x, bits, bucket, seed):
    import torch

    _check(bits, bucket)
    n, s, per = len(x), levels(bits), 8 // bits
    nb = max(1, math.ceil(n / bucket))
    xp = torch.zeros(nb * bucket, dtype=torch.float32, device=x.device)
    xp[:n] = x
    xp = xp.reshape(nb, bucket)
    scales = xp.abs().amax(dim=1)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    r = xp.abs() / safe[:, None] * float(s)
    low = torch.floor(r)
    u = uniform_torch(seed, nb * bucket, xp).reshape(nb, bucket)
    lvl = low + (u < (r - low)).to(low.dtype)
    codes = (torch.sign(xp) * lvl + s).to(torch.int32).reshape(-1)[:n]
    codes = torch.cat([codes, codes.new_zeros(-len(codes) % per)]).reshape(-1, per)
    packed = torch.zeros(len(codes), dtype=torch.int32, device=x.device)
    for j in range(per):
        packed |= codes[:, j] << (bits * j)
    return Quantized(packed.to(torch.uint8), scales, n, bits, bucket)


def _dq_work(out, q, like):
    return Work(q.n, q.nbytes + q.n * _isz(like))


@kernel("qsgd_dequantize", work=_dq_work, memo=True)
def qsgd_dequantize(q, like):
    """Dense vector (dtype of ``like``) from a :class:`~simsparse.ops.Quantized`."""
    s, per, mask = levels(q.bits), 8 // q.bits, (1 << q.bits) - 1
    packed = q.codes.astype(np.int32)
    codes = np.stack([(packed >> (q.bits * j)) & mask for j in range(per)], axis=1).reshape(-1)
    size = len(q.scales) * q.bucket
    codes = np.concatenate([codes[:q.n], np.full(size - q.n, s, np.int32)])  # pad with level 0
    lvl = (codes - s).astype(np.float32).reshape(len(q.scales), q.bucket)
    vals = lvl / np.float32(s) * q.scales[:, None]
    return vals.reshape(-1)[:q.n].astype(like.dtype)


@qsgd_dequantize.torch
def _qsgd_dequantize_torch(q, like):
    import torch

    s, per, mask = levels(q.bits), 8 // q.bits, (1 << q.bits) - 1
    packed = q.codes.to(torch.int32)
    codes = torch.stack([(packed >> (q.bits * j)) & mask for j in range(per)], dim=1).reshape(-1)
    size = len(q.scales) * q.bucket
    codes = torch.cat([codes[:q.n], codes.new_full((size - q.n,), s)])  # pad with level 0
    lvl = (codes - s).to(torch.float32).reshape(len(q.scales), q.bucket)
    vals = lvl / float(s) * q.scales[:, None]
    return vals.reshape(-1)[:q.n].to(like.dtype)
