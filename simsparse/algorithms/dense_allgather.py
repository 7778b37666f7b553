"""SGD without compression exchanged by an allgather: the FFT paper's baseline.

Wang et al. (HPDC'20) section 4, "Implementation": "Even though SGD usually
uses allreduce instead of allgather as it does not have compression; for a
fair comparison, we applied allgather for all algorithms". Every rank
allgathers its dense float32 gradient and sums the P blocks in rank order.

Cost (recursive doubling, P a power of two, n words of w bytes):
``log2(P) alpha + (P-1) n w beta``, and P-1 dense additions of n elements
on the device; ring: ``(P-1)(alpha + n w beta)``. The result is the exact
sum, so it counts as a dense allreduce (``whole``, ``wfbp``, ... accept it).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


from ..ops import Dense
from .base import Algorithm, allgather_messages, dense_sum, register
from .collectives import Allgather


class DenseAllgatherParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allgather: Literal["rd", "ring"] = "rd"


@register("dense_allgather")
class DenseAllgather(Algorithm):
    __doc__ = __doc__
    Params = DenseAllgatherParams
    dense = True
    value_free = True   # every message and kernel size follows from n and P

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """One allgather: ``pof2 log2(pof2) + 2 (P - pof2)`` (rd), ``P(P-1)`` (ring); exact."""
        return float(allgather_messages(P, params.allgather))

    def run(self, ctx, x):
        with ctx.phase("allgather"):
            blocks = yield Allgather(Dense(x), self.params.allgather)
        with ctx.phase("reduce"):
            acc = blocks[0].values
            for b in blocks[1:]:
                acc = yield ctx.compute("add", acc, b.values)
        return acc

    reference = staticmethod(dense_sum)
