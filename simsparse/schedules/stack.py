"""The software stack between a schedule and the wire, as mechanisms.

A paper's iteration time includes more than the algorithm's messages and
kernels: the framework and libraries its code ran on. Each mechanism here is
a section of a config's ``stack:`` key, absent ("none") by default, with its
constants cited in the config that sets it, and a place in the simulated
timeline of :meth:`~.base.Schedule.run`:

``host_staging`` (the Ok-Topk code: mpi4py on host numpy buffers, section 5;
its ``allreducer.py`` calls ``.cpu().numpy()`` before MPI and
``torch.from_numpy(...).cuda()`` after)
    Before a bucket's collective the device copies what the code hands to
    mpi4py to the host, after it copies what mpi4py gave back to the device:
    ``t = bytes / d2h_Bps`` and ``bytes / h2d_Bps`` (:func:`staged_bytes`;
    the bucket both ways for a dense collective, the local selection down
    and the gathered selections or the dense result up for TopkA and
    Gaussiank, the selection both ways for the others). With
    ``host_reduce_Bps`` a dense collective's reductions run in MPI on the
    host CPU: ``add_into`` moves 12 bytes per float32 element and the first
    ``copy`` 8, at that bandwidth; MPI receives the allgather phase in place
    (``copy_into`` free). Host work is charged to the rank's one device
    queue: exact where the code runs it in the optimizer step (BERT), a
    serialisation where a separate allreducer thread overlaps it with the
    backward pass (VGG-16, LSTM). Not modelled: the host-side numpy work of
    Gaussiank (scatter-add of the P gathered blocks) and gTopk (its
    reduction tree), and Ok-Topk's copies of its reduced region (4n/P bytes
    each way).
``horovod`` (OMGS-SGD section V.A: Horovod over NCCL; Horovod's docs,
``timeline.rst`` and ``tensor-fusion.rst``)
    Horovod's background thread looks for ready tensors once per cycle
    (``HOROVOD_CYCLE_TIME``), then negotiates them: every worker tells rank 0
    it is ready and rank 0 tells every worker to start (a gather and a
    broadcast, ``2 ceil(log2 P)`` control messages of ``negotiation_latency_s``).
    A bucket's collective therefore waits, without the device, for the next
    multiple of ``cycle_s`` and then for the negotiation before its messages
    go out (one negotiation covers the values and indices of one group,
    ready in the same cycle). Tensor fusion batches *allreduce* operations
    only (tensor-fusion.rst), so OMGS-SGD's allgathers are not fused; it is
    not modelled.
``optimizer`` (the step after the gradients are reduced; Ok-Topk section 5:
"sparse allreduce is conducted on the gradients and Adam optimizer is applied
afterwards")
    One device pass per tensor after every bucket has returned:
    ``t = kernels * launch_s + size * bytes_per_param / mem_bandwidth_Bps``
    with the kernel count and bytes of the optimizer's code (:data:`OPTIMIZERS`).
``unpack`` (gradient unpacking, the "demerge" of the Ok-Topk and OMGS code)
    After a bucket's collective its result is copied back into the tensors'
    own buffers: one device copy of the bucket (2 n w bytes). Packing
    (``concat`` before the collective) is always charged by the schedule.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..compute.kernels import Work, kernel

#: per tensor: (device kernels, bytes per float32 parameter) of one step,
#: counted from the optimizer's code
OPTIMIZERS = {
    # BertAdam.step of the Ok-Topk BERT code (BERT/bert/transformers/optimization.py, as in
    # pytorch-pretrained-bert): clip_grad_norm_(p, 1.0) per tensor (norm, stack, norm, add, div,
    # compare: 6 kernels, 1 read), then next_m.mul_.add_, next_v.mul_.addcmul_, sqrt, + e, m / (...),
    # weight_decay * p, update +=, lr * update, negate, p.add_: 12 kernels, 30 float accesses
    "adam": (18, 124),
    # torch.optim.SGD.step (PyTorch 1.x) with momentum and weight decay: d_p.add_(wd, p),
    # buf.mul_(m).add_(d_p), p.add_(-lr, buf): 4 kernels, 11 float accesses
    "sgd": (4, 44),
}


class HostStaging(BaseModel):
    model_config = ConfigDict(extra="forbid")
    d2h_Bps: float = Field(gt=0, le=1e15, description="device-to-host copy bandwidth (bytes/s)")
    h2d_Bps: float = Field(gt=0, le=1e15, description="host-to-device copy bandwidth (bytes/s)")
    host_reduce_Bps: float | None = Field(None, gt=0, le=1e15,
                                          description="memory traffic per second of MPI's reductions and copies of "
                                                      "a dense collective on the host CPU (none: on the device)")
    source: str | None = None


class Horovod(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cycle_s: float = Field(gt=0, le=1, description="HOROVOD_CYCLE_TIME: the background thread's period (s)")
    negotiation_latency_s: float = Field(ge=0, le=1, description="latency of one control message of the "
                                                                 "negotiation (MPI over the cluster's network)")
    source: str | None = None

    def negotiation_s(self, P: int) -> float:
        """A gather to rank 0 and a broadcast back: 2 ceil(log2 P) messages."""
        return 2 * math.ceil(math.log2(P)) * self.negotiation_latency_s if P > 1 else 0.0


class Optimizer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["adam", "sgd"] = Field(description="adam (BertAdam) or sgd (momentum, weight decay)")
    source: str | None = None


class Stack(BaseModel):
    """The ``stack:`` section of a config; every mechanism is off unless given."""

    model_config = ConfigDict(extra="forbid")
    host_staging: HostStaging | None = None
    horovod: Horovod | None = None
    optimizer: Optimizer | None = None
    unpack: bool = Field(False, description="copy each bucket's result back into the tensors' buffers")

    @property
    def active(self) -> bool:
        return (self.host_staging is not None or self.horovod is not None or self.optimizer is not None
                or self.unpack)

    def device_costs(self, profile: dict | None, n_tensors: int) -> dict | None:
        """A device profile (as a dict) with the costs of the stack's kernels:
        PCIe copies, host reductions, the optimizer's launches and bytes.
        The ideal device (None) stays ideal."""
        if profile is None:
            return None
        kernels = dict(profile.get("kernels") or {})
        hs = self.host_staging
        if hs is not None:
            kernels["d2h"] = {"per_elem_s": 1.0 / hs.d2h_Bps}
            kernels["h2d"] = {"per_elem_s": 1.0 / hs.h2d_Bps}
            if hs.host_reduce_Bps is not None:
                kernels["add_into"] = {"launch_s": 0.0, "per_elem_s": 12.0 / hs.host_reduce_Bps}
                kernels["copy"] = {"launch_s": 0.0, "per_elem_s": 8.0 / hs.host_reduce_Bps}
                kernels["copy_into"] = {"launch_s": 0.0, "per_elem_s": 0.0}
        if self.optimizer is not None:
            launches, bpp = OPTIMIZERS[self.optimizer.name]
            kernels["optimizer_step"] = {"launch_s": launches * n_tensors * profile.get("launch_s", 0.0),
                                         "per_elem_s": bpp / profile["mem_bandwidth_Bps"]}
        return {**profile, "kernels": kernels}

    # -- the timeline (generators run by Schedule.run) -----------------------------
    def collective(self, ctx, buf, alg):
        """A bucket's collective program with Horovod's cycle and negotiation,
        host staging and unpacking around it."""
        if self.horovod is not None:
            with ctx.phase("negotiate"):
                yield ctx.delay(self.horovod.negotiation_s(ctx.size), align=self.horovod.cycle_s)
        staged = staged_bytes(alg, buf) if self.host_staging is not None else None
        if staged:
            with ctx.phase("stage"):
                yield ctx.compute("d2h", staged[0])
        result = yield from alg.iteration(ctx, buf)
        if staged:
            with ctx.phase("stage"):
                yield ctx.compute("h2d", staged[1])
        if self.unpack:
            with ctx.phase("unpack"):
                yield ctx.compute("unpack", len(buf), buf.dtype.itemsize)
        return result

    def step(self, ctx, n: int):
        """The optimizer step over the model's n (carried) parameters."""
        if self.optimizer is not None:
            with ctx.phase("optimizer"):
                yield ctx.compute("optimizer_step", n)


def staged_bytes(alg, buf) -> tuple[int, int]:
    """(device-to-host, host-to-device) bytes of one bucket's collective in
    the Ok-Topk code (``BERT/bert/allreducer.py``): ``_dense_allreduce``
    copies the bucket both ways; TopkA copies its k values and indices down
    and the P gathered blocks up (``_sparse_allreduce``); Gaussiank sums the
    gathered blocks on the host and copies the dense result up; Ok-Topk,
    TopkDSA and gTopk copy their selection down and the selected result up."""
    nb = len(buf) * buf.dtype.itemsize
    if alg.dense:
        return nb, nb
    sel = 8 * alg.k
    if alg.name == "topka":
        return sel, sel * alg.P
    if alg.name == "gaussiank":
        return sel, nb
    return sel, sel


# -- the stack's kernels (no values: their cost is their bytes) ------------------------

@kernel("d2h", work=lambda out, nbytes: Work(nbytes, nbytes))
def d2h(nbytes):
    """A device-to-host copy of ``nbytes`` (host staging); costs bytes / d2h_Bps."""
    return None


@kernel("h2d", work=lambda out, nbytes: Work(nbytes, nbytes))
def h2d(nbytes):
    """A host-to-device copy of ``nbytes`` (host staging); costs bytes / h2d_Bps."""
    return None


@kernel("unpack", work=lambda out, n, itemsize: Work(n, 2 * n * itemsize))
def unpack(n, itemsize):
    """Copy a bucket's result of n elements back into its tensors (read + write)."""
    return None


@kernel("optimizer_step", work=lambda out, n: Work(n, 0))
def optimizer_step(n):
    """One optimizer step over n parameters; launches and bytes per parameter from :data:`OPTIMIZERS`."""
    return None
