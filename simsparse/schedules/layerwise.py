"""The layer-wise schedules of the OMGS-SGD and Ok-Topk papers.

Each is the common main program of :class:`~.base.Schedule` with its own
merge plan and kind of collective. Costs (alpha-beta, with ``t_b`` the
backward time of a group's tensors, ``t_s`` its sparsification and ``t_c``
its communication; OMGS-SGD paper, Shi et al. INFOCOM'20, section II):

=============  ==========  =============================================================
schedule       collective  iteration time
=============  ==========  =============================================================
whole          dense       t_f + t_b + t_c(d): backward, then one allreduce (Ok-Topk's Dense)
wfbp           dense       one allreduce per tensor as soon as it is ready (Eqs. 5-9, t_s = 0)
mg_wfbp        dense       WFBP with MG-WFBP's optimal merging (Shi, Chu, Li, INFOCOM'19)
dense_ovlp     dense       buckets of ``bucket_mb`` fired when full (Ok-Topk section 5, DenseOvlp)
topk_sgd       compressed  t_f + t_b + t_s(d) + t_c(d) (Eq. 4): one global sparsification
lags_sgd       compressed  layer-wise sparsification and communication (Eqs. 5-9)
mgs_sgd        compressed  LAGS with tensors merged up to ``threshold`` elements (Table V)
omgs_sgd       compressed  LAGS with OMGS's merging (Algorithm 1, Theorem 1)
=============  ==========  =============================================================

"Compressed" accepts every sparse or quantized allreduce of the family (TopkA
as in the paper's code, but also Ok-Topk, gTopk, Gaussiank, ...), each
keeping its state per bucket.

Each names the collective of its paper as ``default_algorithm``, what a
training config without ``algorithms`` runs: TopkA (the allgather of the
OMGS-SGD code) for the compressed ones; for Dense and DenseOvlp the MPI
allreduce of the Ok-Topk runs (Cray-MPICH: Rabenseifner for long messages),
for WFBP and MG-WFBP the ring allreduce of MG-WFBP's cost model.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from . import planner
from .base import PlanCosts, Schedule, register_schedule


class _Planned(BaseModel):
    model_config = ConfigDict(extra="forbid")
    planner: Literal["paper", "optimal"] = Field(
        "paper", description="paper: the paper's merge rule; optimal: the exact minimum of the same cost model "
                             "(dynamic programming, equal to a brute-force search)")


class _Threshold(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: int = Field(8192, ge=1, le=2**31 - 1,
                           description="merge consecutive tensors until a group holds at least this many elements")


class _Bucketed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bucket_mb: float = Field(25.0, gt=0, le=1e6, description="bucket capacity in MiB of float32 gradients")


@register_schedule("whole")
class Whole(Schedule):
    """P-SGD without pipelining: the whole backward pass, then one dense
    allreduce of all gradients (the Ok-Topk paper's "Dense", section 5)."""

    accepts = "dense"
    default_algorithm = "rabenseifner"

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return (len(costs.sizes),)

    @classmethod
    def buckets(cls, params, sizes):
        return 1


@register_schedule("wfbp")
class WFBP(Schedule):
    """Wait-free backpropagation (Poseidon, Zhang et al. ATC'17; S-Caffe,
    Awan et al. PPoPP'17; OMGS paper section II.B): each tensor's dense
    allreduce starts as soon as its gradient is ready, one after another on
    the communication stream."""

    accepts = "dense"
    default_algorithm = "ring"

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return (1,) * len(costs.sizes)


@register_schedule("mg_wfbp")
class MGWFBP(Schedule):
    """MG-WFBP (Shi, Chu and Li, INFOCOM'19, section IV): WFBP with merged
    gradients. A tensor is merged into the next one (in backward order) when
    that one's gradient is ready before the communication of the first could
    start plus the startup time alpha -- merging then saves alpha without
    delaying anything (the rule of the public code's
    ``_generate_groups_mgwfbp``; with t_c = alpha + beta d it is OMGS's rule
    with t_s = 0). The plan uses the bucket collective's fitted alpha-beta
    model and the model's per-tensor backward times. The rule is greedy: on
    random small models it misses the optimum of its own cost model in ~15 %
    of cases (tests/schedules/test_merge_planner.py); ``planner: optimal`` takes the exact
    minimum."""

    accepts = "dense"
    default_algorithm = "ring"
    Params = _Planned

    @classmethod
    def needs_costs(cls):
        return True

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        if params.planner == "optimal":
            return planner.optimal_plan(costs.tb, costs.sizes, lambda d: 0.0, costs.tc, costs.tf)
        return planner.mgwfbp_plan(costs.tb, costs.sizes, costs.tc, costs.alpha)


@register_schedule("dense_ovlp")
class DenseOvlp(Schedule):
    """Ok-Topk's DenseOvlp (section 5): gradients are grouped into buckets in
    backward order and a bucket's dense allreduce fires as soon as it is full.
    The paper does not give the bucket size; ``bucket_mb`` defaults to
    PyTorch DDP's ``bucket_cap_mb`` (25 MiB)."""

    accepts = "dense"
    default_algorithm = "rabenseifner"
    Params = _Bucketed

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return planner.threshold_plan(costs.sizes, max(1, int(params.bucket_mb * 2**20 / 4)))

    @classmethod
    def buckets(cls, params, sizes):
        return len(planner.threshold_plan(sizes, max(1, int(params.bucket_mb * 2**20 / 4))))


class _DDPBuckets(_Bucketed):
    first_bucket_mb: float = Field(1.0, gt=0, le=1e6, description="the first bucket's capacity in MiB "
                                   "(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: 1 MiB)")


@register_schedule("ddp")
class DDP(DenseOvlp):
    """PyTorch DistributedDataParallel: DenseOvlp's buckets as DDP's reducer
    forms them (``compute_bucket_assignment_by_size``): in backward order, the
    first bucket closes at 1 MiB (``first_bucket_mb``), the others at
    ``bucket_cap_mb`` (``bucket_mb``, 25 MiB), each as soon as its gradients
    reach the capacity; a bucket's allreduce fires when its last gradient is
    ready. Source: Li et al., "PyTorch Distributed: Experiences on
    Accelerating Data Parallel Training", VLDB 2020, section 3.2 (gradient
    bucketing, overlap with the backward pass); the limits from
    torch/nn/parallel/distributed.py and reducer.cpp (PyTorch 2.x). The
    buckets rebuilt after the first iteration follow the order gradients
    become ready, which is the backward order here."""

    Params = _DDPBuckets
    default_algorithm = "ring"   # NCCL's ring allreduce, what DDP runs on GPUs

    @staticmethod
    def _limits(params) -> dict:
        return {"threshold": max(1, int(params.bucket_mb * 2**20 / 4)),
                "first": max(1, int(params.first_bucket_mb * 2**20 / 4))}

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return planner.threshold_plan(costs.sizes, **cls._limits(params))

    @classmethod
    def buckets(cls, params, sizes):
        return len(planner.threshold_plan(sizes, **cls._limits(params)))


@register_schedule("topk_sgd")
class TopkSGD(Schedule):
    """TopK-SGD (Lin et al. ICLR'18, Aji and Heafield; OMGS paper section
    II.C, Eq. 4): after the whole backward pass, one sparsification of all
    gradients and one sparse allreduce; no overlap."""

    accepts = "compressed"
    default_algorithm = "topka"

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return (len(costs.sizes),)

    @classmethod
    def buckets(cls, params, sizes):
        return 1


@register_schedule("lags_sgd")
class LAGSSGD(Schedule):
    """LAGS-SGD (Shi et al. ECAI'20; OMGS paper section II.D, Eqs. 5-9):
    layer-wise sparsification -- each tensor is sparsified as soon as its
    gradient is ready and communicated while the backward pass goes on."""

    accepts = "compressed"
    default_algorithm = "topka"

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return (1,) * len(costs.sizes)


@register_schedule("mgs_sgd")
class MGSSGD(Schedule):
    """MGS-SGD (OMGS paper section I and V.D): LAGS-SGD with consecutive
    tensors merged until a group holds ``threshold`` elements (8,192 in the
    paper and in its code's ``_generate_groups_with_threshold``; Table V)."""

    accepts = "compressed"
    default_algorithm = "topka"
    Params = _Threshold

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        return planner.threshold_plan(costs.sizes, params.threshold)


@register_schedule("omgs_sgd")
class OMGSSGD(Schedule):
    """OMGS-SGD (OMGS paper section IV, Algorithm 1 FindMergedLayers and
    Algorithm 2): merges tensor l into l-1 when Q3 and Q5 hold, i.e. when
    merging shortens the completion of l-1's communication under the top-k
    model t_s = gamma rho d log d (Eq. 10; here the device's top-k cost) and
    the allgather model t_c = alpha + beta d (Eq. 11; here the bucket
    collective's alpha-beta fit on the simulated network). Algorithm 1 is a
    greedy scan: Theorem 1's proof only excludes flipping one layer, and on
    random small models it misses the optimum of its own model in ~35 % of
    cases (tests/schedules/test_merge_planner.py has a 3-layer counterexample);
    ``planner: optimal`` takes the exact minimum of the same model."""

    accepts = "compressed"
    default_algorithm = "topka"
    Params = _Planned

    @classmethod
    def needs_costs(cls):
        return True

    @classmethod
    def plan(cls, params, costs: PlanCosts):
        if params.planner == "optimal":
            return planner.optimal_plan(costs.tb, costs.sizes, costs.ts, costs.tc, costs.tf)
        return planner.omgs_plan(costs.tb, costs.sizes, costs.ts, costs.tc, costs.alpha)
