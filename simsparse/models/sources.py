"""Models from anywhere: a spec string names a model simsparse did not ship.

A spec is ``SOURCE:NAME`` with optional keyword arguments in parentheses,
written as Python literals::

    hf:GPT2Config                          a transformers architecture from its config
                                           class, built without weights, offline
    hf:LlamaConfig(num_hidden_layers=4, seq=512)
    torchvision:vit_b_16                   where torchvision is installed
    mypkg.models:make_net(image=(3, 32, 32), classes=10)
                                           a function returning a torch.nn.Module

The input keys are the same for every source: ``seq`` (tokens a sample;
default the config's maximum sequence length, else 128) and ``vocab`` (for a
dotted path: its token ids are drawn below it) for language models;
``image`` (``(C, H, W)``, default ``(3, 224, 224)``) and ``classes`` for
image models; ``dtype``: ``"fp32"`` (default) or ``"bf16"``, mixed
precision as ``torch.autocast`` runs it (fp32 weights and gradients, matrix
products in bf16); ``checkpoint`` (``hf:`` only): activation checkpointing,
``True`` for every layer or N for every N-th (transformers'
``activation_checkpointing_enable``: the backward pass runs each
checkpointed layer's forward again, which the count sees as it sees any
op). Every other key goes to the config class (``hf:``), to
``torchvision.models.get_model`` or to the function.

:func:`resolve` parses a spec into a :class:`ModelSource` (build, one batch,
the loss); :func:`canonical` writes it back with sorted keys, the name a
model keeps in rows and caches. :func:`table` counts its per-tensor work
(:mod:`.costs`) and keeps the table on disk, keyed by the spec and the
torch and transformers versions, so a sweep's workers count it once.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

#: what a spec's source may be (besides a dotted ``module:function``)
SOURCES = ("hf", "torchvision")
#: the input keys every source understands; the rest go to the model's builder
INPUT_KEYS = ("seq", "vocab", "image", "classes", "dtype", "checkpoint")
#: the precisions a spec's ``dtype`` may name
DTYPES = ("fp32", "bf16")


class ModelSpecError(ValueError):
    """A model spec that cannot be parsed, built or run; the message says what is allowed."""


def parse(spec: str) -> tuple[str, str, dict]:
    """(source, name, keyword arguments) of ``spec``: ``hf``, ``torchvision`` or a module path."""
    text = spec.strip()
    args: dict = {}
    if text.endswith(")") and "(" in text:
        text, _, inner = text.partition("(")
        try:
            call = ast.parse(f"f({inner[:-1]})", mode="eval").body
            if call.args:
                raise ValueError("positional arguments")
            args = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except (SyntaxError, ValueError) as e:
            raise ModelSpecError(f"model {spec!r}: the arguments in parentheses must be key=value Python literals "
                                 f"({e})") from None
    source, sep, name = text.strip().partition(":")
    if not sep or not source or not name:
        raise ModelSpecError(f"model {spec!r}: expected a packaged name, hf:ConfigClass, torchvision:name, "
                             f"package.module:function or a .json profile")
    return source, name, args


def canonical(spec: str) -> str:
    """``spec`` with its arguments sorted and written as literals: one name per model."""
    source, name, args = parse(spec)
    inner = ", ".join(f"{k}={v!r}" for k, v in sorted(args.items()))
    return f"{source}:{name}" + (f"({inner})" if inner else "")


@dataclass(frozen=True)
class ModelSource:
    """How to build a model and train it for one batch: ``build()`` (the
    module, on the current default device), ``batch(b, generator, device)``
    (the inputs of b samples; zeros on the meta device),
    ``loss(model, batch)`` (the scalar to differentiate, under bf16 autocast
    where ``dtype`` is bf16); ``input`` in words."""

    spec: str
    build: Callable[[], Any]
    batch: Callable[..., Any]
    loss: Callable[[Any, Any], Any]
    input: str
    dtype: str = "fp32"


@lru_cache(maxsize=32)
def resolve(spec: str) -> ModelSource:
    """The :class:`ModelSource` of ``spec`` (module docstring), or :class:`ModelSpecError`."""
    source, name, args = parse(spec)
    inputs = {k: args.pop(k) for k in INPUT_KEYS if k in args}
    try:
        import torch  # noqa: F401 (the real-backend extra)
    except ImportError:
        raise ModelSpecError(f"model {spec!r}: building a model needs torch (pip install 'simsparse[mpi]')") from None
    dtype = inputs.pop("dtype", "fp32")
    if dtype not in DTYPES:
        raise ModelSpecError(f"model {spec!r}: dtype={dtype!r}; allowed: {', '.join(map(repr, DTYPES))} (bf16: "
                             f"mixed precision under torch.autocast)")
    checkpoint = inputs.pop("checkpoint", False)
    if checkpoint is not False and (source != "hf" or isinstance(checkpoint, float) or not
                                    (checkpoint is True or isinstance(checkpoint, int) and checkpoint >= 1)):
        raise ModelSpecError(f"model {spec!r}: checkpoint={checkpoint!r}; allowed: True (every layer) or N >= 1 "
                             f"(every N-th layer), for an hf: model" + (
                                 "" if source == "hf" else "; a module of your own checkpoints its blocks in its "
                                 "forward (torch.utils.checkpoint), and the count sees the recomputation"))
    if source == "hf":
        src = _huggingface(spec, name, args, inputs, 0 if checkpoint is False else int(checkpoint))
    elif source == "torchvision":
        src = _torchvision(spec, name, args, inputs)
    else:
        src = _dotted(spec, source, name, args, inputs)
    return src if dtype == "fp32" else replace(src, loss=_autocast(src.loss), dtype=dtype,
                                               input=f"{src.input}, bf16 autocast")


def _autocast(loss: Callable) -> Callable:
    """``loss`` under bf16 autocast on its batch's device (on meta, where autocast does nothing,
    :func:`.costs.count` casts by hand)."""
    import torch

    def run(model, x):
        device = x.device.type
        if device == "meta":
            return loss(model, x)
        with torch.autocast(device, dtype=torch.bfloat16):
            return loss(model, x)
    return run


def _tokens(seq: int, vocab: int):
    """b samples of ``seq`` token ids below ``vocab``: drawn with ``generator`` on the CPU
    and moved to ``device``; zeros on the meta device."""
    import torch

    def batch(b, generator=None, device="meta"):
        if str(device) == "meta":
            return torch.zeros(b, seq, dtype=torch.long, device="meta")
        return torch.randint(0, max(vocab, 2), (b, seq), generator=generator).to(device)
    return batch


def _image(shape) -> Callable:
    """b images of ``shape`` (C, H, W), standard normal, as :func:`_tokens` draws them."""
    import torch

    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ModelSpecError(f"image={shape!r}: expected (channels, height, width)")

    def batch(b, generator=None, device="meta"):
        if str(device) == "meta":
            return torch.zeros(b, *shape, device="meta")
        return torch.randn(b, *shape, generator=generator).to(device)
    return batch


def _huggingface(spec, name, args, inputs, every: int = 0) -> ModelSource:
    """A transformers model from its config class; ``every``: checkpoint every such layer (0: none)."""
    try:
        import transformers
    except ImportError:
        raise ModelSpecError(f"model {spec!r}: hf: needs transformers (pip install transformers)") from None
    cls = getattr(transformers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PretrainedConfig)):
        known = sorted(n for n in dir(transformers) if n.endswith("Config") and n[0].isupper())
        from ..registry import did_you_mean
        raise ModelSpecError(f"model {spec!r}: transformers {transformers.__version__} has no config class "
                             f"{name!r}{did_you_mean(name, known)}; allowed: a *Config class of transformers, "
                             f"e.g. GPT2Config, LlamaConfig, BertConfig, ViTConfig")
    import inspect
    known = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {})) | set(inspect.signature(cls).parameters)
    for key in [k for k in args if k not in known]:   # (a config keeps any keyword as an attribute)
        from ..registry import did_you_mean
        raise ModelSpecError(f"model {spec!r}: {name} has no setting {key!r}{did_you_mean(key, sorted(known))}; "
                             f"the input keys are {', '.join(INPUT_KEYS)}")
    try:
        config = cls(**args)
    except (TypeError, ValueError) as e:
        raise ModelSpecError(f"model {spec!r}: {name}({', '.join(args)}): {e}") from None
    config.use_cache = False
    if "image" in inputs or hasattr(config, "image_size"):
        size = getattr(config, "image_size", 224)
        image = inputs.get("image", (getattr(config, "num_channels", 3), size, size))
        classes = int(inputs.get("classes", args.get("num_labels", 1000)))
        config.num_labels = classes

        def build():
            with _shapes_only(transformers):
                model = transformers.AutoModelForImageClassification.from_config(config)
            if every:
                _checkpointed(spec, model, every)
            return model

        def loss(model, x):
            with _shapes_only(transformers):
                return model(pixel_values=x).logits.float().logsumexp(-1).mean()
        return ModelSource(spec, build, _image(image), loss, f"{'x'.join(map(str, image))} image, {classes} classes")
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    seq = int(inputs.get("seq", limit or 128))
    if limit and seq > limit:
        raise ModelSpecError(f"model {spec!r}: seq={seq} is longer than the config's {limit} positions")
    vocab = int(getattr(config, "vocab_size", 0) or 0)

    def heads():   # an encoder's masked-LM head first (BERT also has a causal one), then a decoder's
        for auto in (transformers.AutoModelForMaskedLM, transformers.AutoModelForCausalLM, transformers.AutoModel):
            try:
                with _shapes_only(transformers):
                    return auto.from_config(config)
            except ValueError:   # this architecture has no such head
                continue
        raise ModelSpecError(f"model {spec!r}: transformers builds no model from {name}")

    def build():
        model = heads()
        if every:
            _checkpointed(spec, model, every)
        return model

    def loss(model, ids):
        with _shapes_only(transformers):
            out = model(input_ids=ids, labels=ids) if _takes_labels(model) else model(input_ids=ids)
        got = getattr(out, "loss", None)
        return got if got is not None else out[0].float().mean()
    return ModelSource(spec, build, _tokens(seq, vocab), loss, f"{seq} tokens over a {vocab:,} vocabulary")


def _checkpointed(spec, model, every: int) -> None:
    """Activation checkpointing of every ``every``-th layer of a transformers model
    (non-reentrant, as torch recommends: it runs on the meta device too)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ModelSpecError(f"model {spec!r}: {type(model).__name__} does not support activation checkpointing "
                             f"in transformers; allowed: a model without checkpoint=")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(kwargs, every_n_layers=every)
    elif every == 1:   # (transformers before activation_checkpointing_enable)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ModelSpecError(f"model {spec!r}: checkpoint={every} needs a transformers with "
                             f"activation_checkpointing_enable; allowed here: checkpoint=True")


@contextlib.contextmanager
def _shapes_only(transformers):
    """transformers' attention masks skip their data-dependent shortcuts (``.all()`` of
    a mask: no value on the meta device), as they do under tracing; its warnings quiet."""
    masks = transformers.masking_utils
    traced, level = masks.is_tracing, transformers.logging.get_verbosity()
    masks.is_tracing = lambda *a, **k: True
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        masks.is_tracing = traced
        transformers.logging.set_verbosity(level)


def _takes_labels(model) -> bool:
    import inspect
    return "labels" in inspect.signature(model.forward).parameters


def _torchvision(spec, name, args, inputs) -> ModelSource:
    try:
        import torchvision
    except ImportError:
        raise ModelSpecError(f"model {spec!r}: torchvision: needs torchvision installed (the build matching "
                             f"your torch)") from None
    known = torchvision.models.list_models()
    if name not in known:
        from ..registry import did_you_mean
        raise ModelSpecError(f"model {spec!r}: torchvision has no model {name!r}{did_you_mean(name, known)}")
    image = inputs.get("image", (3, 224, 224))
    classes = int(inputs.get("classes", args.pop("num_classes", 1000)))

    def build():
        return torchvision.models.get_model(name, weights=None, num_classes=classes, **args)
    return ModelSource(spec, build, _image(image), _classifier_loss,
                       f"{'x'.join(map(str, image))} image, {classes} classes")


def _classifier_loss(model, x):
    out = model(x)
    out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out)
    return out.float().logsumexp(-1).mean()


def _dotted(spec, module, name, args, inputs) -> ModelSource:
    import torch

    from ..registry import import_object
    try:
        make = import_object(f"{module}:{name}")
    except Exception as e:   # noqa: BLE001 - any import failure is the user's path
        raise ModelSpecError(f"model {spec!r}: cannot import {module}:{name} ({type(e).__name__}: {e}); allowed: "
                             f"package.module:function, importable from the working directory or PYTHONPATH") from None
    if not callable(make):
        raise ModelSpecError(f"model {spec!r}: {module}:{name} is not callable; it must be a function returning "
                             f"a torch.nn.Module")

    def build():
        model = make(**args)
        if not isinstance(model, torch.nn.Module):
            raise ModelSpecError(f"model {spec!r}: {module}:{name}() returned {type(model).__name__}, not a "
                                 f"torch.nn.Module")
        return model
    if "seq" in inputs:
        seq, vocab = int(inputs["seq"]), int(inputs.get("vocab", 2))
        return ModelSource(spec, build, _tokens(seq, vocab), _classifier_loss, f"{seq} tokens over a {vocab:,} vocabulary")
    image = inputs.get("image")
    if image is None:
        raise ModelSpecError(f"model {spec!r}: say what one sample is: seq=N (token ids) or image=(C, H, W) "
                             f"in the parentheses, e.g. {module}:{name}(seq=128)")
    return ModelSource(spec, build, _image(image), _classifier_loss, f"{'x'.join(map(str, image))} image")


# -- the per-tensor work of a spec, counted once --------------------------------------------------

def cache_dir() -> Path:
    """Where counted tables are kept: ``$SIMSPARSE_CACHE`` or ``~/.cache/simsparse``, then ``models/``."""
    root = os.environ.get("SIMSPARSE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                             os.path.expanduser("~/.cache"), "simsparse")
    return Path(root) / "models"


def _versions() -> str:
    import torch
    try:
        import transformers
        return f"torch {torch.__version__}, transformers {transformers.__version__}"
    except ImportError:
        return f"torch {torch.__version__}"


@lru_cache(maxsize=32)
def table(spec: str) -> dict:
    """The per-tensor table of ``spec`` (the packaged tables' format: ``tensors`` of
    :data:`~.costs.FIELDS` per sample, in registration order), counted on meta at batch 2
    and 4, from the disk cache when the same spec was counted with the same versions."""
    spec = canonical(spec)
    versions = _versions()
    key = hashlib.sha256(f"{spec}\n{versions}".encode()).hexdigest()[:24]
    path = cache_dir() / f"{key}.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass   # a damaged cache entry: count again
    src = resolve(spec)
    from .costs import count, entry
    try:
        doc = entry(lambda b: count(src.build, src.batch, src.loss, b, amp=src.dtype == "bf16"), strict=False)
    except ModelSpecError:
        raise
    except Exception as e:   # noqa: BLE001 - the user's module failed to run on meta
        raise ModelSpecError(f"model {spec!r}: one forward and backward on the meta device failed "
                             f"({type(e).__name__}: {e})") from None
    doc = {"spec": spec, "input": src.input, "dtype": src.dtype, **doc, "source": f"counted on the meta device ({versions}), "
           "simsparse.models.costs"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError:
        pass   # a read-only home: the table is counted again next time
    return doc
