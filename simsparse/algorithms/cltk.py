"""CLT-k: cyclic local top-k.

Chen et al., ScaleCom (NeurIPS'20), as DEFT describes it (Yoon & Oh, ICPP'23,
sections 1 and 3.1, Table 1) and as DEFT's public code runs it
(``CLTKReducer`` in kljp/deft at fc7f76f). Per iteration t:

1. the leader ``L = t mod P`` selects its exact local top-k indices;
2. the leader broadcasts the k indices (binomial tree);
3. every worker gathers its own values at those indices;
4. a dense allreduce of the k values (MPICH's choice: recursive doubling up
   to 2 KiB, Rabenseifner above).

No gradient build-up: the result always has exactly k nonzeros, whatever P.
Under error feedback every worker zeroes its accumulator at the leader's
indices (DEFT Alg. 1, line 11): ``contributed`` = the leader's indices.

Cost (P a power of two, w = 4-byte words, Rabenseifner for the values):
``log2(P)(alpha + k w beta) + 2 log2(P) alpha + 2 (P-1)/P k w beta``, plus the
leader's O(n log k) selection on the critical path while the others wait
(the "worker idling" of DEFT's Table 1).

Result semantic (the reference): ``sum_i G_i[I]`` on ``I = Top_k(G_L)``.

Where we depart from, or choose between, paper and code:

* The code runs ``torch.topk`` on every worker and then overwrites the
  non-leaders' indices with the broadcast; we select on the leader only (the
  paper's description). The critical path is the same.
* The code broadcasts int64 indices (torch.topk's dtype) with NCCL; we send
  int32 indices, as every other algorithm here, by a binomial tree.
* ScaleCom's low-pass filter on the accumulator is absent, as in DEFT's code.
"""
from __future__ import annotations

import numpy as np

from ..ops import COO, Dense
from .base import (Algorithm, Sampling, SparseParams, agreed_state, auto_allreduce_messages, bcast_messages, host_indices,
                   register, topk_choice)
from .collectives import Bcast
from .dense import allreduce


@register("cltk")
class CLTk(Algorithm):
    __doc__ = __doc__
    Params = SparseParams
    sampling = Sampling(top_k=True)   # the non-leaders' values at the leader's indices: drawn below the floor

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """The broadcast of the indices (P - 1) and the allreduce of the k
        values, MPICH's choice on their full size (float32 assumed: recursive
        doubling while 4k <= 2048 bytes, ``pof2 log2(pof2) + 2 (P - pof2)``;
        Rabenseifner above, ``2 pof2 log2(pof2) + 2 (P - pof2)``); exact."""
        return float(bcast_messages(P) + auto_allreduce_messages(P, k))

    def run(self, ctx, x):
        self.leader = self.iteration_no % ctx.size
        mine = None
        if ctx.rank == self.leader:
            with ctx.phase("select"):
                sel = yield ctx.compute("topk", x, self.k)
            mine = Dense(sel.indices)
        with ctx.phase("bcast"):
            idx = (yield Bcast(mine, root=self.leader)).values
        with ctx.phase("allreduce"):
            vals = yield ctx.compute("gather_at", x, idx)
            vals = yield from allreduce(ctx, vals)
        self.contributed = idx
        return COO(idx, vals, self.setup.n)

    def check_state(self) -> dict:
        # every rank holds the broadcast indices: the leader's top-k (its own choice among ties)
        return {"leader": self.leader, "selected": host_indices(self.contributed)}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        leader = agreed_state(states, "leader", "the CLT-k leader")
        idx = topk_choice(inputs[leader], setup.k, states[leader].get("selected"))
        out = np.zeros(setup.n)
        for g in inputs:
            out[idx] += g[idx]
        return out
