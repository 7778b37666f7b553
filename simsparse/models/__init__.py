"""Real torch models whose parameter tensors are those of ``simsparse/data/layer_params.json``.

``[p.numel() for p in build(name).parameters()]`` equals that file's
``sizes_in_registration_order`` for every name in :data:`MODEL_NAMES`. The per-tensor
compute table built from them is ``simsparse/data/model_costs.json``
(``scripts/build_model_costs.py``).

Importing this package does not import torch; the family modules (``cnn``, ``inception``,
``rnn``, ``bert``, ``ncf``) do, and are loaded on first use.

A batch is ``(inputs, targets)``; ``inputs`` is a tensor, or a tuple of tensors passed
to the model as positional arguments. A model from elsewhere (``hf:GPT2Config``,
``package.module:function(seq=128)``, :mod:`.sources`) is built, fed and trained through
the same four functions, so the real backend trains the module the simulator counted.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> (family module, input description)
_MODELS: dict[str, tuple[str, str]] = {
    "vgg16_cifar10": ("cnn", "3x32x32 image, 10 classes"),
    "resnet20_cifar10": ("cnn", "3x32x32 image, 10 classes"),
    "resnet32_cifar10": ("cnn", "3x32x32 image, 10 classes"),
    "resnet56_cifar10": ("cnn", "3x32x32 image, 10 classes"),
    "resnet110_cifar10": ("cnn", "3x32x32 image, 10 classes"),
    "resnet18_cifar10": ("cnn", "3x32x32 image, 10 classes"),
    "resnet50_imagenet": ("cnn", "3x224x224 image, 1000 classes"),
    "alexnet_imagenet": ("cnn", "3x224x224 image, 1000 classes"),
    "vgg16_imagenet": ("cnn", "3x224x224 image, 1000 classes"),
    "inception_v4_imagenet": ("inception", "3x299x299 image, 1000 classes"),
    "lstm_ptb": ("rnn", "35 tokens over a 10,000-word vocabulary, next-token targets"),
    "lstm_an4": ("rnn", "1x161x300 spectrogram (161 bins x 300 frames of 10 ms), 29 labels per output frame (150)"),
    "bert_base": ("bert", "128 tokens over a 30,522 vocabulary with token types and mask; 15% MLM targets + NSP"),
    "ncf_ml20m": ("ncf", "one (user, item) pair of 138,493 users x 26,744 items, binary label"),
}

MODEL_NAMES: list[str] = list(_MODELS)

#: models people train now, each a spec of :mod:`.sources` (no hand-typed table: ``scripts/build_model_costs.py``
#: counts them into ``model_costs.json`` as it counts the packaged modules, so configs and ``advise`` need no
#: transformers for them)
PRESETS: dict[str, str] = {
    # GPT-2 small (124M) and XL (1.5B): Radford et al. 2019, Table 2; 1,024 positions
    "gpt2": "hf:GPT2Config",
    "gpt2_xl": "hf:GPT2Config(n_embd=1600, n_head=25, n_layer=48)",
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json: 16 layers of 2,048, GQA 32/8 heads, vocabulary 128,256,
    # tied embeddings), at a 2,048-token sequence
    "llama_1b": "hf:LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, "
                "num_hidden_layers=16, num_key_value_heads=8, seq=2048, tie_word_embeddings=True, vocab_size=128256)",
    # Llama 2 7B (Touvron et al. 2023, Table 1: 4,096 context; LlamaConfig's defaults are its sizes)
    "llama_7b": "hf:LlamaConfig(max_position_embeddings=4096, seq=4096)",
    # ViT-B/16 (Dosovitskiy et al. 2021, Table 1: 12 layers of 768, patch 16) at 224 x 224, 1,000 classes
    "vit_b_16": "hf:ViTConfig",
}


def _source(name: str):
    """The :class:`~.sources.ModelSource` of a preset or a model from elsewhere
    (``hf:...``, ``torchvision:...``, ``package.module:function``), else None."""
    name = PRESETS.get(name, name)
    if ":" not in name or name in _MODELS:
        return None
    from .sources import resolve
    return resolve(name)


def _family(name: str):
    if name.endswith((".json", ".csv")):
        raise KeyError(f"model {name!r} is a table of costs, not a module: it can be simulated but not trained or "
                       f"profiled (name the model's spec, e.g. hf:GPT2Config or package.module:function)")
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")
    return importlib.import_module(f"{__name__}.{_MODELS[name][0]}")


def build(name: str):
    """The model as a ``torch.nn.Module`` in training mode; deterministic given ``torch.manual_seed``.

    Builds on the current default device, so ``with torch.device("meta"): build(name)``
    costs no memory.
    """
    src = _source(name)
    model = src.build() if src else _family(name).build(name)
    model.train()
    return model


def example_batch(name: str, batch_size: int, generator=None, device="cpu") -> tuple:
    """Synthetic ``(inputs, targets)`` of the model's real input shape, drawn on the CPU with
    ``generator`` and moved to ``device`` (``"meta"`` works)."""
    src = _source(name)
    if src:
        return src.batch(batch_size, generator=generator, device=device)
    return _family(name).example_batch(name, batch_size, generator=generator, device=device)


def loss(name: str, model, batch) -> Any:
    """Scalar training loss of ``model`` on ``batch``: cross-entropy for the classifiers and
    language models, per-frame cross-entropy for ``lstm_an4`` (standing in for CTC), MLM + NSP
    cross-entropy for ``bert_base``, binary cross-entropy for ``ncf_ml20m``."""
    src = _source(name)
    return src.loss(model, batch) if src else _family(name).loss(name, model, batch)


def input_description(name: str) -> str:
    """One line describing one sample's input, e.g. ``"3x32x32 image, 10 classes"``."""
    src = _source(name)
    if src:
        return src.input
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")
    return _MODELS[name][1]


__all__ = ["MODEL_NAMES", "PRESETS", "build", "example_batch", "loss", "input_description"]
