"""DEFT: distributed execution of fragmented top-k.

Yoon & Oh, "DEFT: Exploiting Gradient Norm Difference between Model Layers
for Scalable Gradient Sparsification" (ICPP'23), section 4, and its public
code (``DeftReducer`` in kljp/deft at fc7f76f). Per iteration t, on every
worker:

1. two-stage partitioning (section 4.1, Alg. 2; first iteration only): the
   gradient is cut into its layers (``setup.layer_sizes``), and every layer
   larger than n/P into P near-equal fragments (the first ``size mod P`` one
   element longer);
2. gradient-norm-based local k (section 4.2, Alg. 3): fragments in descending
   L2-norm order get ``k_x = int(k_remain * norm_x / norm_remain)``, capped at
   the fragment size, at least 1;
3. bin packing by the cyclic decision worker ``c = t mod P`` (section 4.3,
   Alg. 4, cost Eq. 3 ``c_x = n_x log2 k_x``): the costliest remaining fragment
   goes to the currently lightest of P bins (LPT); ``c`` broadcasts the bins
   (two int32 arrays, P + L entries: the paper's "4L bytes");
4. layer-wise selection (section 4.4, Alg. 5): worker r runs top-k only on the
   fragments of bin ``(c + r) mod P`` -- disjoint across workers, so no
   gradient build-up and a selection cost that falls with P (Eqs. 4-9);
5. Alg. 1 lines 7-9: allgather of the local counts, allgather of the indices
   (padded to the largest count, as the code does), then a dense allreduce of
   the values at the concatenated indices. Under error feedback every worker
   zeroes those indices (Alg. 1 line 11): ``contributed`` = all of them.

Cost (P a power of two, w = 4-byte words, k' = sum of the selected counts
(about k), k_max = the largest count): ``log2(P)(alpha + 4(P+L) beta)`` for the
broadcast, ``log2(P) alpha + (P-1) w beta`` for the counts, ``log2(P) alpha +
(P-1) k_max w beta`` for the indices and ``2 log2(P) alpha + 2(P-1)/P k' w
beta`` for the values (Rabenseifner), i.e. about ``5 log2(P) alpha + 3k w
beta`` for large P; selection ``max_r sum_{x in bin r} n_x log k_x``
(Eq. 5). (Section 5.3 states ``log(P) alpha + 2(P-1) max_r(sum k_x) beta``, the
TopkA formula with DEFT's counts; the code's exchange is the one above.)

Eq. 9 (f(P) >= P) is not guaranteed: a layer just below n/P is not split,
and LPT may have to put two of them in one bin (VGG-16/ImageNet layer sizes,
P = 8: f(P)/P = 0.96 with Eq. 3 costs; ``benchmarks/bench_deft.py``).

Result semantic (the reference): ``sum_i G_i[I]`` on the union I of every
worker's layer-wise top-k on its own bin, each worker using its own local k.

Where we depart from, or choose between, paper and code:

* Norms: local (no communication). The decision worker packs its bins with
  its own k_x; every worker then selects with its own k_x on its bin
  (the code; section 4.3: "the local k of each layer differs slightly
  between workers"). Norms are accumulated in float64 (the code: float32).
* ``norm_remain`` is the exact sum of the norms not yet visited, not the
  running difference of Alg. 3 line 15 / the code: with the difference the
  last fragment's ratio is 1 -/+ rounding, so int() gives it k_remain or one
  less by chance (and numpy and torch disagree).
* ``fill_remainder`` (default on, the code): the k lost to int() truncation is
  handed back to the highest-norm fragments; Alg. 3 has no such step (its
  k_temp is real-valued, which top-k cannot take).
* Cost of a fragment with k_x <= 1: its size (the code); Alg. 4's
  ``size * log k`` would make it free.
* ``common_part`` (default on, the code at HEAD): fragments whose k_x equals
  their size (by the decision worker's k) go in no bin; every worker adds their
  whole index range without running top-k. The code appends those ranges
  twice (doubling their share of the value allreduce); we add them once, also
  at P = 1 (where the code drops them). Off: Alg. 4 as printed.
* ``index_allgather``: ``padded`` (the code: pad every block to the largest
  count) or ``exact`` (an allgatherv, no padding bytes).
* int32 indices and counts (the code: torch.topk's int64); the code's two
  broadcasts (sizes, fragment ids) go as one message; layers smaller than P
  that would be split produce no empty fragments (the code would crash).
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field

from ..compute.kernels import Work, _isz, kernel
from ..ops import Bundle, Dense, Scalars
from .base import (Algorithm, SparseParams, agreed_state, allgather_messages, auto_allreduce_messages,
                   bcast_messages, host_indices, register, topk_choice)
from .collectives import Allgather, Bcast
from .dense import allreduce


# -- host-side planning (plain Python on small metadata) ------------------------

def partition(layer_sizes, P: int) -> list[tuple[int, int]]:
    """Alg. 2: fragments (start, end); a layer of more than n/P elements is cut
    into P near-equal pieces (the first ``size mod P`` one longer)."""
    n = sum(layer_sizes)
    out, pos = [], 0
    for size in layer_sizes:
        pieces = [size // P + (i < size % P) for i in range(P)] if size > n / P else [size]
        for m in pieces:
            if m > 0:
                out.append((pos, pos + m))
                pos += m
    return out


def assign_k(norms, sizes, k: int, fill_remainder: bool = True) -> list[int]:
    """Alg. 3 as the code runs it: descending-norm order,
    ``k_x = int(k_remain * norm_x / norm_remain)``, capped at the size, at least 1."""
    order = np.argsort(np.asarray(norms), kind="stable")[::-1]
    # norm_remain as exact suffix sums: repeated subtraction (Alg. 3 line 15)
    # leaves the last fragment a ratio of 1 -/+ rounding, so int() would give it
    # k_remain or k_remain - 1 by chance
    suffix = np.cumsum(np.asarray(norms, dtype=np.float64)[order][::-1])[::-1].tolist()
    k_remain = k
    ks = [0] * len(sizes)
    for i, norm_remain in zip(order, suffix):
        t = int(k_remain * (norms[i] / norm_remain)) if norm_remain > 0 else 0
        ks[i] = sizes[i] if sizes[i] < t else max(1, t)
        k_remain -= ks[i]
    if fill_remainder:
        for i in order:
            if k_remain <= 0:
                break
            add = min(sizes[i] - ks[i], k_remain)
            ks[i] += add
            k_remain -= add
    return ks


def selection_cost(size: int, k: int) -> float:
    """Eq. 3, ``n_x log2 k_x``; ``n_x`` when k_x <= 1 (the code)."""
    return size * math.log2(k) if k > 1 else float(size)


def bin_pack(sizes, ks, P: int, common_part: bool = True) -> tuple[list[list[int]], list[int]]:
    """Alg. 4 (LPT): the costliest fragment goes to the lightest bin (first on
    ties). With ``common_part``, fragments with k = size go to no bin."""
    cost = [selection_cost(s, k) for s, k in zip(sizes, ks)]
    bins, load, common = [[] for _ in range(P)], [0.0] * P, []
    for j in sorted(range(len(sizes)), key=lambda i: -cost[i]):
        if common_part and ks[j] == sizes[j]:
            common.append(j)
            continue
        b = load.index(min(load))
        bins[b].append(j)
        load[b] += cost[j]
    return bins, common


# -- kernels ------------------------------------------------------------------------

@kernel("fragment_norms", work=lambda out, x, bounds: Work(len(x), len(x) * _isz(x)))
def fragment_norms(x, bounds):
    """L2 norm of each fragment [bounds[i], bounds[i+1]) (float64 accumulation)."""
    sq = np.square(x, dtype=np.float64)
    return np.sqrt(np.add.reduceat(sq, np.asarray(bounds[:-1]))).tolist()


@fragment_norms.torch
def _fragment_norms_torch(x, bounds):
    import torch

    sizes = torch.as_tensor(np.diff(bounds), device=x.device)
    seg = torch.repeat_interleave(torch.arange(len(sizes), device=x.device), sizes)
    sq = torch.zeros(len(sizes), dtype=torch.float64, device=x.device)
    sq.index_add_(0, seg, x.to(torch.float64).square())
    return sq.sqrt().tolist()


def _fi_work(out, parts, offsets, like):
    m = sum(p.nnz for p in parts)
    return Work(m, 8 * m)


@kernel("fragment_indices", work=_fi_work)
def fragment_indices(parts, offsets, like):
    """Global int32 indices of per-fragment top-k selections (COO with
    fragment-local indices, each shifted by its fragment's start)."""
    if not parts:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate([p.indices.astype(np.int32) + np.int32(o) for p, o in zip(parts, offsets)])


@fragment_indices.torch
def _fragment_indices_torch(parts, offsets, like):
    import torch

    if not parts:
        return torch.zeros(0, dtype=torch.int32, device=like.device)
    return torch.cat([p.indices.to(torch.int32) + int(o) for p, o in zip(parts, offsets)])


@kernel("index_ranges", work=lambda out, ranges, like: Work(len(out), 4 * len(out)))
def index_ranges(ranges, like):
    """int32 indices of the ranges [a, b) concatenated (DEFT's common part)."""
    return np.concatenate([np.zeros(0, np.int32)] + [np.arange(a, b, dtype=np.int32) for a, b in ranges])


@index_ranges.torch
def _index_ranges_torch(ranges, like):
    import torch

    parts = [torch.arange(a, b, dtype=torch.int32, device=like.device) for a, b in ranges]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32, device=like.device)


@kernel("scatter_values", work=lambda out, idx, values, n, like: Work(n + len(idx), n * _isz(like) + 8 * len(idx),
                                                                      select=len(idx)))
def scatter_values(idx, values, n, like):
    """Dense vector of length n: zeros, then out[idx] = values (unique idx)."""
    out = np.zeros(n, dtype=like.dtype)
    out[idx] = values
    return out


@scatter_values.torch
def _scatter_values_torch(idx, values, n, like):
    import torch

    out = torch.zeros(n, dtype=like.dtype, device=like.device)
    out[idx.long()] = values
    return out


# -- the algorithm -------------------------------------------------------------------

class DEFTParams(SparseParams):
    fill_remainder: bool = Field(True, description="give the k lost to int() truncation back to the highest-norm "
                                                   "fragments (public code; not in the paper's Alg. 3)")
    common_part: bool = Field(True, description="fragments whose k equals their size are sent whole by every "
                                                "worker, in no bin (public code; not in the paper's Alg. 4)")
    index_allgather: Literal["padded", "exact"] = Field(
        "padded", description="'padded': indices padded to the largest count (public code); 'exact': allgatherv")
    allgather: Literal["rd", "ring"] = Field("rd", description="allgather algorithm for counts and indices")


@register("deft")
class DEFT(Algorithm):
    __doc__ = __doc__
    Params = DEFTParams
    fragments = None

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """The plan's broadcast (P - 1), two allgathers (counts, indices:
        ``pof2 log2(pof2) + 2 (P - pof2)`` each for rd, ``P(P-1)`` for ring)
        and the allreduce of the values at the union, MPICH's choice on its
        full size: recursive doubling while 4 |union| <= 2048 bytes (float32
        assumed), Rabenseifner above. The union holds about k indices (every
        rank's local k on its own bin, plus the common part), taken as k:
        typical, exact unless |union| and k fall on opposite sides of 512,
        where it is off by ``pof2 log2(pof2)`` (the two allreduces' difference)."""
        return float(bcast_messages(P) + 2 * allgather_messages(P, params.allgather)
                     + auto_allreduce_messages(P, k))

    def run(self, ctx, x):
        P, r, prm = ctx.size, ctx.rank, self.params
        if self.fragments is None:
            if sum(self.setup.layer_sizes) != self.setup.n:
                raise ValueError(f"deft: the layer sizes sum to {sum(self.setup.layer_sizes)}, not n = {self.setup.n}")
            self.fragments = partition(self.setup.layer_sizes, P)
        frags = self.fragments
        sizes = [b - a for a, b in frags]
        self.cycle = c = self.iteration_no % P
        with ctx.phase("partition"):
            norms = yield ctx.compute("fragment_norms", x, [a for a, _ in frags] + [frags[-1][1]])
            ks = assign_k(norms, sizes, self.k, prm.fill_remainder)
            plan = None
            if r == c:
                bins, common = bin_pack(sizes, ks, P, prm.common_part)
                plan = Bundle((Scalars.of([len(b) for b in bins], "int32"),
                               Scalars.of([j for b in bins for j in b] + common, "int32")))
            plan = yield Bcast(plan, root=c)
            counts, ids = plan[0].tolist(), plan[1].tolist()
            start = sum(counts[:(c + r) % P])
            mine, common = ids[start:start + counts[(c + r) % P]], ids[sum(counts):]
        with ctx.phase("select"):
            parts = []
            for j in mine:
                a, b = frags[j]
                parts.append((yield ctx.compute("topk", x[a:b], ks[j])))
            idx = yield ctx.compute("fragment_indices", parts, [frags[j][0] for j in mine], like=x)
        self.selected = idx
        with ctx.phase("gather"):
            got = yield Allgather(Scalars.of([len(idx)], "int32"), prm.allgather)
            nsel = [int(s.values[0]) for s in got]
            if prm.index_allgather == "padded" and len(idx) < max(nsel):
                pad = yield ctx.compute("zeros", max(nsel) - len(idx), like=idx)
                idx = yield ctx.compute("concat", [idx, pad])
            blocks = yield Allgather(Dense(idx), prm.allgather)
            pieces = [blk.values[:m] for blk, m in zip(blocks, nsel)]
            if common:
                pieces.append((yield ctx.compute("index_ranges", [frags[j] for j in common], like=x)))
            union = yield ctx.compute("concat", pieces)
        with ctx.phase("allreduce"):
            vals = yield ctx.compute("gather_at", x, union)
            vals = yield from allreduce(ctx, vals)
        self.contributed = union
        with ctx.phase("combine"):
            return (yield ctx.compute("scatter_values", union, vals, self.setup.n, like=x))

    def check_state(self) -> dict:
        return {"cycle": self.cycle, "selected": host_indices(getattr(self, "selected", None))}

    @classmethod
    def reference(cls, inputs, setup, params, states):
        c, P = agreed_state(states, "cycle", "the DEFT decision worker"), setup.P
        frags = partition(setup.layer_sizes, P)
        sizes = [b - a for a, b in frags]
        bounds = [a for a, _ in frags] + [frags[-1][1]]
        ks = [assign_k(fragment_norms.numpy(g, bounds), sizes, setup.k, params.fill_remainder) for g in inputs]
        bins, common = bin_pack(sizes, ks[c], P, params.common_part)
        chosen = [np.arange(*frags[j]) for j in common]
        for r, (g, st) in enumerate(zip(inputs, states)):
            own = st.get("selected")  # the rank's own choice among ties at a fragment's k-th magnitude
            for j in bins[(c + r) % P]:
                a, b = frags[j]
                mine = None if own is None else own[(own >= a) & (own < b)] - a
                chosen.append(a + topk_choice(g[a:b], ks[r][j], mine))
        union = np.concatenate(chosen)
        if len(np.unique(union)) != len(union):
            raise AssertionError("DEFT fragments overlap: an index was selected twice")
        out = np.zeros(setup.n)
        for g in inputs:
            out[union] += g[union]
        return out
