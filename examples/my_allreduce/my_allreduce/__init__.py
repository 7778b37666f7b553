"""A sparse allreduce written outside simsparse (docs/plugins.md)."""
import numpy as np

from simsparse.algorithms import Algorithm, SparseParams
from simsparse.algorithms.base import host_indices, topk_choice


class RingTopk(Algorithm):
    """Ring top-k: every rank selects its top k by magnitude and passes the
    selections around a ring, P - 1 steps, forwarding what it received the
    step before (a ring allgather by hand); then every rank sums the P
    selections. (P - 1) k (index, value) pairs per rank, as TopkA sends, in
    P - 1 messages instead of log2(P)."""

    Params = SparseParams  # accepts error_feedback

    def run(self, ctx, x):
        P, rank = self.P, self.setup.rank
        with ctx.phase("select"):
            block = yield ctx.compute("topk", x, self.k)
        self.contributed = block.indices  # what error feedback keeps out of the residual
        blocks = [block]
        with ctx.phase("ring"):
            for step in range(P - 1):
                recv = ctx.irecv((rank - 1) % P, tag=step)
                send = ctx.isend((rank + 1) % P, blocks[-1], tag=step)
                got, _ = yield ctx.waitall([recv, send])
                blocks.append(got)
        with ctx.phase("reduce"):
            return (yield ctx.compute("scatter_add", blocks, self.setup.n, like=x))

    def check_state(self):
        return {"selected": host_indices(self.contributed)}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        """The sum over ranks of each rank's top k (its own choice among ties)."""
        out = np.zeros(setup.n)
        for g, st in zip(inputs, states):
            sel = topk_choice(g, setup.k, st["selected"])
            out[sel] += g[sel]
        return out
