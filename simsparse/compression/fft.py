"""FFT-based gradient sparsification (Wang et al., HPDC'20, sections 3.1-3.3).

Compression of a gradient of n values (section 3.1, Fig. 3):

1. the flattened gradient, rounded to float16 first (``fp16``, as the paper
   does to double cuFFT throughput), goes through a real FFT;
2. of its ``F = fft_len(n)//2 + 1`` frequencies, the top ``K = max(1, round((1-theta) F))``
   by magnitude are kept and the rest set to zero (``theta`` is the paper's
   drop ratio: 0.85 keeps 15 %);
3. the real and imaginary parts of the K kept frequencies are quantized to
   range-based N-bit floats (:mod:`.rangequant`);
4. packing (section 3.2): a bitmap of the kept frequencies (the paper's
   status vector) and, by a prefix sum over it, the dense array of kept
   values.

Payload: ``ceil(F/8)`` bitmap bytes + ``ceil(2 K N / 8)`` code bytes + 8 bytes
of format (m and the base pattern of eps). The receiver reverses the steps:
unpack (the prefix sum of the bitmap gives each kept frequency's slot),
dequantize, inverse FFT.

Choices where the paper is vague: we transform with numpy's / torch's real
FFT (the other half of the spectrum is the conjugate mirror, so the bitmap
has F = L/2+1 bits, not n) of length ``L = fft_len(n)``, the next 5-smooth
length >= n (the gradient zero-padded, the inverse truncated back to n): a
length with a large prime factor -- ResNet-110's 1,727,962 = 2 x 863,981 --
sends pocketFFT (and cuFFT) to a Bluestein path about 20x slower, and the
padding adds at most a few percent of frequencies; orthonormal scaling (Parseval: the spectrum has
the gradient's scale), in float64 so that numpy and torch select the same
frequencies; a frequency is one complex coefficient, ranked by its modulus.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compute.kernels import Work, _isz, kernel
from ..ops import COO, Payload
from . import rangequant as rq


@dataclass(frozen=True, slots=True)
class BitmapPacked(Payload):
    """FFT-sparsified, range-quantized gradient: ``bitmap`` (uint8, bit f set
    when frequency f is kept, F = n_freq(n) bits), ``codes`` (uint8, the real and
    imaginary parts of the ``count`` kept frequencies in ascending f, ``bits``
    bits each), ``fmt`` (int32 [m, B]: the sender's quantizer format)."""

    bitmap: Any
    codes: Any
    fmt: Any
    n: int
    count: int
    bits: int
    ARRAYS = ("bitmap", "codes", "fmt")


def fft_len(n: int) -> int:
    """The transform length: the next 5-smooth (fast) length >= n."""
    from scipy.fft import next_fast_len

    return next_fast_len(max(int(n), 1), real=True)


def n_freq(n: int) -> int:
    """Frequencies of the real FFT of a length-n gradient."""
    return fft_len(n) // 2 + 1


def keep_count(n: int, theta: float) -> int:
    """K: frequencies kept of the n_freq(n) of a length-n gradient."""
    F = n_freq(n)
    return max(1, min(F, int(round((1.0 - theta) * F))))


def wire_bytes(n: int, theta: float, bits: int) -> int:
    """Exact size of one :class:`BitmapPacked` payload."""
    return math.ceil(n_freq(n) / 8) + rq.packed_bytes(2 * keep_count(n, theta), bits) + 8


# -- kernels -----------------------------------------------------------------------------

def _check_half(amax: float) -> None:
    """The paper's float16 conversion before the FFT assumes bounded gradients."""
    if not amax <= 65504:  # also catches NaN
        raise ValueError(f"fft_allgather: max |gradient| = {amax:g} does not fit float16 (65504); set fp16: false")


def _sparsify_work(out, x, keep, fp16=True):
    n = len(x)
    return Work(n, n * _isz(x) + 16 * n_freq(n) + out.nbytes)


@kernel("fft_sparsify", work=_sparsify_work)
def fft_sparsify(x, keep, fp16=True):
    """The ``keep`` largest-magnitude frequencies of rfft(x) (orthonormal), as a
    COO over the n_freq(n) frequencies with complex128 values."""
    if fp16:
        _check_half(float(np.abs(x).max(initial=0)))
    xs = x.astype(np.float16) if fp16 else x
    X = np.fft.rfft(xs.astype(np.float64), n=fft_len(len(x)), norm="ortho")
    F = len(X)
    idx = np.arange(F) if keep >= F else np.sort(np.argpartition(-np.abs(X), keep - 1)[:keep])
    return COO(idx.astype(np.int32), X[idx], F)


@fft_sparsify.torch
def _fft_sparsify_torch(x, keep, fp16=True):
    import torch

    if fp16:
        _check_half(float(x.abs().max()) if len(x) else 0.0)
    xs = x.to(torch.float16) if fp16 else x
    X = torch.fft.rfft(xs.to(torch.float64), n=fft_len(len(x)), norm="ortho")
    F = len(X)
    if keep >= F:
        idx = torch.arange(F, device=x.device)
    else:
        idx, _ = torch.sort(torch.topk(X.abs(), keep, sorted=False).indices)
    return COO(idx.to(torch.int32), X[idx], F)


def _pack_work(out, spec, n, bits, m, B):
    return Work(spec.n, spec.n // 8 + 16 * spec.nnz + out.nbytes)


@kernel("fft_pack", work=_pack_work)
def fft_pack(spec, n, bits, m, B):
    """Bitmap + range-quantized values of the kept frequencies of a length-n
    gradient (a :class:`BitmapPacked`)."""
    mask = np.zeros(spec.n, dtype=np.int64)
    mask[spec.indices] = 1
    codes = rq.encode(spec.values.view(np.float64), bits, m, B)  # re, im interleaved
    fmt = np.array([m, B], dtype=np.int32)
    return BitmapPacked(rq.pack_bits(mask, 1), rq.pack_bits(codes, bits), fmt, n, spec.nnz, bits)


@fft_pack.torch
def _fft_pack_torch(spec, n, bits, m, B):
    import torch

    mask = torch.zeros(spec.n, dtype=torch.int64, device=spec.values.device)
    mask[spec.indices.long()] = 1
    codes = rq._encode_torch(torch.view_as_real(spec.values).reshape(-1), bits, m, B)
    fmt = torch.tensor([m, B], dtype=torch.int32, device=mask.device)
    return BitmapPacked(rq.pack_bits_torch(mask, 1), rq.pack_bits_torch(codes, bits), fmt, n, spec.nnz, bits)


def _unpack_work(out, payloads, n, like):
    F = n_freq(n)
    nnz = sum(p.count for p in payloads)
    return Work(len(payloads) * F + n, sum(p.nbytes for p in payloads) + 16 * (nnz + F) + n * _isz(like),
                parts=len(payloads))


@kernel("fft_unpack_sum", work=_unpack_work, memo=True)
def fft_unpack_sum(payloads, n, like):
    """Sum of decompressed :class:`BitmapPacked` gradients of length n: each is
    unpacked (the bitmap's prefix sum places the values) and dequantized into
    one spectrum, then a single inverse FFT (linear, so equal to the sum of the
    inverses)."""
    F = n_freq(n)
    spec = np.zeros(F, dtype=np.complex128)
    for p in payloads:
        m, B = (int(v) for v in p.fmt)
        mask = rq.unpack_bits(p.bitmap, F, 1)
        slot = np.cumsum(mask) - 1                      # prefix sum: where frequency f's value sits
        vals = rq.decode(rq.unpack_bits(p.codes, 2 * p.count, p.bits), p.bits, m, B).astype(np.float64)
        kept = mask == 1
        spec[kept] += vals.view(np.complex128)[slot[kept]]
    return np.fft.irfft(spec, n=fft_len(n), norm="ortho")[:n].astype(like.dtype)


@fft_unpack_sum.torch
def _fft_unpack_sum_torch(payloads, n, like):
    import torch

    F = n_freq(n)
    spec = torch.zeros(F, dtype=torch.complex128, device=like.device)
    for p in payloads:
        m, B = (int(v) for v in p.fmt)
        mask = rq.unpack_bits_torch(p.bitmap, F, 1)
        slot = torch.cumsum(mask, 0) - 1
        vals = rq._decode_torch(rq.unpack_bits_torch(p.codes, 2 * p.count, p.bits), p.bits, m, B).to(torch.float64)
        kept = mask == 1
        spec[kept] += torch.view_as_complex(vals.reshape(-1, 2))[slot[kept]]
    return torch.fft.irfft(spec, n=fft_len(n), norm="ortho")[:n].to(like.dtype)


# -- numpy reference -------------------------------------------------------------------------

def roundtrip(x: np.ndarray, theta: float, bits: int, m: int, B: int, fp16: bool = True) -> np.ndarray:
    """What a receiver reconstructs from one rank's x (float64), computed
    directly: FFT, keep the top K, quantize both parts, inverse FFT."""
    xs = np.asarray(x).astype(np.float16) if fp16 else np.asarray(x)
    X = np.fft.rfft(xs.astype(np.float64), n=fft_len(len(x)), norm="ortho")
    order = np.argsort(-np.abs(X), kind="stable")
    keep = order[:keep_count(len(x), theta)]
    Y = np.zeros_like(X)
    parts = np.stack([X[keep].real, X[keep].imag], axis=1).reshape(-1)
    q = rq.decode(rq.encode(parts, bits, m, B), bits, m, B).astype(np.float64).reshape(-1, 2)
    Y[keep] = q[:, 0] + 1j * q[:, 1]
    return np.fft.irfft(Y, n=fft_len(len(x)), norm="ortho")[:len(x)]


# -- when compression pays (section 3.3) ---------------------------------------------------

@dataclass(frozen=True)
class Throughputs:
    """Section 3.3's Table 1, bytes per second: ``conv`` precision conversion
    (float-to-half and range quantization), ``fft``, ``pack`` (packing),
    ``topk`` (top-k selection) and ``net`` (the network)."""

    conv: float
    fft: float
    pack: float
    topk: float
    net: float

    def compress_s_per_byte(self) -> float:
        """Eq. (1) per byte: compression (conversion, FFT, top-k, packing) and
        decompression (unpacking, conversion, inverse FFT). The equation's
        symbols are lost from the text; each primitive counts once per
        direction, top-k only when compressing."""
        return 2 / self.conv + 2 / self.fft + 2 / self.pack + 1 / self.topk


def compression_saving_s(M: float, ratio: float, t: Throughputs) -> float:
    """Eq. (2)-(4): communication time saved minus the compression cost for a
    message of M bytes compressed ``ratio`` times (> 0: compression pays)."""
    saved = M / t.net - M / (ratio * t.net)
    return saved - M * t.compress_s_per_byte()


def min_compression_ratio(t: Throughputs) -> float:
    """The smallest overall compression ratio that pays on this network
    (Eq. 4 solved for the ratio; Fig. 10): ``1 / (1 - net * cost per byte)``,
    infinite when the compression costs more than sending uncompressed."""
    x = t.net * t.compress_s_per_byte()
    return math.inf if x >= 1 else 1.0 / (1.0 - x)
