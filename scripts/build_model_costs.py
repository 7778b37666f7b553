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
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import simsparse.models as models  # noqa: E402
from simsparse.models.costs import count, entry, linearity  # noqa: E402

OUT = ROOT / "simsparse" / "data" / "model_costs.json"
LAYER_PARAMS = ROOT / "simsparse" / "data" / "layer_params.json"


def measure(name: str, batch_size: int) -> list[list[int]]:
    """Per-tensor values of FIELDS for one batch."""
    sizes, rows = count(lambda: models.build(name), lambda b: models.example_batch(
        name, b, generator=torch.Generator().manual_seed(0), device="meta"), partial(models.loss, name), batch_size)
    if len(rows) != sum(1 for _ in layer_sizes(name)):
        raise SystemExit(f"{name}: some parameters got no gradient")
    return rows


def layer_sizes(name: str) -> list[int]:
    return json.loads(LAYER_PARAMS.read_text())[name]["sizes_in_registration_order"]


def model_entry(name: str, sizes: list[int], base: int = 2) -> dict:
    t0 = time.time()
    table = entry(lambda b: (sizes, measure(name, b)), base)
    source = (f"measured: aten ops of one forward + backward at batch {base} (divided by {base}) on the meta device, "
              f"torch {torch.__version__}; "
              "FLOPs from torch.utils.flop_counter formulas (matmul/conv/bmm/sdpa only; conv backward exact; "
              "multiply-add = 2); bytes = "
              "input + output tensor bytes per op excluding parameters and final gradients; backward attributed "
              "through autograd node sequence numbers; dropout as the fused native_dropout kernel, LSTM layers in "
              "the cuDNN formulation (simsparse.models.rnn.SeqLSTM) (scripts/build_model_costs.py)")
    print(f"{name:24s} fwd {table['fwd_gflops']:9.3f} GFLOP {table['fwd_mbytes']:9.1f} MB {table['fwd_ops']:6d} ops | "
          f"bwd {table['bwd_gflops']:9.3f} GFLOP {table['bwd_mbytes']:9.1f} MB {table['bwd_ops']:6d} ops | "
          f"{time.time() - t0:.1f} s", flush=True)
    tensors = table.pop("tensors")
    return {"input": models.input_description(name), **table, "source": source, "tensors": tensors}


def preset_entry(name: str) -> dict:
    """A preset (``simsparse.models.PRESETS``), counted as any spec is (:func:`simsparse.models.sources.table`)."""
    from simsparse.models.sources import canonical, resolve

    t0 = time.time()
    spec = canonical(models.PRESETS[name])
    src = resolve(spec)
    table = entry(lambda b: count(src.build, src.batch, src.loss, b), strict=False)
    print(f"{name:24s} fwd {table['fwd_gflops']:9.3f} GFLOP, {table['total_params']:,} parameters | "
          f"{time.time() - t0:.1f} s", flush=True)
    tensors = table.pop("tensors")
    import transformers
    source = (f"counted from {spec} on the meta device (torch {torch.__version__}, transformers "
              f"{transformers.__version__}; simsparse.models.costs, scripts/build_model_costs.py)")
    return {"input": src.input, "spec": spec, **table, "source": source, "tensors": tensors}


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
    for name in models.MODEL_NAMES + list(models.PRESETS):
        if a.only is not None and name not in a.only and name in old:
            doc["models"][name] = old[name]
        elif name in models.PRESETS:
            doc["models"][name] = preset_entry(name)
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
