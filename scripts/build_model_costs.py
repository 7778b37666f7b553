"""Build ``simsparse/data/model_costs.json``: per-tensor forward/backward work of every model.

Usage: ``python scripts/build_model_costs.py [--out PATH] [--only NAME ...] [--check] [--check-batch1]``
(``--check`` compares with the existing file instead of writing it). About a minute on 2 cores.

Each model of ``simsparse.models`` is built on the ``meta`` device (shapes only, no memory,
no arithmetic) in training mode, and one forward and one backward of
``simsparse.models.loss`` run under a ``TorchDispatchMode`` that sees every aten op of both
passes. Per op it records:

* FLOPs: ``torch.utils.flop_counter`` formulas (matmul, addmm, bmm, baddbmm, convolution and
  its backward, SDPA), a multiply-add counting 2. Every other op counts 0 FLOPs: it is
  treated as memory-bound. ``convolution_backward`` uses our exact formula (one forward's
  FLOPs per requested gradient), as torch's over-counts grouped convolutions.
* bytes: the bytes of every input and output tensor of the op (distinct elements, so a
  broadcast ``expand`` counts once), except parameter tensors (and their views) and the
  final gradients written into ``.grad``: the simulator adds those itself, 4*size read in
  forward and 8*size (read weight, write gradient) in backward.
* ops: 1 per op that launches work. Views, ``detach``/``alias`` and ``empty*`` allocations
  count as 0 ops and 0 bytes. Ops are per iteration, not per sample: their number does not
  grow with the batch.

Attribution to parameter tensors (registration order), the same rule in both passes:

* ops run inside a module that owns parameters directly (Conv, Linear, BatchNorm, LayerNorm,
  Embedding, LSTM, the lookahead convolution) are charged to that module's first tensor
  (its weight); its other tensors (bias, LSTM biases) get zeros, as their gradients
  become ready at the same moment;
* parameter-free ops (activations, pooling, residual adds, concatenation, dropout,
  softmax, attention matmuls, the loss) are charged to the most recent parameterised
  module before them in forward execution order; ops before the first one go to the first;
* backward ops are attributed by their autograd node: the mode reads
  ``torch._C._current_autograd_node()`` and maps the node's sequence number back to the
  module that was current when the node was created in forward (a forward pre-hook on
  every parameterised module records the autograd sequence number at that moment).
  ``AccumulateGrad`` work goes to its own tensor. So a ReLU's backward is charged to the
  module before the ReLU, whose gradients it precedes.

Everything is per sample: the numbers are the work of a batch of 2 halved (batch 1 takes
special paths in eager torch, e.g. a matmul of permuted 4-D attention tensors copies its
operands only when the batch is > 1), and a batch of 4 is measured as the check that the
work is linear in the batch size: FLOPs exactly, bytes within 1 % (BatchNorm statistics,
bias-gradient sums and other per-batch work are constant). ``--check-batch1`` compares
batch 1 with batch 2 instead.

Two device paths are replaced by the ones a GPU run takes: dropout is measured as the fused
``native_dropout`` kernel (:func:`fused_dropout`), and the LSTM layers
(``simsparse.models.rnn.SeqLSTM``) run the cuDNN algorithm in plain torch ops: one GEMM
for the input projection of all steps, one GEMM with W_hh per step, whole-sequence GEMMs
for the weight gradients. Their per-step gate arithmetic is unfused (7 ops per step
forward, 11 backward, where cuDNN launches one or two kernels), so ``ops`` overstates
kernel launches for the LSTMs.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import simsparse.models as models  # noqa: E402

OUT = ROOT / "simsparse" / "data" / "model_costs.json"
LAYER_PARAMS = ROOT / "simsparse" / "data" / "layer_params.json"
FIELDS = ("fwd_flops", "fwd_bytes", "fwd_ops", "fwd_mm_bytes", "bwd_flops", "bwd_bytes", "bwd_ops", "bwd_mm_bytes")
OPS = {"fwd_ops", "bwd_ops"}
aten = torch.ops.aten
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
        self.last_output: dict[int, tuple[int, int]] = {}   # storage -> (owner, bytes) of its latest bwd producer
        self.handles = []
        for m in model.modules():
            own = list(m.parameters(recurse=False))
            if own:
                self.handles.append(m.register_forward_pre_hook(self._enter(self.param_index[id(own[0])])))
        for p in params:
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
        """The tensor written into ``p.grad`` is a gradient, not an activation: take its bytes back."""
        hit = self.last_output.pop(_storage(p.grad), None)
        if hit is not None:
            self.rows[hit[0]][FIELDS.index("bwd_bytes")] -= hit[1]
            if hit[2]:
                self.rows[hit[0]][FIELDS.index("bwd_mm_bytes")] -= hit[1]

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
            for t in outs:
                self.last_output[_storage(t)] = (owner, _nbytes(t), flops > 0)
        return out

    def close(self):
        for h in self.handles:
            h.remove()


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


def measure(name: str, batch_size: int) -> list[list[int]]:
    """Per-tensor values of FIELDS for one batch."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = models.build(name)
    batch = models.example_batch(name, batch_size, generator=torch.Generator().manual_seed(0), device="meta")
    mode = CostMode(model)
    try:
        with fused_dropout(), mode:
            loss = models.loss(name, model, batch)
            mode.phase = "bwd"
            loss.backward()
    finally:
        mode.close()
    assert all(p.grad is not None for p in model.parameters()), f"{name}: some parameters got no gradient"
    return mode.rows


def linearity(r1, r2, factor: int = 2) -> dict:
    """Totals of ``r2`` over ``factor`` times those of ``r1``, per FLOP/byte field."""
    out = {}
    for j, f in enumerate(FIELDS):
        if f in OPS:
            continue
        a, b = sum(r[j] for r in r1), sum(r[j] for r in r2)
        out[f] = round(b / (factor * a), 6) if a else None
    return out


def check_linear(name: str, lin: dict) -> None:
    for f, v in lin.items():
        tol = 1e-9 if f.endswith("flops") else 1e-2
        assert v is None or abs(v - 1) <= tol, f"{name}: {f} is not linear in the batch size ({v})"


def model_entry(name: str, sizes: list[int], base: int = 2) -> dict:
    t0 = time.time()
    rb = measure(name, base)
    lin = linearity(rb, measure(name, 2 * base))
    check_linear(name, lin)
    # FLOPs and bytes per sample; ops per iteration (launches do not grow with the batch)
    r1 = [[v if f in OPS else round(v / base) for f, v in zip(FIELDS, row)] for row in rb]
    tot = dict(zip(FIELDS, (sum(r[j] for r in r1) for j in range(len(FIELDS)))))
    source = (f"measured: aten ops of one forward + backward at batch {base} (divided by {base}) on the meta device, "
              f"torch {torch.__version__}; "
              "FLOPs from torch.utils.flop_counter formulas (matmul/conv/bmm/sdpa only; conv backward exact; "
              "multiply-add = 2); bytes = "
              "input + output tensor bytes per op excluding parameters and final gradients; backward attributed "
              "through autograd node sequence numbers; dropout as the fused native_dropout kernel, LSTM layers in "
              "the cuDNN formulation (simsparse.models.rnn.SeqLSTM) (scripts/build_model_costs.py)")
    print(f"{name:24s} fwd {tot['fwd_flops'] / 1e9:9.3f} GFLOP {tot['fwd_bytes'] / 1e6:9.1f} MB {tot['fwd_ops']:6d} ops | "
          f"bwd {tot['bwd_flops'] / 1e9:9.3f} GFLOP {tot['bwd_bytes'] / 1e6:9.1f} MB {tot['bwd_ops']:6d} ops | "
          f"{time.time() - t0:.1f} s", flush=True)
    return {
        "input": models.input_description(name),
        "total_params": sum(sizes),
        "num_tensors": len(sizes),
        "fwd_gflops": round(tot["fwd_flops"] / 1e9, 4), "bwd_gflops": round(tot["bwd_flops"] / 1e9, 4),
        "fwd_mbytes": round(tot["fwd_bytes"] / 1e6, 3), "bwd_mbytes": round(tot["bwd_bytes"] / 1e6, 3),
        "fwd_mm_mbytes": round(tot["fwd_mm_bytes"] / 1e6, 3), "bwd_mm_mbytes": round(tot["bwd_mm_bytes"] / 1e6, 3),
        "fwd_ops": tot["fwd_ops"], "bwd_ops": tot["bwd_ops"],
        f"batch{2 * base}_over_2x_batch{base}": lin,
        "source": source,
        "tensors": [{"size": s, **dict(zip(FIELDS, r))} for s, r in zip(sizes, r1)],
    }


def dumps(doc: dict) -> str:
    """Compact JSON: one line per tensor."""
    lines = ["{", f'  "about": {json.dumps(doc["about"])},', f'  "torch": {json.dumps(doc["torch"])},', '  "models": {']
    names = list(doc["models"])
    for i, name in enumerate(names):
        m = doc["models"][name]
        head = {k: v for k, v in m.items() if k != "tensors"}
        lines.append(f"    {json.dumps(name)}: {{")
        for k, v in head.items():
            lines.append(f"      {json.dumps(k)}: {json.dumps(v)},")
        lines.append('      "tensors": [')
        ts = m["tensors"]
        lines += [f"        {json.dumps(t)}{',' if j < len(ts) - 1 else ''}" for j, t in enumerate(ts)]
        lines.append("      ]")
        lines.append("    }" + ("," if i < len(names) - 1 else ""))
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


ABOUT = ("Per-sample work (batch 2 halved) per parameter tensor, in registration order (= layer_params.json). "
         "fwd_/bwd_flops: matmul/conv FLOPs (multiply-add = 2); fwd_/bwd_bytes: activation bytes read + written by "
         "every aten op, parameters and final gradients excluded (add 4*size in forward and 8*size in backward); "
         "fwd_/bwd_ops: aten ops per iteration, whatever the batch (roughly kernel launches); fwd_/bwd_mm_bytes: the part "
         "of the bytes moved by matrix ops (those with FLOPs), the rest being memory-bound ops. Work of parameter-free "
         "ops goes to the preceding parameterised module's first tensor; a module's other tensors get zeros. "
         "Built by scripts/build_model_costs.py.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", default=None, help="models to (re)measure; others are kept from --out")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("--check-batch1", action="store_true", help="only check batch 2 against batch 1 and exit")
    a = ap.parse_args(argv)
    if a.check_batch1:
        for name in a.only or models.MODEL_NAMES:
            print(name, linearity(measure(name, 1), measure(name, 2)))
        return 0
    sizes = {k: v["sizes_in_registration_order"] for k, v in json.loads(LAYER_PARAMS.read_text()).items()}
    old = json.loads(a.out.read_text())["models"] if a.out.exists() else {}
    doc = {"about": ABOUT, "torch": torch.__version__, "models": {}}
    for name in models.MODEL_NAMES:
        if a.only is not None and name not in a.only and name in old:
            doc["models"][name] = old[name]
        else:
            doc["models"][name] = model_entry(name, sizes[name])
    if a.check:
        diff = [n for n in doc["models"] if doc["models"][n]["tensors"] != old.get(n, {}).get("tensors")]
        print("differs:", diff or "nothing")
        return 1 if diff else 0
    a.out.write_text(dumps(doc))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
