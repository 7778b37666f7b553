"""Allgather-based sparse allreduce: TopkA.

TopkA (Ok-Topk paper, Li & Hoefler PPoPP'22, section 2 and Table 1; SparCML's
and Shi et al.'s allgather approach): every worker selects its exact local
top-k (k values + k int32 indices, 2k words), allgathers the COO blocks and
sums them locally into a dense vector. No fill-in, but each worker receives
all other workers' blocks.

Cost (recursive-doubling allgather, P a power of two, w = 4-byte words):
``log2(P) alpha + 2k(P-1) w beta``; with ``allgather: ring``,
``(P-1) alpha + 2k(P-1) w beta``. The public Ok-Topk code does two
MPI_Allgather calls (values, then indices); we send one COO block per step,
which moves the same bytes with half the messages (the paper's latency term
counts one allgather).

Result semantic: ``sum_i Top_k(G_i)`` (dense).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from .base import Algorithm, Sampling, SparseParams, allgather_messages, host_indices, register, topk_choice
from .collectives import Allgather


class TopkAParams(SparseParams):
    allgather: Literal["rd", "ring"] = "rd"


@register("topka")
class TopkA(Algorithm):
    __doc__ = __doc__
    Params = TopkAParams
    sampling = Sampling(top_k=True, result="dense")

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """One allgather of the COO blocks: ``pof2 log2(pof2) + 2 (P - pof2)``
        (rd), ``P(P-1)`` (ring); exact."""
        return float(allgather_messages(P, params.allgather))

    def run(self, ctx, x):
        with ctx.phase("select"):
            sel = yield ctx.compute("topk", x, self.k)
        self.contributed = sel.indices
        with ctx.phase("allgather"):
            blocks = yield Allgather(sel, self.params.allgather)
        with ctx.phase("reduce"):
            return (yield ctx.compute("scatter_add", blocks, self.setup.n, like=x))

    def check_state(self) -> dict:
        return {"selected": host_indices(self.contributed)}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        """Sum of every rank's top-k. Among entries tied at the k-th
        magnitude any choice is a top-k (torch and numpy choose differently):
        a rank's own choice is accepted when it is a valid top-k of its input."""
        out = np.zeros(setup.n, dtype=np.float64)
        for g, st in zip(inputs, states):
            sel = topk_choice(g, setup.k, st.get("selected"))
            out[sel] += g[sel]
        return out
