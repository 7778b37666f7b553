"""Ok-Topk's top-k selection by threshold (Li & Hoefler, PPoPP'22, section 3.1.3).

Ok-Topk selects the local and the global top-k values by comparing with a
threshold instead of sorting: the exact threshold (the k-th largest
magnitude) is computed every ``tau`` iterations and reused in between, because
the gradient's statistics change slowly. The public code (Shigangli/Ok-Topk
at 9763dcc, ``VGG/allreducer.py`` and ``compression.py``) also nudges a reused
threshold when the number of values it selects drifts; :class:`ThresholdTuning`
holds those factors and triggers.

The exact *global* threshold is the k-th largest magnitude of the reduced sum,
which is spread over the P regions. The public code allgathers every nonzero of
every region (``gather``, up to 2k(P-1) words). :func:`radix_select` finds the
same value with latency-only messages: a most-significant-digit radix select
on the bit pattern of |v| (for non-negative IEEE floats the bit pattern orders
like the value), one allreduce of a ``2^bits``-bin histogram per digit.
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..compute.kernels import Work, _isz, kernel
from .collectives import AllreduceHost

#: magnitude bits of the IEEE formats (the sign bit of |v| is always 0)
MAGNITUDE_BITS = {"float32": 31, "float64": 63}
_INT_VIEW = {"float32": np.int32, "float64": np.int64}


class ThresholdTuning(BaseModel):
    """How a reused threshold is adapted (public Ok-Topk code; the defaults are
    its VGG-16 values; LSTM and BERT use others)."""

    model_config = ConfigDict(extra="forbid")
    local_raise: float = Field(1.03, gt=1, description="add2residual: multiply a reused local threshold by this ...")
    local_raise_above: float = Field(4 / 3, gt=0, description="... while it selects more than this many times k ...")
    local_raise_max: int = Field(5, ge=0, description="... at most this many times per iteration (0 disables)")
    local_scale: float = Field(1.012, ge=1, description="after selecting, divide the local threshold kept for the next "
                                                         "iteration by this if too few were selected, multiply if too many "
                                                         "(BERT: 1.025)")
    local_low: float = Field(2 / 3, gt=0, description="'too few' local values: fewer than this times k (LSTM 3/4, BERT 4/5)")
    local_high: float = Field(5 / 4, gt=0, description="'too many' local values: more than this times k")
    global_scale_low: float = Field(1.008, ge=1, description="divide a reused global threshold by this when too few global "
                                                             "values were selected (LSTM 1.01, BERT 1.036)")
    global_scale_high: float = Field(1.008, ge=1, description="multiply it by this when too many (BERT 1.025)")
    global_low: float = Field(2 / 3, gt=0, description="'too few' global values: fewer than this times k")
    global_high: float = Field(4 / 3, gt=0, description="'too many' global values: more than this times k (LSTM/BERT 5/4)")

    @model_validator(mode="after")
    def _ordered(self):
        for a, b in (("local_low", "local_high"), ("global_low", "global_high")):
            if getattr(self, a) >= getattr(self, b):
                raise ValueError(f"{a} = {getattr(self, a)} must be smaller than {b} = {getattr(self, b)}")
        return self


def as_dtype(thr: float, dtype: str) -> float:
    """``thr`` rounded to the gradient dtype, so that numpy, torch and the
    reference all compare |x| >= thr on exactly the same number."""
    return float(np.asarray(thr, dtype=dtype))


def rescale(thr: float, count: int, k: int, low: float, high: float, scale_low: float, scale_high: float) -> float:
    """The public code's drift correction: lower the threshold when fewer than
    ``low * k`` values were selected, raise it when more than ``high * k``."""
    if count < low * k:
        return thr / scale_low
    if count > high * k:
        return thr * scale_high
    return thr


# -- exact global threshold by radix select -------------------------------------

def _hist_work(out, v, prefix, lo, hi):
    return Work(len(v), len(v) * _isz(v) + 4 * len(out))


@kernel("abs_bits_histogram", work=_hist_work)
def abs_bits_histogram(v, prefix, lo, hi):
    """Histogram of bits [lo, hi) of the bit pattern u of |v| over the entries
    whose bits above ``hi`` equal those of ``prefix`` (one digit of a radix
    select); int32 counts, host numpy."""
    u = np.abs(v).view(np.int32 if v.dtype == np.float32 else np.int64).astype(np.int64)
    cand = u[(u >> hi) == (prefix >> hi)]
    return np.bincount((cand >> lo) & ((1 << (hi - lo)) - 1), minlength=1 << (hi - lo)).astype(np.int32)


@abs_bits_histogram.torch
def _abs_bits_histogram_torch(v, prefix, lo, hi):
    import torch

    u = v.abs().view(torch.int32 if v.dtype == torch.float32 else torch.int64).long()
    cand = u[(u >> hi) == (prefix >> hi)]
    h = torch.bincount((cand >> lo) & ((1 << (hi - lo)) - 1), minlength=1 << (hi - lo))
    return h.cpu().numpy().astype(np.int32)


def bits_to_float(u: int, dtype: str) -> float:
    return float(np.asarray([u], dtype=_INT_VIEW[dtype]).view(dtype)[0])


def radix_select(ctx, values, k: int, dtype: str, bits: int, tag: int):
    """Generator: the exact k-th largest |v| over every rank's ``values``
    (k clamped to the number of values; 0.0 when there are none).

    Digit by digit from the most significant, every rank histograms the next
    ``bits`` bits of its candidates and an allreduce sums the histograms; the
    digit is the largest bin that still leaves at least k values at or above
    it. ceil(31/bits) rounds for float32, each log2(P)(alpha + 4 * 2^bits beta)."""
    prefix, above, hi = 0, 0, MAGNITUDE_BITS[dtype]
    k_eff = None
    while hi > 0:
        lo = max(0, hi - bits)
        h = yield ctx.compute("abs_bits_histogram", values, prefix, lo, hi)
        h = np.asarray((yield AllreduceHost(h, "sum", tag)), dtype=np.int64)
        if k_eff is None:  # the first digit's histogram counts every value
            k_eff = min(int(k), int(h.sum()))
            if k_eff == 0:
                return 0.0
        top = np.cumsum(h[::-1])  # top[j]: values in the j+1 highest bins
        j = int(np.searchsorted(above + top, k_eff))
        digit = len(h) - 1 - j
        above += int(top[j] - h[digit])
        prefix |= digit << lo
        hi = lo
    return bits_to_float(prefix, dtype)
