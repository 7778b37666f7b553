"""gTopk: global top-k by a reduction tree with top-k at every level.

Shi et al., "A distributed synchronous SGD algorithm with global top-k
sparsification for low bandwidth networks" (ICDCS'19), as the Ok-Topk paper
describes it (Li & Hoefler, PPoPP'22, section 2 and Table 1) and as the public
code runs it (``gtopk_sparse_allreduce`` in Shigangli/Ok-Topk and
HKBU-HPML/gtopkssgd at 6f57343):

1. every worker selects its exact local top-k (k int32 indices + k values);
2. reduction tree: in round j = 0..log2(P)-1 the rank at odd position (stride
   2^j) sends its k pairs to its even neighbour, which sums the two sparse
   vectors on their common indices and keeps the top-k of the <= 2k candidates;
3. the root broadcasts the final k pairs (binomial tree);
4. each worker returns its local values that were not globally selected to
   the residual: ``contributed`` = local top-k indices that appear in the final
   result (the code's ``included_indexes``).

Cost (P a power of two, w = 4-byte words): ``2 log2(P) alpha + 4k log2(P) w
beta`` -- log2 P rounds of 2k words up the tree, log2 P rounds of 2k words
down the binomial broadcast (Table 1). Every non-root rank sends 2k words in
the reduction; the broadcast moves 2k(P-1) words in all.

Result semantic (the reference): leaves ``S_r = Top_k(G_r)``; each tree node
``Top_k(S_a + S_b)``; the result is the root's k pairs (dense, summed values).

Where we depart from, or choose between, paper and code:

* Non-powers of two: the code requires P = 2^m (it indexes ``participate_ranks
  [local_rank + 1]``). We fold as MPICH does (:class:`~.collectives.Fold`):
  the even ranks below ``2 rem`` send their top-k to their odd neighbour,
  which merges it (one extra tree level), the ``pof2`` survivors run the tree,
  and the broadcast from the root covers all P ranks.
* The code packs indices into the float32 message (exact only below 2^24) and
  calls ``Barrier`` after every round; we send int32 indices (same 2k words)
  and use no barriers (they are not part of the paper's cost model).
* Under error feedback a local index that survives in the final result but was
  dropped from this rank's subtree on the way up is still zeroed in the
  residual (the code's intersection rule; the paper does not say).
"""
from __future__ import annotations

import numpy as np

from .base import Algorithm, Sampling, SparseParams, bcast_messages, host_indices, register, pof2_floor, topk_choice
from .collectives import Bcast, recv, send
from .steps import Fold


@register("gtopk")
class GTopk(Algorithm):
    __doc__ = __doc__
    Params = SparseParams
    sampling = Sampling(top_k=True)

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """The fold (P - pof2 messages), the tree (pof2 - 1: every participant
        but the root sends once) and the binomial broadcast (P - 1): ``2(P-1)``; exact."""
        return float((P - pof2_floor(P)) + (pof2_floor(P) - 1) + bcast_messages(P))

    def run(self, ctx, x):
        P, r, k = ctx.size, ctx.rank, self.k
        with ctx.phase("select"):
            local = yield ctx.compute("topk", x, k)
        self.selected, self.merges = local.indices, []
        f = Fold(P)
        cur = local
        with ctx.phase("reduce_tree"):
            # fold: the even rank hands its top-k to the odd one, which merges
            cur = yield from f.fold_in(ctx, cur, _same, lambda mine, theirs: self._merge(ctx, mine, theirs), 0)
            nr = f.newrank(r)
            mask = 1
            while nr >= 0 and mask < f.pof2:
                if nr & mask:
                    yield from send(ctx, f.real(nr - mask), cur)
                    break
                cur = yield from self._merge(ctx, cur, (yield from recv(ctx, f.real(nr + mask))))
                mask <<= 1
        root = f.real(0)
        with ctx.phase("bcast"):
            final = yield Bcast(cur if r == root else None, root=root)
        with ctx.phase("residual"):
            self.contributed = yield ctx.compute("intersect", local.indices, final.indices)
        return final

    def check_state(self) -> dict:
        return {"selected": host_indices(getattr(self, "selected", None)),
                "merges": [host_indices(m) for m in getattr(self, "merges", [])]}

    def _merge(self, ctx, mine, theirs):
        """Sum two sparse vectors on their common indices, keep the top-k."""
        both = yield ctx.compute("coo_add", [mine, theirs])
        kept = yield ctx.compute("coo_topk", both, self.k)
        self.merges.append(kept.indices)  # its choice among ties, for the reference
        return kept

    @classmethod
    def reference(cls, inputs, setup, params, states):
        n, k, P = setup.n, setup.k, setup.P
        nodes = {}
        for r, (g, st) in enumerate(zip(inputs, states)):
            sel = np.sort(topk_choice(g, k, st.get("selected")))  # a rank's own choice among ties
            nodes[r] = (sel, g[sel])
        f = Fold(P)

        def merge(r, a, b, j):  # rank r's j-th merge, with r's own choice among ties
            merges = states[r].get("merges") or []
            return _top_k_of_sum(a, b, k, merges[j] if j < len(merges) else None)

        for r in range(0, 2 * f.rem, 2):
            nodes[r + 1] = merge(r + 1, nodes.pop(r), nodes[r + 1], 0)
        level = [nodes[f.real(i)] for i in range(f.pof2)]
        step = 0
        while len(level) > 1:  # at tree step s, newrank 2 i 2^s merges; its merges so far: a fold, then s
            nxt = []
            for i in range(0, len(level), 2):
                r = f.real(i << step)
                nxt.append(merge(r, level[i], level[i + 1], step + (r < 2 * f.rem)))
            level, step = nxt, step + 1
        idx, val = level[0]
        out = np.zeros(n)
        out[idx] = val
        return out


def _same(p):
    return p


def _top_k_of_sum(a, b, k, chosen=None):
    """Top_k(S_a + S_b) of two sparse vectors (index, value), summed in their
    dtype; ``chosen`` (the merging rank's indices) when it is a valid top-k."""
    idx = np.union1d(a[0], b[0])
    val = np.zeros(len(idx), dtype=a[1].dtype)
    val[np.searchsorted(idx, a[0])] += a[1]
    val[np.searchsorted(idx, b[0])] += b[1]
    if k >= len(idx):
        return idx, val
    pos = None
    if chosen is not None and np.isin(chosen, idx).all():
        pos = np.searchsorted(idx, chosen)
    keep = np.sort(topk_choice(val, k, pos))
    return idx[keep], val[keep]
