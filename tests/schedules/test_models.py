"""simsparse.models (real torch models) and simsparse/data/model_costs.json (scripts/build_model_costs.py)."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from importlib import resources

import pytest

import simsparse.models as models
from simsparse.models.sources import canonical

from tests.helpers import REPO as ROOT

LAYER_PARAMS = json.loads(resources.files("simsparse").joinpath("data", "layer_params.json").read_text())
COSTS = json.loads(resources.files("simsparse").joinpath("data", "model_costs.json").read_text())
REQUIRED = ["vgg16_cifar10", "resnet20_cifar10", "resnet50_imagenet", "inception_v4_imagenet",
            "lstm_ptb", "lstm_an4", "bert_base"]
# CPU build + forward at batch 1 on one thread: under 4 s each (BERT is the slowest); vgg16_imagenet, whose
# 138M-parameter build dominates, is checked on the meta device only
CPU_FORWARD = [n for n in models.MODEL_NAMES if n != "vgg16_imagenet"]
FIELDS = ("fwd_flops", "fwd_bytes", "fwd_ops", "bwd_flops", "bwd_bytes", "bwd_ops")


@pytest.fixture(autouse=True)
def _one_thread():
    """These small CPU runs are much faster on one thread than on two contended ones."""
    try:
        import torch
    except ImportError:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def costs():
    """The counter (simsparse.models.costs: imports torch)."""
    from simsparse.models import costs
    return costs


def _script():
    spec = importlib.util.spec_from_file_location("build_model_costs", ROOT / "scripts" / "build_model_costs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_registry_without_torch():
    """``import simsparse.models`` and its name/description API work where torch cannot be imported."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ImportError('torch blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import simsparse, simsparse.models as m\n"
            "assert 'torch' not in sys.modules\n"
            "assert 'bert_base' in m.MODEL_NAMES and m.input_description('resnet20_cifar10').startswith('3x32x32')\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_registry_names():
    assert set(REQUIRED) <= set(models.MODEL_NAMES)
    assert set(models.MODEL_NAMES) <= set(LAYER_PARAMS)
    for name in models.MODEL_NAMES:
        assert models.input_description(name)
    with pytest.raises(KeyError):
        models.input_description("nope")


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_parameter_sizes_match_layer_params(name):
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = models.build(name)
    sizes = [p.numel() for p in model.parameters()]
    ref = LAYER_PARAMS[name]
    assert sizes == ref["sizes_in_registration_order"]
    assert sum(sizes) == ref["total"] and len(sizes) == ref["num_tensors"]


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_example_batch_and_loss_meta(name):
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = models.build(name)
    batch = models.example_batch(name, 1, device="meta")
    loss = models.loss(name, model, batch)
    assert loss.shape == () and loss.device.type == "meta" and loss.requires_grad


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_FORWARD)
def test_example_batch_and_loss_cpu(name):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = models.build(name)
    batch = models.example_batch(name, 1, generator=torch.Generator().manual_seed(1))
    again = models.example_batch(name, 1, generator=torch.Generator().manual_seed(1))
    flat = lambda b: [t for t in torch.utils._pytree.tree_flatten(b)[0]]
    assert all(torch.equal(a, b) for a, b in zip(flat(batch), flat(again)))
    with torch.no_grad():
        loss = models.loss(name, model, batch)
    assert loss.shape == () and math.isfinite(loss.item()) and loss.item() > 0


def test_build_is_deterministic():
    torch = pytest.importorskip("torch")
    torch.manual_seed(3)
    a = models.build("resnet20_cifar10")
    torch.manual_seed(3)
    b = models.build("resnet20_cifar10")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("name,batch_size,lr", [("resnet20_cifar10", 8, 0.1), ("vgg16_cifar10", 2, 0.01)])
def test_trains_on_cpu(name, batch_size, lr):
    """Five SGD steps on one fixed synthetic batch lower the loss."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = models.build(name)
    batch = models.example_batch(name, batch_size, generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = models.loss(name, model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = models.loss(name, model, batch).item()
    assert final < losses[0], (losses, final)


def test_seq_lstm_equals_nn_lstm():
    """The cuDNN-style LSTM layer used by lstm_ptb/lstm_an4 computes exactly what nn.LSTM does, gradients included."""
    torch = pytest.importorskip("torch")
    from simsparse.models.rnn import SeqLSTM
    torch.manual_seed(0)
    for batch_first in (False, True):
        a = SeqLSTM(5, 7, batch_first=batch_first).double()
        b = torch.nn.LSTM(5, 7, batch_first=batch_first).double()
        b.load_state_dict(a.state_dict())
        x = torch.randn(4, 3, 5, dtype=torch.double)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        (oa, (ha, ca)), (ob, (hb, cb)) = a(xa), b(xb)
        w = torch.randn_like(oa)
        ((oa * w).sum() + 0.3 * ca.sum()).backward()
        ((ob * w).sum() + 0.3 * cb.sum()).backward()
        pairs = [(oa, ob), (ha, hb), (ca, cb), (xa.grad, xb.grad)]
        pairs += [(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters())]
        for u, v in pairs:
            torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_costs_cover_every_model():
    assert set(COSTS["models"]) == set(models.MODEL_NAMES) | set(models.PRESETS)
    for name, m in COSTS["models"].items():
        sizes = [t["size"] for t in m["tensors"]]
        if name in models.PRESETS:   # counted from a spec: its sizes are its parameters'
            assert m["spec"] == canonical(models.PRESETS[name]), name
        else:
            assert sizes == LAYER_PARAMS[name]["sizes_in_registration_order"], name
        assert m["total_params"] == sum(sizes) and m["num_tensors"] == len(sizes)
        assert m["input"] == models.input_description(name) and m["source"]
        for t in m["tensors"]:
            assert all(isinstance(t[f], int) and t[f] >= 0 for f in FIELDS), (name, t)
        for f in FIELDS:
            assert sum(t[f] for t in m["tensors"]) > 0, (name, f)
        assert m["fwd_gflops"] == pytest.approx(sum(t["fwd_flops"] for t in m["tensors"]) / 1e9, abs=1e-4)
        assert m["bwd_gflops"] == pytest.approx(sum(t["bwd_flops"] for t in m["tensors"]) / 1e9, abs=1e-4)


def test_costs_known_totals():
    """Published forward costs: ResNet-50 4.1 GMAC/image, VGG-16 CIFAR 0.31 GMAC, BERT-base 2 FLOP x params x tokens."""
    m = COSTS["models"]
    assert m["resnet50_imagenet"]["fwd_gflops"] == pytest.approx(8.2, rel=0.02)
    assert m["vgg16_cifar10"]["fwd_gflops"] == pytest.approx(0.63, rel=0.02)
    assert m["vgg16_imagenet"]["fwd_gflops"] == pytest.approx(31.0, rel=0.02)       # 15.5 GMAC
    # encoder linears (85M weights) and the MLM head over 128 tokens, plus attention (0.6 GFLOP)
    assert m["bert_base"]["fwd_gflops"] == pytest.approx(2 * 128 * (85.0e6 + 0.59e6 + 23.44e6) / 1e9 + 0.6, rel=0.01)
    for name, e in m.items():        # backward = grad input + grad weight, minus the first layer's grad input
        assert 1.5 <= e["bwd_gflops"] / max(e["fwd_gflops"], 1e-9) <= 2.0 + 1e-6, name


def test_presets_have_their_published_sizes():
    """GPT-2 124M and XL 1.5B (Radford et al. 2019), Llama 3.2 1B (1.24B, tied embeddings), Llama 2
    7B (6.74B), ViT-B/16 (86.6M with a 1,000-class head): the parameters the tables hold."""
    got = {name: COSTS["models"][name]["total_params"] for name in models.PRESETS}
    assert got == {"gpt2": 124_439_808, "gpt2_xl": 1_557_611_200, "llama_1b": 1_235_814_400,
                   "llama_7b": 6_738_415_616, "vit_b_16": 86_567_656}
    # a forward pass is 2 FLOPs a parameter a token, plus attention (GPT-2: 1,024 tokens)
    assert COSTS["models"]["gpt2"]["fwd_gflops"] == pytest.approx(2 * 124.44e6 * 1024 / 1e9, rel=0.25)


def test_costs_linear_in_batch_and_current():
    """ResNet-20: batch 2 is twice batch 1, and the packaged table is what the script measures now."""
    pytest.importorskip("torch")
    s = _script()
    r1, r2 = s.measure("resnet20_cifar10", 1), s.measure("resnet20_cifar10", 2)
    lin = s.linearity(r1, r2)
    assert lin["fwd_flops"] == 1.0 and lin["bwd_flops"] == 1.0
    assert abs(lin["fwd_bytes"] - 1) < 0.01 and abs(lin["bwd_bytes"] - 1) < 0.01
    table = COSTS["models"]["resnet20_cifar10"]["tensors"]
    for row, t in zip(r2, table):
        row = dict(zip(costs().FIELDS, row))
        for p in ("fwd", "bwd"):
            assert row[f"{p}_flops"] == 2 * t[f"{p}_flops"] and row[f"{p}_ops"] == t[f"{p}_ops"]
            assert abs(row[f"{p}_bytes"] - 2 * t[f"{p}_bytes"]) <= 2
            assert abs(row[f"{p}_mm_bytes"] - 2 * t[f"{p}_mm_bytes"]) <= 2


def test_cost_attribution_rule():
    """Linear -> ReLU -> Linear: the ReLU's work (both passes) goes to the first Linear's weight, biases get zeros,
    parameters and final gradients are not counted as bytes."""
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5))
        x = torch.randn(3, 10)
    mode = costs().CostMode(model)
    with mode:
        y = model(x).sum()
        mode.phase = "bwd"
        y.backward()
    mode.close()
    w1, b1, w2, b2 = (dict(zip(costs().FIELDS, r)) for r in mode.rows)
    assert set(b1.values()) == {0} and set(b2.values()) == {0}
    # forward: addmm (x 120 B in, 240 B out) + relu (240 + 240 B); addmm (240 + 60 B) + sum (60 + 4 B)
    assert (w1["fwd_flops"], w1["fwd_bytes"], w1["fwd_ops"]) == (2 * 3 * 10 * 20, 120 + 240 + 480, 2)
    assert (w2["fwd_flops"], w2["fwd_bytes"], w2["fwd_ops"]) == (2 * 3 * 20 * 5, 300 + 64, 2)
    assert w1["fwd_mm_bytes"] == 120 + 240 and w2["fwd_mm_bytes"] == 300     # the addmm ops only
    # backward: w2 gets ones_like, grad-input mm, grad-weight mm, bias sum; w1 the ReLU backward, its grad-weight mm and sum
    assert w2["bwd_flops"] == 2 * (2 * 3 * 20 * 5) and w2["bwd_ops"] == 4
    assert w1["bwd_flops"] == 2 * 3 * 10 * 20 and w1["bwd_ops"] == 3
    assert w1["bwd_bytes"] == 3 * 240 + (240 + 120) + 240      # threshold_backward; mm reads grad 240 + x 120; sum reads 240
    assert w1["bwd_mm_bytes"] == 240 + 120
