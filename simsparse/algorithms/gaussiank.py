"""Gaussiank: Gaussian threshold estimate, then an allgather-based exchange.

Shi et al., "Understanding top-k sparsification in distributed deep learning"
(2019), as the Ok-Topk paper uses it as a baseline (Li & Hoefler, PPoPP'22,
sections 2, 3.1.3 and 5.3; Table 1) and as its public code runs it
(``GaussianCompressor.compress`` and the ``gaussiank`` branch of
``allreducer.py`` in Shigangli/Ok-Topk at 9763dcc):

1. threshold from a normal fit of the accumulator:
   ``thr = mu + |Phi^-1(density/2)| sigma`` (:mod:`~simsparse.compression.gaussian`);
2. adjustment, because the normal fit misjudges the tail (``adjust``):

   * ``code`` (default): if fewer than ``3k//4`` values pass, divide the
     threshold by ``scale`` = 1.02 until at least ``3k//4`` pass; if more than
     ``5k//4`` pass, multiply by 1.02 until at most ``5k//4`` pass; at most
     ``max_retries`` = 20 times each (the public code);
   * ``paper``: only lowered, "until the number of selected values is more
     than 3k/4" (section 5.3); the paper gives no bound, ``max_retries`` applies;

3. select ``|x| >= thr`` (k_i values on rank i, about k);
4. ``Allgather`` of the P counts, then an allgatherv of the (int32 index,
   value) pairs, summed locally into a dense vector.

Cost (P a power of two, recursive doubling, w = 4-byte words):
``2 log2(P) alpha + (P-1) w beta + 2 (sum_{j != i} k_j) w beta``, i.e. about
``2 log2(P) alpha + 2k(P-1) w beta`` (Table 1), plus ``1 + retries`` O(n)
passes for the statistics and counts instead of an O(n log k) top-k.

Result semantic (the reference): ``sum_i G_i * [|G_i| >= thr_i]`` with every
rank's threshold ``thr_i`` reported by ``check_state``.

Where we depart from, or choose between, paper and code: the code selects
``|g| > thr`` (strict); we use ``>=`` as all threshold kernels here (the same
for continuous data). The code uses two Allgatherv (indices, then values); we
send one COO block per step (same bytes, half the messages), as TopkA does.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ..compression.gaussian import gaussian_threshold
from ..ops import Scalars
from .base import Algorithm, Sampling, SparseParams, allgather_messages, register
from .collectives import Allgather


class GaussiankParams(SparseParams):
    adjust: Literal["code", "paper"] = Field(
        "code", description="threshold adjustment: 'code' keeps the count in [3k//4, 5k//4] (public code), "
                            "'paper' only lowers it until >= 3k/4 are selected (Ok-Topk paper, section 5.3)")
    scale: float = Field(1.02, gt=1, description="factor the threshold is divided (multiplied) by per retry")
    max_retries: int = Field(20, ge=0, description="most adjustment steps per iteration (code: 20)")
    allgather: Literal["rd", "ring"] = Field("rd", description="allgather(v) algorithm for counts and pairs")


@register("gaussiank")
class Gaussiank(Algorithm):
    __doc__ = __doc__
    Params = GaussiankParams
    sampling = Sampling(result="dense")   # its moments are the distribution's

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """Two allgathers (counts, then the pairs): ``2 (pof2 log2(pof2) + 2 (P - pof2))``
        (rd), ``2P(P-1)`` (ring); exact (the threshold retries send nothing)."""
        return float(2 * allgather_messages(P, params.allgather))

    def run(self, ctx, x):
        prm = self.params
        with ctx.phase("select"):
            mu, sigma = yield ctx.compute("mean_std", x)
            thr = gaussian_threshold(mu, sigma, self.setup.density)
            thr, self.retries = yield from self._adjust(ctx, x, thr)
            sel = yield ctx.compute("threshold_select", x, thr)
        self.threshold = thr
        self.contributed = sel.indices
        with ctx.phase("allgather"):
            yield Allgather(Scalars.of([sel.nnz], "int32"), prm.allgather)
            blocks = yield Allgather(sel, prm.allgather)
        with ctx.phase("reduce"):
            return (yield ctx.compute("scatter_add", blocks, self.setup.n, like=x))

    def _adjust(self, ctx, x, thr):
        """Scale the threshold until the count is in range; returns (thr, retries)."""
        prm, k = self.params, self.k
        lo, hi = 3 * k // 4, 5 * k // 4
        count = yield ctx.compute("count_above", x, thr)
        lower = count < lo
        if not lower and not (count > hi and prm.adjust == "code"):
            return thr, 0
        tries = 0
        while tries < prm.max_retries and (count < lo if lower else count > hi):
            thr = thr / prm.scale if lower else thr * prm.scale
            count = yield ctx.compute("count_above", x, thr)
            tries += 1
        return thr, tries

    def check_state(self) -> dict:
        return {"threshold": self.threshold, "retries": self.retries}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        out = np.zeros(setup.n)
        for g, s in zip(inputs, states):
            keep = np.abs(g) >= s["threshold"]
            out[keep] += g[keep]
        return out
