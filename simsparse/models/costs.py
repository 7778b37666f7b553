"""Per-tensor work of one forward and backward pass of any ``torch.nn.Module``,
counted on the ``meta`` device (shapes only: no memory, no arithmetic).

:class:`CostMode` sees every aten op of both passes and charges its FLOPs
(``torch.utils.flop_counter``'s formulas; convolution backward exact), the
bytes of its inputs and outputs (parameters and final gradients excluded:
the simulator adds 4 bytes a parameter in forward and 8 in backward) and one
launch to the parameter tensor whose gradient it precedes: forward work to
the module that runs it (parameter-free ops to the last parameterised module
before them), backward work through the autograd node's sequence number.
With ``amp`` it counts a pass under bf16 autocast (:class:`Autocast`): each
cast of an activation is an op with its bytes; a weight's cast, and the cast
of its gradient back to fp32, are a parameter's bytes, which the roofline
adds (:func:`simsparse.compute.models.model_profile`).
:func:`count` runs it for any model; :func:`entry` turns two batch sizes into
the per-sample table that :mod:`simsparse.compute.models` times by a device's
roofline. ``scripts/build_model_costs.py`` builds the packaged models' table
with it; ``simsparse model import`` any other model's.
"""
from __future__ import annotations

import bisect
import contextlib
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten

#: per tensor and pass: matrix-op FLOPs, bytes read and written, aten ops, the bytes of matrix ops
FIELDS = ("fwd_flops", "fwd_bytes", "fwd_ops", "fwd_mm_bytes", "bwd_flops", "bwd_bytes", "bwd_ops", "bwd_mm_bytes")
OPS = {"fwd_ops", "bwd_ops"}
_FREE = {aten.detach, aten.alias, aten._unsafe_view, aten.lift_fresh, aten.empty, aten.empty_like, aten.empty_strided,
         aten.new_empty, aten.new_empty_strided, aten._reshape_alias}


def _conv_backward_flops(grad_out, x, w, *args, **kwargs) -> int:
    """Exact FLOPs of ``aten.convolution_backward``: each requested gradient (input, weight) costs one forward.

    (torch's formula multiplies the grad-weight term by ``groups`` for grouped convolutions.)
    """
    transposed, mask = args[4], args[7]
    macs = (x.numel() if transposed else grad_out.numel()) * math.prod(w.shape[1:])
    return 2 * macs * (int(mask[0]) + int(mask[1]))


def _flops(func, args, kwargs, out) -> int:
    if func.overloadpacket is aten.convolution_backward:
        return _conv_backward_flops(*args, **kwargs)
    if func.overloadpacket in flop_registry:
        return int(flop_registry[func.overloadpacket](*args, **kwargs, out_val=out))
    return 0


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (broadcast dimensions count once)."""
    n = math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0) if t.dim() else 1
    return n * t.element_size()


class CostMode(TorchDispatchMode):
    """Charges every aten op's FLOPs, bytes and count to a parameter tensor (see the module docstring)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        params = list(model.parameters())
        self.n = len(params)
        self.rows = [[0] * len(FIELDS) for _ in params]
        self.param_storages = {_storage(p) for p in params}
        self.param_index = {id(p): i for i, p in enumerate(params)}
        self.seqs: list[int] = []     # autograd sequence number at each parameterised module's entry ...
        self.owners: list[int] = []   # ... and that module's first tensor
        self.owner: int | None = None
        self.pending: list[tuple] = []
        self.phase = "fwd"
        self.kept: list = []
        #: storage -> (owner, bytes, a matrix op's, the cast's source) of its latest bwd producer
        self.last_output: dict[int, tuple] = {}
        self.handles = []
        for m in model.modules():
            own = list(m.parameters(recurse=False))
            if own:
                self.handles.append(m.register_forward_pre_hook(self._enter(self.param_index[id(own[0])])))
        for p in params:
            if p.requires_grad:
                self.handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def _enter(self, idx: int):
        def hook(module, args):
            self.seqs.append(torch._C._autograd._get_sequence_nr())
            self.owners.append(idx)
            self.owner = idx
            for rec in self.pending:
                self._charge(idx, *rec)
            self.pending.clear()
        return hook

    def _grad_ready(self, p):
        """The tensor written into ``p.grad`` is a gradient, not an activation: take its bytes back
        (under autocast also the bf16 gradient it was cast from: its write and the cast's read)."""
        hit = self.last_output.pop(_storage(p.grad), None)
        while hit is not None:
            owner, nbytes, mm, src = hit
            self.rows[owner][FIELDS.index("bwd_bytes")] -= nbytes
            if mm:
                self.rows[owner][FIELDS.index("bwd_mm_bytes")] -= nbytes
            hit = None
            if src is not None:
                self.rows[owner][FIELDS.index("bwd_bytes")] -= src[1]
                hit = self.last_output.pop(src[0], None)

    def _bwd_owner(self) -> int:
        node = torch._C._current_autograd_node()
        if node is None:
            return self.owners[-1]
        var = getattr(node, "variable", None)
        if var is not None and id(var) in self.param_index:
            return self.param_index[id(var)]
        k = bisect.bisect_right(self.seqs, node._sequence_nr()) - 1
        return self.owners[max(k, 0)]

    def _charge(self, owner: int, flops: int, nbytes: int, phase: str):
        base = 0 if phase == "fwd" else 4
        row = self.rows[owner]
        row[base] += flops
        row[base + 1] += nbytes
        row[base + 2] += 1
        if flops:  # a matrix op (conv, matmul): its bytes are the *_mm_bytes part (compute-bound on a GPU)
            row[base + 3] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func.overloadpacket in _FREE:
            return out
        if func.overloadpacket is aten._to_copy and _storage(args[0]) in self.param_storages:
            self.param_storages.add(_storage(out))   # autocast's copy of a weight: a parameter's bytes
            self.kept.append(out)   # (alive till the count ends: no activation reuses its storage's address)
            return out
        flops = _flops(func, args, kwargs, out)
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        nbytes = sum(_nbytes(t) for t in ins + outs if _storage(t) not in self.param_storages)
        if self.phase == "fwd":
            if self.owner is None:
                self.pending.append((flops, nbytes, "fwd"))
            else:
                self._charge(self.owner, flops, nbytes, "fwd")
        else:
            owner = self._bwd_owner()
            self._charge(owner, flops, nbytes, "bwd")
            src = (_storage(ins[0]), _nbytes(ins[0])) if func.overloadpacket is aten._to_copy and ins else None
            for t in outs:
                self.last_output[_storage(t)] = (owner, _nbytes(t), flops > 0, src)
        return out

    def close(self):
        for h in self.handles:
            h.remove()


#: the functions bf16 autocast runs in bf16 (torch's CUDA autocast lists: matrix products, convolutions,
#: attention) and in fp32 (normalisation, softmax, losses, the exponentials)
AMP_BF16 = {F.linear, F.bilinear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
            F.conv_transpose3d, F.scaled_dot_product_attention, F.prelu, torch.matmul, torch.mm, torch.bmm,
            torch.addmm, torch.baddbmm, torch.addbmm, torch.einsum, torch.Tensor.matmul, torch.Tensor.__matmul__,
            torch.Tensor.mm, torch.Tensor.bmm}
AMP_FP32 = {F.softmax, F.log_softmax, F.layer_norm, F.group_norm, F.batch_norm, F.rms_norm, F.cross_entropy,
            F.nll_loss, F.mse_loss, F.binary_cross_entropy_with_logits, F.softplus, torch.exp, torch.log, torch.pow,
            torch.rsqrt, torch.cumsum, torch.logsumexp, torch.norm, torch.Tensor.softmax, torch.Tensor.log_softmax,
            torch.Tensor.exp, torch.Tensor.log, torch.Tensor.pow, torch.Tensor.rsqrt, torch.Tensor.logsumexp}


class Autocast(torch.overrides.TorchFunctionMode):
    """bf16 autocast, which does nothing on meta tensors, done by hand above autograd (where
    autocast sits): the floating inputs of :data:`AMP_BF16` functions cast to bf16, of
    :data:`AMP_FP32` ones to fp32, any other function on its inputs' dtypes. The casts are
    ``aten._to_copy`` ops that :class:`CostMode` charges, and autograd records as autocast's
    are (their backward casts the gradients back)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = torch.bfloat16 if func in AMP_BF16 else torch.float32 if func in AMP_FP32 else None
        if dtype is not None:
            def cast(t):
                return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype \
                    else t
            args, kwargs = tree_map(cast, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def fused_dropout():
    """Route ``F.dropout`` in training to ``torch.native_dropout``, the one-kernel dropout torch uses on CUDA.

    (On the CPU and meta devices ``F.dropout`` decomposes into bernoulli_, div_ and mul.)
    """
    plain = F.dropout

    def dropout(x, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0:
            return torch.native_dropout(x, p, True)[0]
        return plain(x, p, training, inplace)

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = plain


def count(build: Callable[[], torch.nn.Module], batch: Callable[[int], object],
          loss: Callable[[torch.nn.Module, object], torch.Tensor], batch_size: int,
          amp: bool = False) -> tuple[list[int], list[list[int]]]:
    """(sizes, rows): each parameter tensor's elements and its :data:`FIELDS` for one forward
    and backward at ``batch_size``, built and run on the meta device. ``build()`` returns the
    model, ``batch(b)`` its inputs for b samples (on meta), ``loss(model, batch)`` the scalar
    to differentiate; ``amp``: under bf16 autocast (:class:`CostMode`). Tensors are in registration
    order, a tied tensor once (``model.parameters()``); frozen ones (``requires_grad`` False) are left out."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build()
        model.train()
        inputs = batch(batch_size)
    mode = CostMode(model)
    try:
        with fused_dropout(), mode, (Autocast() if amp else contextlib.nullcontext()):
            value = loss(model, inputs)
            mode.phase = "bwd"
            value.backward()
    finally:
        mode.close()
    params = list(model.parameters())
    keep = [i for i, p in enumerate(params) if p.requires_grad and p.grad is not None]
    return [int(params[i].numel()) for i in keep], [mode.rows[i] for i in keep]


def linearity(r1, r2, factor: int = 2) -> dict:
    """Totals of ``r2`` over ``factor`` times those of ``r1``, per FLOP/byte field."""
    out = {}
    for j, f in enumerate(FIELDS):
        if f in OPS:
            continue
        a, b = sum(r[j] for r in r1), sum(r[j] for r in r2)
        out[f] = round(b / (factor * a), 6) if a else None
    return out


def entry(run: Callable[[int], tuple[list[int], list[list[int]]]], base: int = 2, strict: bool = True) -> dict:
    """The table of one model: ``run(b)`` is :func:`count` at batch b, done at ``base`` and
    ``2 base``; FLOPs and bytes per sample (the ``base`` batch divided), ops per iteration.
    ``strict``: FLOPs must be exactly and bytes within 1 % linear in the batch size."""
    sizes, rb = run(base)
    lin = linearity(rb, run(2 * base)[1])
    if strict:
        for f, v in lin.items():
            tol = 1e-9 if f.endswith("flops") else 1e-2
            if v is not None and abs(v - 1) > tol:
                raise ValueError(f"{f} is not linear in the batch size ({v})")
    r1 = [[v if f in OPS else round(v / base) for f, v in zip(FIELDS, row)] for row in rb]
    tot = dict(zip(FIELDS, (sum(r[j] for r in r1) for j in range(len(FIELDS)))))
    return {
        "total_params": sum(sizes),
        "num_tensors": len(sizes),
        "fwd_gflops": round(tot["fwd_flops"] / 1e9, 4), "bwd_gflops": round(tot["bwd_flops"] / 1e9, 4),
        "fwd_mbytes": round(tot["fwd_bytes"] / 1e6, 3), "bwd_mbytes": round(tot["bwd_bytes"] / 1e6, 3),
        "fwd_mm_mbytes": round(tot["fwd_mm_bytes"] / 1e6, 3), "bwd_mm_mbytes": round(tot["bwd_mm_bytes"] / 1e6, 3),
        "fwd_ops": tot["fwd_ops"], "bwd_ops": tot["bwd_ops"],
        f"batch{2 * base}_over_2x_batch{base}": lin,
        "tensors": [{"size": s, **dict(zip(FIELDS, r))} for s, r in zip(sizes, r1)],
    }
