"""Range-based N-bit floats (Wang et al., FFT-based gradient sparsification,
HPDC'20, section 3.2.1, its Alg. 1 and Figs. 7-9).

The format (N bits, m mantissa bits, base eps): a sign bit and an (N-1)-bit
magnitude code c. "The N-bit binary format of a positive number is used as
base number eps, encoded 0...01; the other positive numbers are encoded as
0...01 + offset": code c >= 1 is the float32 whose bit pattern, with the
mantissa cut to m bits, is ``B + c - 1``, where ``B`` is eps's pattern. So
consecutive codes are consecutive numbers of a float grid with m mantissa
bits: the spacing doubles every ``2^m`` codes (many numbers near zero, few
near the range ends, like the gradients' bell shape), and the largest
magnitude, code 1...1, is ``value(B + 2^(N-1) - 2)``. Negative numbers use
the same rule with the sign bit set; code 0 (and 10...0) is zero.

Tuning (the paper's eps/offset procedure): the range ``[-R, R]`` comes from the
data (max |value|) or is set by hand. For each m the paper starts eps at a
small value (0.002), decodes 1...1 to the current most negative number and
lowers eps when that lies beyond -R, raises it otherwise, until the two
agree. On the discrete grid that loop ends at the smallest base ``B`` whose
largest number reaches R, which we find by bisection. The paper then picks
"the optimal delta" over m. How is not stated (the formula is lost from the
text); we pick the m with the least squared error on the data being tuned.

Rounding (the paper truncates or rounds, the text does not say): to the
nearest number of the grid (round half up on the bit pattern), magnitudes
below eps to 0 or eps, whichever is nearer, magnitudes above the largest
number saturate. Error per value: at most ``2^-(m+1) |x|`` inside the range,
``eps/2`` below it. All steps are integer operations on float32 bit patterns,
so numpy and torch give identical codes. Size: ``ceil(count N / 8)`` bytes.
"""
from __future__ import annotations

import math

import numpy as np

from ..compute.kernels import Work, kernel

MANTISSA = 23          # float32
_B_MAX = 0x7F7FFFFF    # the largest finite float32


def max_code(bits: int) -> int:
    """The largest magnitude code, 1...1 (N-1 ones)."""
    return (1 << (bits - 1)) - 1


def grid_value(idx, m: int) -> np.ndarray:
    """The float32 whose bit pattern is ``idx`` on the m-mantissa grid."""
    return (np.asarray(idx, dtype=np.int64) << (MANTISSA - m)).astype(np.int32).view(np.float32)


def top_value(B: int, m: int, bits: int) -> float:
    """The largest representable magnitude of the format (code 1...1)."""
    return float(grid_value(B + max_code(bits) - 1, m))


def tune_base(R: float, m: int, bits: int) -> int:
    """The smallest base pattern B whose largest number reaches R (the fixed
    point of the paper's eps loop); B of the smallest normal float if even
    that reaches R."""
    lo, hi = _base_bounds(m, bits)
    if lo > hi:
        raise ValueError(f"a {bits}-bit range-based float with {m} mantissa bits does not fit in float32")
    if R <= top_value(lo, m, bits):
        return lo
    if R > top_value(hi, m, bits):
        return hi
    while lo + 1 < hi:                                # invariant: top(lo) < R <= top(hi)
        mid = (lo + hi) // 2
        if top_value(mid, m, bits) >= R:
            hi = mid
        else:
            lo = mid
    return hi


def _base_bounds(m: int, bits: int) -> tuple[int, int]:
    """Smallest and largest base pattern B: eps a normal float32, the top finite."""
    return 1 << m, (_B_MAX >> (MANTISSA - m)) - max_code(bits) + 1


def mantissas(bits: int) -> list[int]:
    """The m worth trying: at most N-1, and the format's 2^(N-1)-1 numbers fit
    in float32's normal range (m = 0 at N = 10 would span 511 octaves)."""
    return [m for m in range(min(MANTISSA, bits - 1) + 1) if _base_bounds(m, bits)[0] <= _base_bounds(m, bits)[1]]


# -- encode / decode (numpy; torch below) ------------------------------------------------

def encode(x, bits: int, m: int, B: int) -> np.ndarray:
    """N-bit codes (int64) of float values x."""
    x = np.asarray(x, dtype=np.float32)
    shift = MANTISSA - m
    pat = np.abs(x).view(np.int32).astype(np.int64)
    idx = (pat + ((1 << shift) >> 1)) >> shift
    c = np.clip(idx - B + 1, 0, max_code(bits))
    eps = grid_value(B, m)
    c = np.where((c == 0) & (np.abs(x) >= eps / 2), 1, c)
    return np.where((c > 0) & (x < 0), c | (1 << (bits - 1)), c)


def decode(codes, bits: int, m: int, B: int) -> np.ndarray:
    """float32 values of N-bit codes."""
    codes = np.asarray(codes, dtype=np.int64)
    c = codes & max_code(bits)
    v = np.where(c > 0, grid_value(np.maximum(B + c - 1, 0), m), np.float32(0))
    return np.where(codes >> (bits - 1) > 0, -v, v).astype(np.float32)


def _encode_torch(x, bits, m, B):
    import torch

    shift = MANTISSA - m
    a = x.to(torch.float32).abs()
    idx = (a.view(torch.int32).to(torch.int64) + ((1 << shift) >> 1)) >> shift
    c = (idx - B + 1).clamp(0, max_code(bits))
    eps = float(grid_value(B, m))
    c = torch.where((c == 0) & (a >= eps / 2), torch.ones_like(c), c)
    return torch.where((c > 0) & (x < 0), c | (1 << (bits - 1)), c)


def _decode_torch(codes, bits, m, B):
    import torch

    codes = codes.to(torch.int64)
    c = codes & max_code(bits)
    pat = ((B + c - 1).clamp(min=0) << (MANTISSA - m)).to(torch.int32)
    v = torch.where(c > 0, pat.view(torch.float32), torch.zeros((), dtype=torch.float32, device=codes.device))
    return torch.where((codes >> (bits - 1)) > 0, -v, v)


# -- bit packing: N-bit codes <-> bytes (little-endian bit order) -----------------------

def pack_bits(codes, bits: int) -> np.ndarray:
    """uint8 array of ceil(len * bits / 8) bytes holding the low ``bits`` bits of each code."""
    codes = np.asarray(codes, dtype=np.int64)
    if 8 % bits == 0:  # fast path (1, 2, 4, 8 bits): whole codes per byte
        per = 8 // bits
        c = np.concatenate([codes & ((1 << bits) - 1), np.zeros(-len(codes) % per, np.int64)]).reshape(-1, per)
        return (c << (bits * np.arange(per))).sum(axis=1).astype(np.uint8)
    b = ((codes[:, None] >> np.arange(bits)) & 1).astype(np.uint8)
    return np.packbits(b.reshape(-1), bitorder="little")


def unpack_bits(packed, count: int, bits: int) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 1:
        return np.unpackbits(packed, count=count, bitorder="little").astype(np.int64)
    if 8 % bits == 0:
        per = 8 // bits
        c = (packed.astype(np.int64)[:, None] >> (bits * np.arange(per))) & ((1 << bits) - 1)
        return c.reshape(-1)[:count]
    b = np.unpackbits(packed, count=count * bits, bitorder="little")
    return (b.reshape(count, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)


def pack_bits_torch(codes, bits):
    import torch

    dev = codes.device
    b = ((codes.to(torch.int64)[:, None] >> torch.arange(bits, device=dev)) & 1).reshape(-1)
    b = torch.cat([b, b.new_zeros(-len(b) % 8)]).reshape(-1, 8)
    return (b << torch.arange(8, device=dev)).sum(dim=1).to(torch.uint8)


def unpack_bits_torch(packed, count, bits):
    import torch

    dev = packed.device
    b = ((packed.to(torch.int64)[:, None] >> torch.arange(8, device=dev)) & 1).reshape(-1)[:count * bits]
    return (b.reshape(count, bits) << torch.arange(bits, device=dev)).sum(dim=1)


def packed_bytes(count: int, bits: int) -> int:
    return math.ceil(count * bits / 8)


# -- kernels --------------------------------------------------------------------------------

def _as_real_np(v):
    v = np.asarray(v)
    return v.view(v.real.dtype).reshape(-1) if np.iscomplexobj(v) else v.reshape(-1)


def _as_real_torch(v):
    import torch

    return torch.view_as_real(v).reshape(-1) if v.is_complex() else v.reshape(-1)


def _tune_work(out, values, bits, bound=None):
    cnt = len(values) * (2 if "complex" in str(values.dtype) else 1)
    return Work(cnt * len(mantissas(bits)), 8 * cnt * len(mantissas(bits)))


def _choose(R: float, sq_error, bits: int) -> tuple[int, int]:
    """(m, B) with the least error; a relative margin keeps numpy and torch
    (whose sums round differently) on the same choice when errors tie."""
    best = None
    for m in mantissas(bits):
        B = tune_base(R, m, bits)
        err = sq_error(m, B)
        if best is None or err < best[0] * (1 - 1e-9):
            best = (err, m, B)
    return best[1], best[2]


@kernel("rq_tune", work=_tune_work)
def rq_tune(values, bits, bound=None):
    """The format (m, B) for ``values`` (real, or complex: both parts): range
    R = ``bound`` or max |value|, eps tuned per m, m with the least squared error."""
    v = _as_real_np(values).astype(np.float32)
    R = float(bound) if bound is not None else float(np.abs(v).max(initial=0.0))
    v64 = v.astype(np.float64)
    return _choose(R, lambda m, B: float(np.sum((decode(encode(v, bits, m, B), bits, m, B) - v64) ** 2)), bits)


@rq_tune.torch
def _rq_tune_torch(values, bits, bound=None):
    import torch

    v = _as_real_torch(values).to(torch.float32)
    R = float(bound) if bound is not None else (float(v.abs().max()) if len(v) else 0.0)
    v64 = v.to(torch.float64)

    def sq(m, B):
        return float(((_decode_torch(_encode_torch(v, bits, m, B), bits, m, B).to(torch.float64) - v64) ** 2).sum())

    return _choose(R, sq, bits)
