"""SparCML's sparse allreduces (Renggli et al., SC'19, section 5) and the
Ok-Topk paper's TopkDSA baseline (Li & Hoefler, PPoPP'22, Table 1).

Every rank first selects its exact local top-k (SparCML Algorithm 1, TopK
SGD: ``allreduce(Q(TopK(acc)))``), makes it a sparse stream
(:mod:`.streams`) and sums the streams of all ranks. Without quantization
the result is exactly ``sum_i Top_k(G_i)`` on every rank; with error feedback
(``error_feedback: true``) the unselected values stay as the residual
(``contributed`` = the local top-k indices).

Notation for costs: P ranks (a power of two unless said), n elements, k
selected per rank, a message of m bytes costs ``alpha + m beta``;
``beta_s`` is the cost of one (index, value) pair (8 bytes), ``beta_d`` of one
value (4 bytes). Fill-in: with uniformly random coordinates the reduced
result holds ``E[K] = n (1 - (1 - k/n)^P)`` nonzeros (:func:`expected_nnz`).

Region boundaries follow the SparCML and Ok-Topk code: ``n // parts``
elements per region, the last region takes the remainder.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ..compression.qsgd import levels
from ..compression.rng import seed_of
from ..ops import Dense, Scalars
from .base import (Algorithm, Sampling, SparseParams, allgather_messages, alltoall_messages, fold_messages, host_indices,
                   pof2_floor, rd_messages, register, topk_choice)
from .collectives import Allgather, Alltoall, Reduce, Sendrecv, count_blocks, received, recursive_doubling
from .rotation_sums import rotated
from .steps import Fold
from .streams import DenseRange, stream_result

TAG_FOLD, TAG_SPLIT, TAG_GATHER, TAG_COUNTS, TAG_SIZES = 1, 2, 3, 4, 5

_ROTATION_DOC = ("destination rotation of the split-phase sends (Ok-Topk Fig. 2b): r+1, r+2, ... (mod P); false "
                 "posts them to ranks 0, 1, ..., P-1 as the SparCML code does (every rank targets the same owner first)")


def region_bounds(n: int, parts: int) -> list[int]:
    """SparCML/Ok-Topk regions: ``n // parts`` each, the last one takes the rest."""
    size = n // parts
    return [i * size for i in range(parts)] + [n]


def expected_nnz(n: int, k: int, P: int) -> float:
    """SparCML's expected fill-in: nonzeros of the sum of P random k-subsets of n."""
    return n * (1.0 - (1.0 - k / n) ** P)


def send_order(r: int, P: int, rotation: bool) -> list[int]:
    """Peers of ``r`` in the order the split phase posts its sends."""
    if rotation:
        return [rotated(P, r, i) for i in range(1, P)]
    return [i for i in range(P) if i != r]


def _same(p):
    return p


def sum_of_local_topk(inputs, setup, states=None) -> np.ndarray:
    """``sum_i Top_k(G_i)`` in float64, every rank's exact top-k (a rank's
    own choice among entries tied at the k-th magnitude is accepted:
    :func:`topk_choice`)."""
    out = np.zeros(setup.n, dtype=np.float64)
    for g, st in zip(inputs, states or [{}] * len(inputs)):
        sel = topk_choice(g, setup.k, st.get("selected"))
        out[sel] += g[sel]
    return out


class _LocalTopkSum(Algorithm):
    """Common part: local top-k selection and the lossless reference."""

    sampling = Sampling(top_k=True, result="union")

    def select(self, ctx, x):
        with ctx.phase("select"):
            sel = yield ctx.compute("topk", x, self.k)
        self.contributed = sel.indices
        return sel

    def check_state(self) -> dict:
        return {"selected": host_indices(self.contributed)}

    def select_regions(self, ctx, x):
        """Local top-k, the P equal index regions, and this rank's [lo, hi)."""
        sel = yield from self.select(ctx, x)
        bounds = region_bounds(self.setup.n, ctx.size)
        return sel, bounds, bounds[ctx.rank], bounds[ctx.rank + 1]

    @classmethod
    def reference(cls, inputs, setup, params, states):
        return sum_of_local_topk(inputs, setup, states)


# ---------------------------------------------------------------------------------------


@register("ssar_recursive_double")
class SSARRecursiveDouble(_LocalTopkSum):
    """SSAR_Recursive_double (SparCML, section 5.3.1; code
    ``c_allreduce_recdoubling.h``): in round t = 1..log2(P) a rank exchanges
    its whole current stream with the rank at distance 2^(t-1) and sums the
    two (``stream_add``, which switches to dense when nnz_1 + nnz_2 reaches
    n/2 for int32 + float32). A non-power-of-two P is folded first as the
    code does: each even rank below 2(P - pof2) sends its stream to the next
    (odd) rank, which adds it, and receives the result at the end.

    Cost: latency ``L1(P) = log2(P) alpha``; bandwidth between
    ``log2(P) k beta_s`` (identical coordinates: every stream stays k long)
    and ``(P - 1) k beta_s`` (disjoint coordinates: round t sends 2^(t-1) k
    pairs), each message capped at the dense size ``n beta_d`` by the switch.

    Departures from the code: none in the schedule; the fold's messages are
    counted like any other (the code's stream header is framing).
    """

    Params = SparseParams

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """Recursive doubling with the fold: ``pof2 log2(pof2) + 2 (P - pof2)``;
        exact (the streams' sizes vary, their number does not)."""
        return float(rd_messages(P))

    def run(self, ctx, x):
        n = self.setup.n
        sel = yield from self.select(ctx, x)
        (s,) = yield ctx.compute("stream_split", sel, [0, n])

        def add(mine, theirs):
            return (yield ctx.compute("stream_add", mine, theirs, 0, n))

        s = yield from recursive_doubling(ctx, s, _same, _same, add, TAG_GATHER)
        return stream_result(s)


# ---------------------------------------------------------------------------------------


class SSARSplitAllgatherParams(SparseParams):
    resparsify_eps: float = Field(
        0.0, ge=0, description="after the split phase a dense reduced range keeps only |v| > eps: 0 keeps every "
                               "nonzero (lossless, the paper); the SparCML code drops |v| <= 1e-8")
    rotation: bool = Field(False, description=_ROTATION_DOC)


def split_reduce(ctx, s, bounds, me, peer_of, rotation, lo, hi, inplace):
    """SparCML's split phase: post a receive from every other participant,
    split the stream by ``bounds``, send part j to participant j, and sum the
    parts that arrive (``MPI_Waitany`` order) into part ``me``. ``peer_of``
    maps a participant to its rank. Returns the reduced stream of ``[lo, hi)``."""
    parts_n = len(bounds) - 1
    others = [j for j in range(parts_n) if j != me]
    recvs = [ctx.irecv(peer_of(j), TAG_SPLIT) for j in others]
    parts = yield ctx.compute("stream_split", s, bounds)
    sends = [ctx.isend(peer_of(j), parts[j], TAG_SPLIT) for j in send_order(me, parts_n, rotation)]
    acc = parts[me]
    if inplace:
        acc = yield ctx.compute("stream_dense", acc, lo, hi)
    pending = recvs
    while pending:
        i, got = yield ctx.waitany(pending)
        pending = pending[:i] + pending[i + 1:]
        acc = yield ctx.compute("stream_add", acc, got, lo, hi, inplace=inplace)
    yield ctx.waitall(sends)
    return acc


@register("ssar_split_allgather")
class SSARSplitAllgather(_LocalTopkSum):
    """SSAR_Split_allgather (SparCML, section 5.3.2; code
    ``c_allreduce_small.h``): fold to pof2 ranks, split the index space into
    pof2 ranges and send each range's part of the stream directly to its owner
    (nonblocking, summed in arrival order), re-sparsify the reduced range
    (dropping ``|v| <= resparsify_eps``), then a recursive-doubling allgather of
    the disjoint streams (concatenated, dense once nnz reaches n/2), and unfold.

    Cost: latency ``L2(P) = (P - 1) alpha + log2(P) alpha``; bandwidth
    between ``2 (P-1)/P k beta_s`` and ``P k beta_s`` (split phase up to
    ``k beta_s``, allgather between ``(P-1)/P k`` and ``(P-1) k`` pairs).

    Departures: the code posts the split sends to vranks 0, 1, ..., pof2-1
    (``rotation: false``, the default); ``rotation`` is offered to avoid every
    rank targeting the same owner first. The code re-sparsifies a dense
    reduced range with ``|v| > 1e-8``, which the paper does not mention; the
    default ``resparsify_eps: 0`` keeps every nonzero (lossless) and ``1e-8``
    reproduces the code (the reference then drops the same values: each owner
    reports whether its range went dense).
    """

    Params = SSARSplitAllgatherParams
    cut_range = None  # the reduced range this rank re-sparsified from dense, if any

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """The fold in and out (2 (P - pof2)), the split among pof2 ranks
        (pof2 (pof2 - 1): every part is sent, empty or not) and the
        recursive-doubling allgather (pof2 log2(pof2)); exact, with or without rotation."""
        pof2 = pof2_floor(P)
        return float(fold_messages(P) + alltoall_messages(pof2) + rd_messages(pof2))

    def run(self, ctx, x):
        P, r, n = ctx.size, ctx.rank, self.setup.n
        sel = yield from self.select(ctx, x)
        (s,) = yield ctx.compute("stream_split", sel, [0, n])
        f = Fold(P)

        def add(mine, theirs):
            return (yield ctx.compute("stream_add", mine, theirs, 0, n))

        with ctx.phase("fold"):
            s = yield from f.fold_in(ctx, s, _same, add, TAG_FOLD)
        nr = f.newrank(r)
        if nr >= 0:
            bounds = region_bounds(n, f.pof2)
            lo, hi = bounds[nr], bounds[nr + 1]
            with ctx.phase("split_reduce"):
                acc = yield from split_reduce(ctx, s, bounds, nr, f.real, self.params.rotation, lo, hi, False)
                self.cut_range = (lo, hi) if isinstance(acc, DenseRange) else None
                s = yield ctx.compute("stream_resparsify", acc, self.params.resparsify_eps)
            with ctx.phase("allgather"):
                mask = 1
                while mask < f.pof2:
                    peer = f.real(nr ^ mask)
                    got = yield Sendrecv(peer, s, peer, TAG_GATHER)
                    s = yield ctx.compute("stream_add", s, got, 0, n, disjoint=True, inplace=True)
                    mask <<= 1
        with ctx.phase("unfold"):
            s = yield from f.fold_out(ctx, s, _same, received, TAG_FOLD)
        return stream_result(s)

    def check_state(self):
        return {**super().check_state(), "cut_range": self.cut_range}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        out = sum_of_local_topk(inputs, setup, states)
        for st in states:
            if st.get("cut_range"):
                seg = out[st["cut_range"][0]:st["cut_range"][1]]
                seg[np.abs(seg) <= params.resparsify_eps] = 0.0
        return out


# ---------------------------------------------------------------------------------------


class DSARSplitAllgatherParams(SparseParams):
    rotation: bool = Field(False, description=_ROTATION_DOC)
    allgather: Literal["rd", "ring"] = Field(
        "rd", description="dense allgather(v) of the reduced regions: recursive doubling (the paper's L1(P)) or ring")
    quantize_bits: Literal[2, 4, 8] | None = Field(
        None, description="QSGD-quantize the dense stage to 2, 4 or 8 bits per value (SparCML section 5.4); "
                          "null sends float values")
    quantize_bucket: int = Field(
        1024, ge=1, description="QSGD bucket: consecutive values sharing one float32 scale (SparCML: 'in the order "
                                "of 1024')")


@register("dsar_split_allgather")
class DSARSplitAllgather(_LocalTopkSum):
    """DSAR_Split_allgather (SparCML, section 5.3.3; code
    ``c_allreduce_big.h``): split the index space into P regions and send each
    region's part of the local stream (sparse, or dense when its count reaches
    the switch) directly to its owner; the owner turns its own part into a
    dense buffer and adds the parts in arrival order (``MPI_Waitany``); then a
    *dense* allgather(v) of the reduced regions. Any P (the code does not fold).

    With ``quantize_bits`` the dense stage is QSGD-quantized (section 5.4): each
    owner quantizes its reduced region once (buckets of ``quantize_bucket``
    values, one float32 scale each, stochastic rounding seeded by rank and
    iteration) and every rank, the owner included, uses the dequantized
    blocks, so all results agree. Each element is quantized exactly once:
    ``|error| <= scale_bucket / s`` with ``s = 2^(bits-1) - 1``, unbiased.

    Cost: ``L2(P) + (P-1)/P n beta_d <= T <= L2(P) + k beta_s + (P-1)/P n
    beta_d`` with ``L2(P) = (P-1) alpha + log2(P) alpha`` (rd allgather; ring:
    ``2(P-1) alpha``). Quantized, the allgather moves ``(P-1)/P (n bits/8 + 4
    n/bucket)`` bytes per rank instead of ``(P-1)/P 4n``.

    Departures from the code: its Isends are never waited for; here they are
    completed before the allgather. ``rotation`` as in
    ``ssar_split_allgather``. SparCML's quantizing code is not public; the
    quantizer is :mod:`simsparse.compression.qsgd` (max-norm scale).
    """

    Params = DSARSplitAllgatherParams
    sampling = Sampling(top_k=True, result="dense_per_rank")

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """The split (P(P-1): every part is sent, empty or not) and one
        allgather of the reduced regions (``pof2 log2(pof2) + 2 (P - pof2)`` for
        rd, ``P(P-1)`` for ring); exact, quantized or not, with or without rotation."""
        return float(alltoall_messages(P) + allgather_messages(P, params.allgather))

    def run(self, ctx, x):
        r, prm = ctx.rank, self.params
        sel, bounds, lo, hi = yield from self.select_regions(ctx, x)
        with ctx.phase("split_reduce"):
            acc = yield from split_reduce(ctx, sel, bounds, r, _same, prm.rotation, lo, hi, True)
        with ctx.phase("allgather"):
            if prm.quantize_bits is None:
                blocks = yield Allgather(acc, prm.allgather, TAG_GATHER)
            else:
                q = yield ctx.compute("qsgd_quantize", acc.values, prm.quantize_bits, prm.quantize_bucket,
                                      seed_of(r, self.iteration_no, 0))
                blocks = yield Allgather(q, prm.allgather, TAG_GATHER)
        with ctx.phase("combine"):
            if prm.quantize_bits is None:
                vals = [b.values for b in blocks]
            else:
                vals = []
                for b in blocks:
                    vals.append((yield ctx.compute("qsgd_dequantize", b, acc.values)))
            return (yield ctx.compute("concat", vals))

    @classmethod
    def tolerance_for(cls, setup, params):
        tol = cls.tolerance(setup)
        if params.quantize_bits is None:
            return tol
        # relative to max |reference|: every element is quantized once, error <= bucket max / s
        return tol + (1 + 1e-5) / levels(params.quantize_bits)


# ---------------------------------------------------------------------------------------


class TopkDSAParams(SparseParams):
    bucket_size: int = Field(4, ge=1, description="exchange steps in flight at once in the split phase "
                                                  "(the Ok-Topk code's throttle: min(4, P))")
    allgather: Literal["rd", "ring"] = Field(
        "rd", description="allgather of the sizes and allgatherv of the regions: recursive doubling "
                          "(Table 1's 2 log2 P alpha) or ring")
    count_exchange: bool = Field(True, description="Alltoall of the per-region counts first, as the Ok-Topk code "
                                                   "does (P-1 latency-only messages); false: omit it, as Table 1 does")


@register("topkdsa")
class TopkDSA(_LocalTopkSum):
    """TopkDSA: SparCML's DSAR as the Ok-Topk paper uses it (Li & Hoefler,
    PPoPP'22, sections 2 and 6, Table 1; code ``topkSA`` in
    ``allreducer.py``). Exact local top-k every iteration; P equal regions;
    each rank sends region j's entries of its top-k to rank j (counts first
    by an alltoall, then a rotated exchange -- step i sends to r+i and
    receives from r-i -- with ``bucket_size`` steps in flight, the reduction of
    one batch overlapping the transfer of the next); then an allgather of the
    reduced regions' sizes and an allgatherv of the regions: sparse [idx|val]
    while the total nnz is below n/3 (the code's switch ``2 nnz < 2n/3``),
    otherwise dense.

    Cost (Table 1): latency ``(P + 2 log2 P) alpha`` (plus ``(P-1) alpha``
    for the counts alltoall of the code); bandwidth between ``4k (P-1)/P``
    words (coordinates identical on all ranks) and ``2k (P-1)/P + n (P-1)/P``
    words (the dense allgatherv), a word being 4 bytes.

    Departures from the code: indices and values of a part travel in one
    message (the code sends two, tags 1 and 2: same bytes, half the
    messages); the result is the sum, not the average (the code divides by
    P); the selection is the top-k kernel, not a threshold of the k-th value
    (the same set without ties).
    """

    Params = TopkDSAParams
    sampling = Sampling(top_k=True, result="dense")

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """The counts alltoall (P(P-1), with ``count_exchange``), the rotated
        split (P(P-1)), the sizes allgather and the regions' allgatherv (each
        ``pof2 log2(pof2) + 2 (P - pof2)`` for rd, ``P(P-1)`` for ring; sparse or
        dense, the same messages); exact."""
        counts = alltoall_messages(P) if params.count_exchange and P > 1 else 0
        return float(counts + alltoall_messages(P) + 2 * allgather_messages(P, params.allgather))

    def run(self, ctx, x):
        P, n = ctx.size, self.setup.n
        prm = self.params
        sel, bounds, lo, hi = yield from self.select_regions(ctx, x)
        with ctx.phase("split"):
            parts = yield ctx.compute("coo_split", sel, bounds)
        if prm.count_exchange and P > 1:
            with ctx.phase("counts"):
                yield Alltoall(count_blocks(parts), TAG_COUNTS)
        with ctx.phase("split_reduce"):
            zeros = yield ctx.compute("zeros", hi - lo, x)
            # each part is reduced while the next bucket is in flight
            red = Reduce("stream_add", DenseRange(zeros, lo, n), (lo, hi), {"inplace": True}, each=True)
            acc = yield Alltoall(parts, TAG_SPLIT, True, prm.bucket_size, red)
        with ctx.phase("allgather"):
            mine = yield ctx.compute("sparsify", acc.values, lo, n)
            sizes = yield Allgather(Scalars.of([2 * mine.nnz], "int32"), prm.allgather, TAG_SIZES)
            total = sum(int(s.values[0]) for s in sizes)
            if total < (2 * n) // 3:
                blocks = yield Allgather(mine, prm.allgather, TAG_GATHER)
                return (yield ctx.compute("coo_concat", blocks, n))
            blocks = yield Allgather(Dense(acc.values), prm.allgather, TAG_GATHER)
            return (yield ctx.compute("concat", [b.values for b in blocks]))
