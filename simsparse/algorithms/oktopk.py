"""Ok-Topk: the O(k) sparse allreduce (Li & Hoefler, PPoPP'22, sections 3 and 4).

Per iteration, on the error-compensated gradient x (Alg. 1; Alg. 2 is the
error feedback of :class:`~simsparse.algorithms.base.Algorithm`):

1. *Local top-k by threshold* (section 3.1.3): the exact k-th largest |x|
   every ``tau`` iterations (torch.topk, as the paper and code do), reused in
   between (:mod:`.oktopk_select`).
2. *Balanced region boundaries* (section 3.1.1): every ``tau_prime``
   iterations each rank picks the P-1 equal-count split points of its selected
   indices; an allreduce of them, divided by P, makes them consensual.
3. *Split and reduce* (section 3.1.1, Eq. 1): rank r owns region r and
   receives every other rank's selected entries there. Step i sends to
   (r+i) mod P and receives from (r-i) mod P (*destination rotation*, Fig. 2b;
   ``rotation: false`` is Fig. 2a, where at step i everyone sends to rank i);
   ``bucket_size`` steps are in flight at a time, and the local reduction of
   the previous bucket overlaps the current bucket's messages (``overlap``).
4. *Global top-k by threshold* on the reduced region (section 3.1.3): the
   reused global threshold, or every ``tau`` iterations the exact k-th largest
   magnitude over all regions (``global_exact``).
5. *Balance and allgatherv* (section 3.1.2, Eq. 2): an allgather of the
   packed buffer sizes; data balancing by point-to-point messages into P
   equal consecutive blocks when the largest buffer exceeds ``balance_trigger``
   times the mean (section 5.3); a recursive-doubling allgatherv.
6. The index intersection of the local selection and the global result is
   ``contributed`` (Alg. 1 line 14), zeroed in the residual by error feedback.

Result semantic: Top_k(sum_i Top_k(x_i)) with exact thresholds; with reused
thresholds the same construction with the thresholds used (``reference``).

Cost (alpha-beta, P a power of two, w-byte words, uniform coordinates):
split and reduce (P-1) alpha + 2k(P-1)/P w beta; sizes allgather log2(P) alpha
(4(P-1) bytes); balancing at most (P-1) alpha + 2k(P-1)/P w beta; allgatherv
log2(P) alpha + 2k(P-1)/P w beta; in all at most (2P + 2 log2 P) alpha +
6k(P-1)/P w beta (Eq. 3). Amortised extras: boundaries every ``tau_prime``
iterations, log2(P)(alpha + 8(P-1) beta); with ``global_exact: select`` every
``tau`` iterations ceil(31/b) log2(P)(alpha + 4 * 2^b beta), b = ``select_bits``.

Where the paper and the public code (Shigangli/Ok-Topk at 9763dcc) differ:

* data balancing: the paper balances when max > 4x mean; the code never
  balances for VGG/LSTM and always for BERT -- ``balance: auto|never|always``
  with ``balance_trigger`` (default: the paper);
* exact global threshold: the paper does not say how; the code allgathers
  every nonzero of every reduced region (``global_exact: gather``, up to
  2k(P-1) words in those iterations); the default ``select`` finds the same
  threshold by a radix select with latency-only messages, so Eq. 3 holds in
  every iteration;
* the code exchanges the P send counts by an Alltoall before the split
  (its receive buffers need them); our transport sizes receives by probing, as
  the paper's cost model assumes -- ``count_exchange: true`` adds it back;
* the code sends indices and values as two messages (tags 1 and 2); we send
  one COO message (same bytes, half the messages);
* the code selects |x| > thr and divides the result by P; we select |x| >= thr
  (so the exact k-th magnitude selects k values) and return the sum, like
  every simsparse algorithm; its dense warm-up (first 512/128 iterations
  dense) is a training schedule, not part of the allreduce, and is left out;
* the code takes split point i at position i*floor(m/P) of the m selected
  indices; a rank that selected fewer than P values proposes equal regions.
"""
from __future__ import annotations

import math

from bisect import bisect_left, bisect_right
from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import Field

from ..compute.kernels import Work, _isz, kernel
from ..compute.sparse_kernels import kth_abs
from ..ops import COO, Scalars
from .base import Algorithm, Sampling, SparseParams, alltoall_messages, rd_messages, register
from .collectives import Allgather, AllreduceHost, Alltoall, Reduce, count_blocks
from .oktopk_select import MAGNITUDE_BITS, ThresholdTuning, as_dtype, radix_select, rescale

TAG_SPLIT, TAG_COUNTS, TAG_BOUNDS, TAG_SELECT, TAG_SIZES, TAG_BALANCE, TAG_GATHER = range(11, 18)


@lru_cache(maxsize=8)
def equal_regions(n: int, P: int) -> np.ndarray:
    """The P + 1 boundaries of equal regions, one read-only array that every
    rank shares (P lists of P + 1 ints would be 0.6 GB at P = 4096)."""
    b = np.arange(P + 1, dtype=np.int64) * n // P   # (region i is [i n // P, (i + 1) n // P))
    b.setflags(write=False)
    return b


#: the balanced boundaries the ranks hold, by value: every rank computes the same ones from one
#: allreduce, so the simulator's P ranks share one read-only array (P arrays of P + 1 ints for each of
#: OMGS-SGD's 79 buckets of BERT were 0.66 GB at P = 1024)
_BOUNDS: dict = {}
_BOUNDS_MAX = 1024


def shared_bounds(bounds: np.ndarray) -> np.ndarray:
    """``bounds`` as the one read-only array of its value (:data:`_BOUNDS`)."""
    key = bounds.tobytes()
    got = _BOUNDS.get(key)
    if got is None:
        if len(_BOUNDS) >= _BOUNDS_MAX:
            _BOUNDS.clear()
        bounds.setflags(write=False)
        got = _BOUNDS[key] = bounds
    return got


class _Layout:
    """What balancing derives from the allgathered buffer sizes:
    ``total``, ``largest``, ``off`` (where each rank's buffer starts in the
    rank-ordered concatenation, P + 1 ints) and ``boff`` (the P + 1 bounds of
    the equal blocks, the remainder to the lowest ranks). The bulk allgather
    hands every rank the same tuple: this is built once for it, not P times
    (P^2 ints; at P = 4096 the offsets alone took 12 s)."""

    __slots__ = ("total", "largest", "off", "boff")

    def __init__(self, got):
        sizes = [int(s.values[0]) for s in got]
        P, total = len(sizes), sum(sizes)
        self.total, self.largest = total, max(sizes, default=0)
        self.off = [0, *np.cumsum(sizes, dtype=np.int64).tolist()]
        want = np.full(P, total // P, dtype=np.int64)
        want[:total % P] += 1
        self.boff = [0, *np.cumsum(want).tolist()]


_last_layout: list = [None, None]


def _layout(got) -> _Layout:
    """The :class:`_Layout` of an allgather's result (shared, read-only)."""
    if got is not _last_layout[0]:
        _last_layout[:] = [got, _Layout(got)]
    return _last_layout[1]


class OkTopkParams(SparseParams, ThresholdTuning):
    tau: int = Field(32, ge=1, description="exact local and global thresholds every tau iterations, reused in between "
                                           "(code: 32 VGG/LSTM, 128 BERT)")
    tau_prime: int = Field(64, ge=1, description="region boundaries re-evaluated every tau_prime iterations (paper: 64)")
    threshold_reuse: bool = Field(True, description="false: exact thresholds in every iteration")
    balanced_boundaries: bool = Field(True, description="false: P equal regions")
    rotation: bool = Field(True, description="destination rotation in split and reduce; false: at step i all send to rank i")
    bucket_size: int = Field(4, ge=1, description="steps in flight in split and reduce (code: throttle = min(4, P))")
    overlap: bool = Field(True, description="reduce the previous bucket while the current one is in flight")
    count_exchange: bool = Field(False, description="Alltoall of the send counts before the split, as the code does")
    balance: Literal["auto", "always", "never"] = Field(
        "auto", description="data balancing before the allgatherv: auto = when the largest buffer exceeds "
                            "balance_trigger x the mean (paper); never (code, VGG/LSTM); always (code, BERT)")
    balance_trigger: float = Field(4.0, ge=1, description="the auto balancing trigger (paper section 5.3: 4)")
    global_exact: Literal["select", "gather"] = Field(
        "select", description="exact global threshold by a distributed radix select (latency only) or by the code's "
                              "allgatherv of every reduced nonzero")
    select_bits: int = Field(4, ge=1, le=16, description="bits per radix-select round (histogram of 2^bits counts)")


def _region_add_work(out, buf, parts, offset):
    nnz = sum(p.nnz for p in parts)
    return Work(nnz, sum(p.nbytes for p in parts) + 2 * nnz * _isz(buf))


@kernel("scatter_add_region", work=_region_add_work)
def scatter_add_region(buf, parts, offset):
    """In place: buf[idx - offset] += val for every COO part (indices unique
    within a part); ``buf`` is the dense region starting at global ``offset``."""
    for p in parts:
        buf[p.indices - offset] += p.values
    return buf


@scatter_add_region.torch
def _scatter_add_region_torch(buf, parts, offset):
    for p in parts:
        buf.index_add_(0, p.indices.long() - offset, p.values)
    return buf


class OkTopkSampling(Sampling):
    """Ok-Topk's thresholds select about k: a reused one is raised while it
    selects more than local_raise_above (4/3) k and adapts to select 2/3 k to
    5/4 k (:mod:`.oktopk_select`); ``margin`` is the most it draws (small k)."""

    def margin_for(self, k: float) -> float:
        """A reused local threshold is raised while it selects more than
        ``local_raise_above`` (4/3) k; on a new gradient its count moves by
        about sqrt(k) (a binomial count), and so does the floor's. The floor
        is kept eight standard deviations beyond 4/3 k, at most 2 k: 1.36 k at
        BERT's k = 133 k (data_scale 0.1), 1.41 k at 10 k, 1.51 k at 2,000, 2 k
        up to k = 144 (at BERT's k, 2 k had been 23 standard deviations more
        than 4/3 k needs, and drawing was half of a run)."""
        return min(self.margin, 4 / 3 + 8 / math.sqrt(max(k, 1.0)))

    def floors_learnt(self, params) -> bool:
        """Under error feedback the residual widens the accumulated vector
        from one iteration to the next, so a reused threshold selects several
        times k (3.5 k in the paper's BERT config): under a floor set for k."""
        return params.error_feedback and params.threshold_reuse


@register("oktopk")
class OkTopk(Algorithm):
    __doc__ = __doc__
    Params = OkTopkParams
    sampling = OkTopkSampling(margin=2.0, result="dense")

    def __init__(self, setup, params=None):
        super().__init__(setup, params)
        self.local_thr = None    # local threshold kept for the next iteration
        self.global_thr = None   # global threshold kept for the next iteration
        self.bounds = None       # region boundaries [0, b_1, ..., b_{P-1}, n]
        self.used = {}           # what this iteration used (check_state)

    @classmethod
    def periodic_work(cls, params):
        """Exact local and global thresholds every ``tau`` iterations (every
        one without ``threshold_reuse``), balanced boundaries every
        ``tau_prime`` (never with ``balanced_boundaries: false``)."""
        work = {"exact_thresholds": params.tau if params.threshold_reuse else 1}
        if params.balanced_boundaries:
            work["boundaries"] = params.tau_prime
        return work

    @classmethod
    def messages(cls, P, n, k, params) -> float:
        """An ordinary iteration's messages: one in which no periodic task is
        due but those due in every iteration (``tau = 1`` or no
        ``threshold_reuse``: exact thresholds; ``tau_prime = 1``: boundaries).
        :meth:`messages_in` counts any kind; the row's ``msgs_total`` is the
        mean over a period (:mod:`simsparse.period`)."""
        every = frozenset(t for t, period in cls.periodic_work(params).items() if period == 1)
        return cls.messages_in(P, n, k, params, every)

    @classmethod
    def messages_in(cls, P, n, k, params, due=frozenset()) -> float:
        """Messages of an iteration in which the periodic tasks ``due`` run
        (``exact_thresholds``, ``boundaries``; :meth:`periodic_work`), all ranks together.

        * every iteration: the counts alltoall (``count_exchange``: P(P-1)),
          the split and reduce (P(P-1), rotated or not: every part is sent,
          empty or not), the sizes allgather and the allgatherv (recursive
          doubling, ``pof2 log2(pof2) + 2 (P - pof2)`` each);
        * balancing: 0 when it is not triggered (``never``; ``auto`` with
          buffers within ``balance_trigger`` x the mean, as uniform
          coordinates give: typical, not a bound); ``always``: 2(P-1), an
          upper bound (the cuts of two partitions of one range into P
          intervals make at most 2P-1 pieces, one on the diagonal at least);
          ``auto`` when triggered sends up to 2(P-1) more than counted here;
        * ``boundaries``: one recursive-doubling allreduce;
        * ``exact_thresholds``: ``select``: ceil(31 / select_bits) allreduces
          (float32 magnitudes; a single one if no rank holds a nonzero), then
          as every iteration; ``gather``: the sizes allgather and the
          allgather of the nonzeros, no balancing and no allgatherv.
        """
        if P <= 1:
            return 0.0
        rd = rd_messages(P)
        out = alltoall_messages(P) * (2 if params.count_exchange else 1)
        if "boundaries" in due and params.balanced_boundaries:
            out += rd
        balance = 2 * (P - 1) if params.balance == "always" else 0
        if "exact_thresholds" in due and params.global_exact == "gather":
            return float(out + 2 * rd)
        if "exact_thresholds" in due:
            out += -(-MAGNITUDE_BITS["float32"] // params.select_bits) * rd
        return float(out + 2 * rd + balance)

    def run(self, ctx, x):
        p, k = self.params, self.k
        exact = self.due("exact_thresholds")
        with ctx.phase("local_select"):
            thr = yield from self._local_threshold(ctx, x, exact)
            sel = yield ctx.compute("threshold_select", x, thr)
        del x   # (nothing below reads the gradient: at P = 4096 the ranks' sampled ones are 0.7 GB)
        self.local_thr = as_dtype(rescale(thr, sel.nnz, k, p.local_low, p.local_high, p.local_scale, p.local_scale),
                                  self.setup.dtype)
        if not p.balanced_boundaries:
            bounds = equal_regions(self.setup.n, ctx.size)
        else:
            if self.bounds is None or self.due("boundaries"):
                with ctx.phase("boundaries"):
                    self.bounds = yield from self._balanced_bounds(ctx, sel)
            bounds = self.bounds
        with ctx.phase("split_reduce"):
            reduced = yield from self._split_reduce(ctx, sel, bounds)
        result, gthr = yield from self._global_topk(ctx, reduced, int(bounds[ctx.rank]), exact)
        self.global_thr = gthr if exact else as_dtype(
            rescale(gthr, result.nnz, k, p.global_low, p.global_high, p.global_scale_low, p.global_scale_high),
            self.setup.dtype)
        self.used = {"local_thr": thr, "local_exact": exact, "local_nnz": sel.nnz,
                     "global_thr": gthr, "global_exact": exact, "global_nnz": result.nnz}
        with ctx.phase("intersect"):
            self.contributed = yield ctx.compute("intersect", sel.indices, result.indices)
        return result

    # -- phases ---------------------------------------------------------------
    def _local_threshold(self, ctx, x, exact):
        """Exact (torch.topk and its smallest magnitude, code: ratio2threshold)
        or the reused one raised while it selects too many (code: add2residual)."""
        p, k = self.params, self.k
        if exact:
            top = yield ctx.compute("topk", x, k)
            return (yield ctx.compute("kth_abs", top.values, k))
        thr = self.local_thr
        for _ in range(p.local_raise_max):
            if (yield ctx.compute("count_above", x, thr)) <= p.local_raise_above * k:
                break
            thr = as_dtype(thr * p.local_raise, self.setup.dtype)
        return thr

    def _balanced_bounds(self, ctx, sel):
        """P-1 equal-count split points of the selected indices, averaged over
        ranks: the P + 1 boundaries, an int64 array."""
        P, n = ctx.size, self.setup.n
        if P == 1:
            return equal_regions(n, 1)
        m = sel.nnz
        if m >= P:
            step = m // P
            pts = np.asarray(sel.indices[step:step * P:step].tolist(), dtype=np.int64)
        else:
            pts = equal_regions(n, P)[1:-1]   # (read-only, shared: the allreduce only reads it)
        total = yield AllreduceHost(pts, "sum", TAG_BOUNDS)
        bounds = np.empty(P + 1, dtype=np.int64)
        bounds[0], bounds[1:-1], bounds[-1] = 0, np.asarray(total) // P, n
        return shared_bounds(bounds)

    def _split_reduce(self, ctx, sel, bounds):
        """Send each region's entries to its owner, bucketed; reduce into a dense region."""
        p, P, r = self.params, ctx.size, ctx.rank
        parts = yield ctx.compute("coo_split", sel, bounds)
        if p.count_exchange and P > 1:
            with ctx.phase("counts"):
                yield Alltoall(count_blocks(parts), TAG_COUNTS)
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        buf = yield ctx.compute("zeros", hi - lo, sel.values)   # (like the gradient: its dtype and device)
        red = Reduce("scatter_add_region", buf, (lo,), overlap=p.overlap)
        return (yield Alltoall(parts, TAG_SPLIT, p.rotation, p.bucket_size, red))

    def _global_topk(self, ctx, reduced, offset, exact):
        """Select the reduced region's entries at or above the global
        threshold (reused, or exact by radix select), then balance and
        allgatherv; or the code's exact path (``gather``). Returns (result, threshold)."""
        p = self.params
        with ctx.phase("global_select"):
            nz = yield ctx.compute("sparsify", reduced, offset, self.setup.n)
            if exact and p.global_exact == "gather":
                return (yield from self._gather_exact(ctx, nz))
            if exact:
                gthr = yield from radix_select(ctx, nz.values, self.k, self.setup.dtype, p.select_bits, TAG_SELECT)
            else:
                gthr = self.global_thr
            mine = yield ctx.compute("coo_threshold", nz, gthr)
        return (yield from self._balance_allgatherv(ctx, mine)), gthr

    def _gather_exact(self, ctx, nz):
        """The code's exact global threshold: allgatherv every reduced nonzero,
        then the k-th largest magnitude of them all."""
        layout = yield from self._sizes(ctx, nz)
        with ctx.phase("gather_nonzeros"):
            blocks = yield Allgather(nz, "rd", TAG_GATHER)
        every = yield ctx.compute("coo_concat", blocks, self.setup.n)
        if layout.total == 0:
            return every, 0.0
        gthr = yield ctx.compute("kth_abs", every.values, self.k)
        return (yield ctx.compute("coo_threshold", every, gthr)), gthr

    def _sizes(self, ctx, block):
        with ctx.phase("sizes"):
            got = yield Allgather(Scalars.of([block.nnz], "int32"), "rd", TAG_SIZES)
        return _layout(got)

    def _balance_allgatherv(self, ctx, mine):
        """Sizes allgather, data balancing when triggered, recursive-doubling allgatherv."""
        p, P = self.params, ctx.size
        layout = yield from self._sizes(ctx, mine)
        total = layout.total
        if P > 1 and total > 0 and (p.balance == "always" or
                                    (p.balance == "auto" and layout.largest > p.balance_trigger * total / P)):
            with ctx.phase("balance"):
                mine = yield from self._balance(ctx, mine, layout)
        with ctx.phase("allgatherv"):
            blocks = yield Allgather(mine, "rd", TAG_GATHER)
            return (yield ctx.compute("coo_concat", blocks, self.setup.n))

    def _balance(self, ctx, mine, layout):
        """Cut the rank-ordered concatenation of all buffers into P consecutive
        blocks of equal size (remainder to the lowest ranks); every rank sends
        the slices of its buffer that fall into other ranks' blocks."""
        P, r, n = ctx.size, ctx.rank, self.setup.n
        off, boff = layout.off, layout.boff

        def overlap(i, j):  # part of rank i's buffer that belongs in block j
            return max(off[i], boff[j]), min(off[i + 1], boff[j + 1])

        # the blocks this buffer meets and the buffers this block meets (only those can overlap)
        lo, hi = bisect_right(boff, off[r]) - 1, bisect_left(boff, off[r + 1])
        lo2, hi2 = bisect_right(off, boff[r]) - 1, bisect_left(off, boff[r + 1])
        sends, recvs, srcs = [], [], []
        for j in sorted(set(range(max(lo, 0), min(hi, P))) | set(range(max(lo2, 0), min(hi2, P)))):
            if j == r:
                continue
            a, b = overlap(r, j)
            if b > a:
                sends.append(ctx.isend(j, COO(mine.indices[a - off[r]:b - off[r]], mine.values[a - off[r]:b - off[r]], n),
                                       TAG_BALANCE))
            a, b = overlap(j, r)
            if b > a:
                recvs.append(ctx.irecv(j, TAG_BALANCE))
                srcs.append(j)
        got = (yield ctx.waitall(recvs + sends))[:len(recvs)]
        a, b = overlap(r, r)
        a, b = a - off[r], max(a, b) - off[r]
        pieces = dict(zip(srcs, got))
        pieces[r] = COO(mine.indices[a:b], mine.values[a:b], n)
        return (yield ctx.compute("coo_concat", [pieces[i] for i in sorted(pieces)], n))

    # -- checking -----------------------------------------------------------
    def check_state(self) -> dict:
        return dict(self.used)

    @classmethod
    def reference(cls, inputs, setup, params, states):
        """Top_k(sum_i Top_k(x_i)) by thresholds: exact ones computed here
        from the inputs, reused ones as the ranks report them."""
        k = setup.k
        total = np.zeros(setup.n)
        for x, st in zip(inputs, states):
            thr = kth_abs.numpy(x, k) if st["local_exact"] else st["local_thr"]
            keep = np.abs(x) >= np.asarray(thr, dtype=x.dtype)
            total[keep] += x[keep]
        if states[0]["global_exact"]:
            nz = np.abs(total[total != 0])
            gthr = kth_abs.numpy(nz, k) if len(nz) else 0.0
        else:
            used = {st["global_thr"] for st in states}
            if len(used) != 1:  # ranks must agree on the global threshold
                return np.full(setup.n, np.nan)
            gthr = used.pop()
        return np.where((np.abs(total) >= gthr) & (total != 0), total, 0.0)
