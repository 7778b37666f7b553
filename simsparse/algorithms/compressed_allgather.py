"""Compressed allgather exchanges: FFT sparsification and its quantizer baselines.

The exchange of the FFT paper (Wang et al., HPDC'20, section 4: "we used the
allgather collective ... to exchange compressed gradients ... for all
algorithms"): every rank compresses its input, the compressed payloads are
allgathered, and every rank decompresses all P of them (its own included)
and sums, so every rank holds the same result.

* ``fft_allgather``: FFT top-(1-theta) frequencies + range-based N-bit floats
  + bitmap packing (:mod:`simsparse.compression.fft`, sections 3.1-3.2);
* ``qsgd_allgather``: QSGD (:mod:`simsparse.compression.qsgd`);
* ``terngrad_allgather``: TernGrad (:mod:`simsparse.compression.terngrad`).

Cost, recursive doubling (P a power of two) with a payload of m bytes:
``log2(P) alpha + (P-1) m beta``; ring: ``(P-1)(alpha + m beta)``, where
m = ``ceil((n/2+1)/8) + ceil(2 K N/8) + 8`` (FFT, K = round((1-theta)(n/2+1))),
``ceil(n/bucket) 4 + ceil(n bits/8)`` (QSGD) or ``ceil(n/4) + 4 L`` (TernGrad,
L scales). Compute: one compression and P decompressions per rank.

Results: FFT is deterministic; the reference recomputes every rank's
compress-decompress round trip directly in numpy from its input and the
quantizer format it used (``check_state``) and sums. QSGD and TernGrad round
stochastically with the counter-hash of ``compression/rng.py`` seeded by
(rank, iteration, stage), so the reference replays the same draws: results
match to float error, and the tests check separately that they stay within
the rounding bound of the exact sum and are unbiased.

Error feedback: no input indices are "sent", so the residual is the input
minus what the others reconstruct from this rank (its own round trip).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ..compression import fft, terngrad
from ..compression.qsgd import qsgd_dequantize, qsgd_quantize
from ..compression.rng import seed_of
from ..compute.kernels import kernel, streaming
from .base import Algorithm, SparseParams, allgather_messages, register
from .collectives import Allgather

_STAGE = {"qsgd_allgather": 11, "terngrad_allgather": 12}


@kernel("ef_subtract", work=streaming(2, 1))
def ef_subtract(x, decoded):
    """x - decoded: the error-feedback residual of a lossy compressor."""
    return x - decoded


class _CompressedAllgather(Algorithm):
    """Compress, allgather, decompress all and sum; subclasses define the codec."""

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """One allgather of the compressed payloads: ``pof2 log2(pof2) + 2 (P - pof2)``
        (rd), ``P(P-1)`` (ring); exact (FFT's re-tuning sends nothing)."""
        return float(allgather_messages(P, params.allgather))

    def run(self, ctx, x):
        with ctx.phase("compress"):
            self.own = yield from self.compress(ctx, x)
        with ctx.phase("allgather"):
            blocks = yield Allgather(self.own, self.params.allgather)
        with ctx.phase("decompress"):
            return (yield from self.decompress(ctx, blocks, x))

    def residual_after(self, ctx, x, own: bool = False):
        mine = yield from self.decompress(ctx, [self.own], x)
        return (yield ctx.compute("ef_subtract", x, mine))

    def compress(self, ctx, x):  # pragma: no cover - interface
        raise NotImplementedError

    def decompress(self, ctx, payloads, like):  # pragma: no cover - interface
        raise NotImplementedError


# -- FFT ----------------------------------------------------------------------------------

class FFTParams(SparseParams):
    theta: float = Field(0.85, ge=0, lt=1, description="fraction of the frequencies dropped (the paper's theta; "
                                                       "0.85 in its experiments keeps 15%)")
    bits: int = Field(10, ge=2, le=16, description="N of the range-based N-bit floats (10 in the paper's experiments)")
    fp16: bool = Field(True, description="round the gradient to float16 before the FFT, as the paper does "
                                         "(|g| must stay below 65504)")
    range_bound: float | None = Field(None, gt=0, description="representable range [-R, R] set by hand; "
                                                              "unset: R = max |kept value| when tuning")
    retune_every: int = Field(0, ge=0, description="re-estimate the range and re-tune (m, eps) every this many "
                                                   "iterations; 0: only at the first, as the paper")
    allgather: Literal["rd", "ring"] = "rd"


@register("fft_allgather")
class FFTAllgather(_CompressedAllgather):
    """FFT-based gradient sparsification with range-based N-bit floats
    (Wang et al., HPDC'20, sections 3.1-3.2 and 4), exchanged by allgather.

    Each rank keeps the top ``1 - theta`` of its gradient's frequencies,
    quantizes them with a format it tuned on its own data (at the first
    iteration, as the paper estimates the range "from the first few
    iterations"; ``retune_every`` re-tunes), packs them behind a bitmap, and
    allgathers; receivers sum the P dequantized spectra and run one inverse
    FFT. No public code exists; the choices the text leaves
    open are listed in :mod:`simsparse.compression.fft` and
    :mod:`simsparse.compression.rangequant`.
    Cost: ``log2(P) alpha + (P-1) m beta`` (rd) with
    ``m = ceil((n/2+1)/8) + ceil(2 K N / 8) + 8`` bytes."""

    Params = FFTParams

    def __init__(self, setup, params=None):
        super().__init__(setup, params)
        self.fmt = None  # (m, B) of the range quantizer, tuned on this rank's data

    @classmethod
    def periodic_work(cls, params):
        """The re-tuning every ``retune_every`` iterations (the first tuning is set-up)."""
        return {"retune": params.retune_every} if params.retune_every else {}

    def compress(self, ctx, x):
        p, n = self.params, self.setup.n
        spec = yield ctx.compute("fft_sparsify", x, fft.keep_count(n, p.theta), fp16=p.fp16)
        if self.fmt is None or (p.retune_every and self.due("retune")):
            self.fmt = yield ctx.compute("rq_tune", spec.values, p.bits, p.range_bound)
        return (yield ctx.compute("fft_pack", spec, n, p.bits, *self.fmt))

    def decompress(self, ctx, payloads, like):
        return (yield ctx.compute("fft_unpack_sum", payloads, self.setup.n, like=like))

    def check_state(self):
        return {"fmt": tuple(self.fmt)}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        return sum(fft.roundtrip(x, params.theta, params.bits, *st["fmt"], fp16=params.fp16)
                   for x, st in zip(inputs, states))


# -- QSGD -----------------------------------------------------------------------------------

class QSGDParams(SparseParams):
    bits: Literal[2, 4, 8] = Field(4, description="bits per entry (SparCML's CIFAR-10 runs: 4)")
    bucket: int = Field(512, ge=1, description="entries per scaling factor (SparCML: 512 in its runs, "
                                               "'in the order of 1024')")
    allgather: Literal["rd", "ring"] = "rd"


@register("qsgd_allgather")
class QSGDAllgather(_CompressedAllgather):
    """QSGD (Alistarh et al., NIPS'17) with the FFT paper's allgather exchange
    (Wang et al., HPDC'20, section 4.2 baseline). Bucket-wise max-scaled
    stochastic rounding to ``2^(bits-1) - 1`` levels; see
    :mod:`simsparse.compression.qsgd`. The FFT paper used 8 bins (3 bits);
    our packing offers 2, 4 or 8 bits.
    Cost: ``log2(P) alpha + (P-1) m beta`` (rd) with
    ``m = 4 ceil(n/bucket) + ceil(n bits / 8)`` bytes."""

    Params = QSGDParams
    used_seed = None

    def seed(self) -> int:
        """The rounding seed of this iteration (kept for check_state)."""
        self.used_seed = seed_of(self.setup.rank, self.iteration_no, _STAGE[self.name])
        return self.used_seed

    def compress(self, ctx, x):
        p = self.params
        return (yield ctx.compute("qsgd_quantize", x, p.bits, p.bucket, self.seed()))

    def decompress(self, ctx, payloads, like):
        parts = []
        for q in payloads:
            parts.append((yield ctx.compute("qsgd_dequantize", q, like)))
        return (yield from _sum(ctx, parts))

    def check_state(self):
        return {"seed": self.used_seed}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        return sum(qsgd_dequantize.numpy(qsgd_quantize.numpy(x, params.bits, params.bucket, st["seed"]), x)
                   .astype(np.float64) for x, st in zip(inputs, states))


# -- TernGrad -------------------------------------------------------------------------------

class TernGradParams(SparseParams):
    layerwise: bool = Field(True, description="one scale per layer (Wen et al.'s layer-wise ternarizing); "
                                              "false: one for the whole vector")
    clip: float | None = Field(None, gt=0, description="clip |g| to clip * sigma first (Wen et al.: 2.5); "
                                                       "unset: no clipping, as the FFT paper's baseline")
    allgather: Literal["rd", "ring"] = "rd"


@register("terngrad_allgather")
class TernGradAllgather(QSGDAllgather):
    """TernGrad (Wen et al., NIPS'17) with the FFT paper's allgather exchange
    (Wang et al., HPDC'20, section 4.2: TernGrad-noclip, 2 bits per entry):
    per layer (or vector) scale max |g|, stochastic ternarization; see
    :mod:`simsparse.compression.terngrad`.
    Cost: ``log2(P) alpha + (P-1) m beta`` (rd) with ``m = ceil(n/4) + 4 L``
    bytes (L scales)."""

    Params = TernGradParams

    def segments(self) -> tuple:
        return self.setup.layer_sizes if self.params.layerwise else (self.setup.n,)

    def compress(self, ctx, x):
        return (yield ctx.compute("terngrad_quantize", x, self.segments(), self.seed(), self.params.clip))

    def decompress(self, ctx, payloads, like):
        parts = []
        for t in payloads:
            parts.append((yield ctx.compute("terngrad_dequantize", t, self.segments(), like)))
        return (yield from _sum(ctx, parts))

    @classmethod
    def reference(cls, inputs, setup, params, states):
        segs = setup.layer_sizes if params.layerwise else (setup.n,)
        q, dq = terngrad.terngrad_quantize.numpy, terngrad.terngrad_dequantize.numpy
        return sum(dq(q(x, segs, st["seed"], params.clip), segs, x).astype(np.float64) for x, st in zip(inputs, states))


def _sum(ctx, parts):
    """Sum dense blocks in rank order (one add kernel per block)."""
    acc = parts[0]
    for part in parts[1:]:
        acc = yield ctx.compute("add", acc, part)
    return acc
