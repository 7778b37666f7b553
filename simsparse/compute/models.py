"""Model profiles: per-tensor forward and backward times of a model on a device.

The work of every model comes from ``simsparse/data/model_costs.json``
(``scripts/build_model_costs.py`` counts it from the project's torch modules:
FLOPs, bytes and aten ops per sample, charged to the parameter tensor whose
gradient becomes ready when that work is done). A device profile turns it
into seconds with a roofline per tensor and pass::

    t = ops * launch_s
        + max(flops / (peak_flops * compute_efficiency), mm_bytes / mem_bandwidth_Bps)
        + (bytes - mm_bytes) / mem_bandwidth_Bps

where ``flops`` and ``mm_bytes`` belong to the matrix ops (convolution,
matmul), which run at the device's achieved fraction of its cited FP32 peak
(of its BF16 tensor-core peak for a model counted with ``dtype='bf16'``:
mixed precision, :mod:`simsparse.models.sources`), and the remaining bytes
to memory-bound ops (normalisation, activations, pooling, residual adds).
Activation work scales with the batch size; parameters add 4 bytes per
element read in the forward pass and 8 (read weight, write gradient) in the
backward pass; in mixed precision 8 (read the fp32 weight, write and read
its bf16 copy) and 10 (read the copy, write and read the bf16 gradient,
write it in fp32). The peaks are cited in each
profile; ``compute_efficiency`` is derived there from one cited end-to-end
measurement per device family, never from the papers' iteration times.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .devices import DeviceProfile


@lru_cache(maxsize=1)
def model_costs() -> dict:
    """The packaged per-tensor work of every model."""
    return json.loads(resources.files("simsparse").joinpath("data", "model_costs.json").read_text())["models"]


@dataclass(frozen=True)
class ModelProfile:
    """Per-tensor times in registration order."""

    name: str
    batch_size: int
    device: str
    sizes: tuple
    t_fwd: tuple
    t_bwd: tuple
    source: str
    #: the spread of a forward or backward piece around its median, measured on the timing's repetitions
    #: (``ModelTimes.noise``); None: the pieces draw from the device's kernel noise
    noise: tuple | None = None

    @property
    def t_forward(self) -> float:
        return float(sum(self.t_fwd))

    @property
    def t_backward(self) -> float:
        return float(sum(self.t_bwd))


#: samples per rank per iteration in the paper that trains the model (or its code)
DEFAULT_BATCH = {
    "vgg16_cifar10": 128,          # OMGS-SGD Table IV (the Ok-Topk runs use 16)
    "resnet20_cifar10": 32,        # OMGS-SGD code, exp_configs (HKBU-HPML/OMGS-SGD ac10b98)
    "resnet32_cifar10": 16,        # FFT-sparsification paper section 2: "16 for others" (single-GPU batch)
    "resnet56_cifar10": 128,       # same
    "resnet110_cifar10": 128,      # same
    "resnet18_cifar10": 32,        # DEFT runs (kljp/deft fc7f76f)
    "resnet50_imagenet": 16,       # OMGS-SGD Table IV (its code: 32)
    "inception_v4_imagenet": 32,   # OMGS-SGD Table IV
    "lstm_ptb": 100,               # OMGS-SGD Table IV (its code: 20)
    "lstm_an4": 2,                 # Ok-Topk runs (Shigangli/Ok-Topk 9763dcc)
    "bert_base": 8,                # Ok-Topk runs, sequence length 128
    "alexnet_imagenet": 256,       # OMGS-SGD code, exp_configs
    "vgg16_imagenet": 64,          # tf_cnn_benchmarks (TensorFlow performance benchmarks, r1 guide)
    "gpt2": 12,                    # nanoGPT's GPT-2 (124M) recipe, config/train_gpt2.py: batch_size 12 per GPU
    "vit_b_16": 128,               # DeiT-B's recipe (Touvron et al. 2021): batch 1024 on 8 GPUs
}


#: samples per rank of a model that did not ship with simsparse, unless the config sets batch_size
SPEC_BATCH = 8


def default_batch_size(model: str) -> int:
    """The batch of the paper (or recipe) that trains the model, else :data:`SPEC_BATCH` for
    a preset or a model from elsewhere; ValueError for a packaged model no paper gives one."""
    if model in DEFAULT_BATCH:
        return DEFAULT_BATCH[model]
    from ..models import MODEL_NAMES
    if model in MODEL_NAMES:
        raise ValueError(f"model {model!r} has no default batch size; set batch_size")
    return SPEC_BATCH


def is_spec(model: str) -> bool:
    """Whether ``model`` names a model from elsewhere (a stored table, a per-layer CSV or a
    :mod:`simsparse.models.sources` spec) rather than a packaged one."""
    return model.endswith((".json", ".csv")) or ":" in model


def model_table(model: str) -> dict:
    """The per-tensor work of ``model`` (``tensors``: size and the per-sample
    FLOPs, bytes and ops of each pass, in registration order): a packaged
    name (``model_costs.json``), a table stored by ``simsparse model import``
    (a ``.json`` path), or a spec counted on the meta device
    (:func:`simsparse.models.sources.table`). KeyError for an unknown name,
    ValueError for a spec or file that cannot be used."""
    packaged = model_costs().get(model)
    if packaged is not None:
        return packaged
    if model.endswith(".json"):
        return stored_table(model)
    if model.endswith(".csv"):
        from ..models.interchange import read_layer_csv
        return read_layer_csv(model)
    if ":" in model:
        from ..models.sources import table
        return table(model)
    raise KeyError(f"unknown model {model!r}: no compute table; known models: {', '.join(sorted(model_costs()))}, or {ELSEWHERE}")


#: what a model key takes besides a packaged name, in words
ELSEWHERE = "hf:ConfigClass, torchvision:name, package.module:function, a .json table or a per-layer .csv"


def resolve_model(model: str) -> str:
    """The name ``model`` keeps in points and rows, checked: a packaged name or a file as it is,
    a spec of :mod:`simsparse.models.sources` with its arguments sorted; its table built or read
    now, so a model that cannot be used is refused before anything runs (ValueError, naming
    what is allowed)."""
    if is_spec(model) and not model.endswith((".json", ".csv")):
        from ..models.sources import canonical
        model = canonical(model)
    try:
        model_table(model)
    except KeyError as e:
        from ..registry import did_you_mean
        raise ValueError(f"{e.args[0]}{did_you_mean(model, model_costs())}") from None
    return model


#: what a stored table's tensors must hold
TENSOR_KEYS = ("size", "fwd_flops", "fwd_bytes", "fwd_ops", "bwd_flops", "bwd_bytes", "bwd_ops")


@lru_cache(maxsize=16)
def stored_table(path: str) -> dict:
    """A table written by ``simsparse model import`` (or by hand, in its format), checked."""
    try:
        doc = json.loads(open(path).read())
    except OSError as e:
        raise ValueError(f"model table {path}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"model table {path}: not JSON ({e})") from None
    tensors = doc.get("tensors") if isinstance(doc, dict) else None
    if not isinstance(tensors, list) or not tensors:
        raise ValueError(f"model table {path}: needs a non-empty list 'tensors'")
    for i, t in enumerate(tensors):
        missing = [k for k in TENSOR_KEYS if not isinstance(t, dict) or not isinstance(t.get(k), (int, float))]
        if missing:
            raise ValueError(f"model table {path}: tensors[{i}] lacks {', '.join(missing)} (each tensor needs "
                             f"{', '.join(TENSOR_KEYS)}; fwd_mm_bytes and bwd_mm_bytes optional)")
        if t["size"] < 1 or min(t[k] for k in TENSOR_KEYS) < 0:
            raise ValueError(f"model table {path}: tensors[{i}]: size must be >= 1 and the work >= 0")
    return doc


def is_bf16(model: str) -> bool:
    """Whether ``model``'s table was counted in bf16 mixed precision (a spec with ``dtype='bf16'``,
    or a table ``simsparse model import`` wrote from one)."""
    return model_table(model).get("dtype") == "bf16"


def missing_peak(model: str, device: str, peak_flops, peak_bf16_flops) -> str | None:
    """What the roofline of ``model`` needs that ``device`` lacks: its FP32 peak, or its BF16 peak for
    a model counted in bf16 (:func:`is_bf16`); None when it has it."""
    if is_bf16(model):
        return None if peak_bf16_flops is not None else (
            f"device profile {device!r} has no peak_bf16_flops; model {model} trains in bf16 mixed precision: use "
            f"a device with a BF16 peak (a100, h100, h200), add peak_bf16_flops to the profile, or write "
            f"dtype='fp32'")
    return None if peak_flops is not None else (
        f"device profile {device!r} has no peak_flops; a training iteration needs it to time the model's layers "
        f"(add peak_flops and compute_efficiency, or give the model's per-tensor times)")


def model_profile(model: str, batch_size: int, device: DeviceProfile | None) -> ModelProfile:
    """The per-tensor times of ``model`` at ``batch_size`` on ``device``
    (``None``: the ideal device, every time zero)."""
    table = model_table(model)
    tensors = table["tensors"]
    sizes = tuple(int(t["size"]) for t in tensors)
    if device is None:
        zero = (0.0,) * len(sizes)
        return ModelProfile(model, batch_size, "ideal", sizes, zero, zero, "ideal device: compute costs nothing")
    if all("t_fwd_s" in t for t in tensors):   # a per-layer table's own times, as the user gave them
        return ModelProfile(model, batch_size, device.name, sizes, tuple(float(t["t_fwd_s"]) for t in tensors),
                            tuple(float(t["t_bwd_s"]) for t in tensors), table["source"] + " (used as given)")
    measured = device.models.get(model)
    if measured is not None and measured.settings is not None and (measured.batch_size != batch_size
                                                                   or len(measured.t_fwd) != len(sizes)):
        raise ValueError(f"device profile {device.name!r} holds {model}'s times measured at batch "
                         f"{measured.batch_size} ({measured.settings}) for {len(measured.t_fwd)} tensors; the config "
                         f"asks batch {batch_size} for {len(sizes)}: set batch_size {measured.batch_size}, or "
                         f"profile the model again (simsparse model profile --batch-size {batch_size})")
    if measured is not None and measured.batch_size == batch_size and len(measured.t_fwd) == len(sizes):
        k = device.slowdown
        return ModelProfile(model, batch_size, device.name, sizes, tuple(k * t for t in measured.t_fwd),
                            tuple(k * t for t in measured.t_bwd), f"measured on {device.name} (simsparse calibrate)"
                            + (f", x {k:.3g} (slowdown)" if k != 1 else ""),
                            tuple(measured.noise) if measured.noise else None)
    bf16 = is_bf16(model)
    peak, eff = ((device.peak_bf16_flops, device.compute_efficiency_bf16 or device.compute_efficiency) if bf16
                 else (device.peak_flops, device.compute_efficiency))
    problem = missing_peak(model, device.name, device.peak_flops, device.peak_bf16_flops)
    if problem:
        raise ValueError(problem)
    flops_s = peak * eff
    bw, launch = device.mem_bandwidth_Bps, device.launch_s
    fwd_param, bwd_param = (8, 10) if bf16 else (4, 8)

    def t(entry, pas, param_bytes):
        flops = entry[f"{pas}_flops"] * batch_size
        total = entry[f"{pas}_bytes"] * batch_size + param_bytes
        mm = min(entry.get(f"{pas}_mm_bytes", 0) * batch_size + param_bytes, total)
        return entry[f"{pas}_ops"] * launch + max(flops / flops_s, mm / bw) + (total - mm) / bw

    fwd = tuple(device.slowdown * t(e, "fwd", fwd_param * e["size"]) for e in tensors)
    bwd = tuple(device.slowdown * t(e, "bwd", bwd_param * e["size"]) for e in tensors)
    src = (f"roofline of {model} (work: {'model_costs.json, ' if model in model_costs() else ''}"
           f"{table.get('source', '')}) on {device.name}: "
           f"{'bf16 ' if bf16 else ''}peak {peak:.3g} FLOP/s x efficiency {eff:g}, "
           f"{bw:.3g} B/s, launch {launch:g} s")
    return ModelProfile(model, batch_size, device.name, sizes, fwd, bwd, src)
