"""``simsparse list``: the algorithms, schedules, models, device profiles,
network presets and plugins a config may name, with their parameters and
defaults (read from the registries and the classes' docstrings)."""
from __future__ import annotations

import sys


def _first_paragraph(cls) -> str:
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _kind(annotation) -> str:
    """A parameter's type for people: ``rd|ring``, ``bool``, ``int``, ``float or none``."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        parts = [_kind(a) for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(parts) + (" or none" if type(None) in typing.get_args(annotation) else "")
    return getattr(annotation, "__name__", str(annotation))


def _default(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _param_line(params_cls, width: int = 100, indent: str = " " * 26) -> list[str]:
    """``name=default`` of every parameter, wrapped."""
    import textwrap

    items = [f"{k}={_default(f.default)}" for k, f in params_cls.model_fields.items()]
    if not items:
        return []
    return textwrap.wrap("params: " + ", ".join(items), width, initial_indent=indent, subsequent_indent=indent + "  ")


def _registries() -> dict:
    from ...algorithms import ALGORITHMS
    from ...compute.devices import builtin_profiles
    from ...compute.models import model_costs
    from ..config.sources import TOPOLOGY_DIRS
    from ...schedules import SCHEDULES

    return {"algorithm": dict(ALGORITHMS), "schedule": dict(SCHEDULES),
            "model": {k: None for k in model_costs()},
            "device profile": {k: None for k in ["ideal", *builtin_profiles()]},
            "network preset": {p.stem: p for d in TOPOLOGY_DIRS for p in sorted(d.glob("*.yaml"))}}


def _batch(model: str):
    from ...compute.models import default_batch_size
    try:
        return default_batch_size(model)
    except ValueError:
        return "-"


def list_names(names) -> int:
    """``simsparse list [NAME ...]``: every registered name, or what one of them is."""
    if names:
        return _list_details(names)
    from ...compute.models import model_costs

    reg = _registries()
    print("algorithms (parameters with their defaults; `simsparse list NAME` explains them):")
    for name, cls in sorted(reg["algorithm"].items()):
        print(f"  {name:22s} {_clip(_first_paragraph(cls), 96)}")
        for line in _param_line(cls.Params):
            print(line)
    print("schedules (a training iteration; with 'model' and 'schedules' in a config):")
    for name, cls in sorted(reg["schedule"].items()):
        kind = "dense" if cls.accepts == "dense" else "compressed"
        print(f"  {name:12s} {_clip(f'[{kind}] {_first_paragraph(cls)}', 106)}")
        for line in _param_line(cls.Params, indent=" " * 16):
            print(line)
    print("models (per-tensor compute tables; batch size default from the model's paper):")
    for name, table in sorted(model_costs().items()):
        params = sum(t["size"] for t in table["tensors"])
        print(f"  {name:24s} {params / 1e6:8.2f}M parameters, {len(table['tensors']):3d} tensors, "
              f"batch {_batch(name)}, {table.get('input', '')}")
    print("  ... and any model from elsewhere, counted on the meta device (no GPU, no weights): hf:GPT2Config, "
          "hf:LlamaConfig(num_hidden_layers=16, seq=2048), torchvision:vit_b_16, package.module:function(seq=128), "
          "or a table written by `simsparse model import` (docs/models.md)")
    print("device profiles (compute:): " + ", ".join(reg["device profile"]))
    print("network presets (network:): " + (", ".join(reg["network preset"]) or "(none)"))
    from ...registry import plugin_entry_points

    plugins = plugin_entry_points()
    print("plugins (entry points of installed packages): " + (", ".join(f"{n} ({what})" for what, n in plugins)
                                                               or "none; a config may also name a dotted path "
                                                                  "package.module:Object (docs/plugins.md)"))
    return 0


def _plugin(name) -> list:
    """``[(what, class)]`` of an algorithm or schedule a plugin provides
    (a dotted path or an entry point), else []."""
    from ...algorithms import ALGORITHMS
    from ...registry import is_dotted
    from ...schedules import SCHEDULES

    kinds = (("algorithm", ALGORITHMS), ("schedule", SCHEDULES))
    for what, registry in kinds:
        if name in registry.entry_point_names():
            return [(what, registry[name])]
    if not is_dotted(name):
        return []
    errors = []
    for what, registry in kinds:
        try:
            return [(what, registry[name])]
        except KeyError as e:
            errors.append(e)
    raise errors[0]


def _list_details(names) -> int:
    from ..config.hints import did_you_mean

    reg = _registries()
    status = 0
    for name in names:
        found = [(what, entries[name]) for what, entries in reg.items() if name in entries]
        if not found:
            try:
                found = _plugin(name)
            except KeyError as e:
                print(f"simsparse: error: {e}", file=sys.stderr)
                status = 2
                continue
        if not found:
            every = [n for entries in reg.values() for n in entries]
            print(f"simsparse: error: {name!r} is not an algorithm, schedule, model, device profile or network "
                  f"preset{did_you_mean(name, every)}; `simsparse list` shows them all", file=sys.stderr)
            status = 2
            continue
        for what, obj in found:
            print(f"{name} ({what})")
            if what in ("algorithm", "schedule"):
                print("  " + _first_paragraph(obj))
                fields = obj.Params.model_fields
                if not fields:
                    print("  no parameters")
                for key, f in fields.items():
                    print(f"  {key} = {_default(f.default)}  [{_kind(f.annotation)}]" + (f": {f.description}" if f.description
                                                                              else ""))
            elif what == "network preset":
                print("  " + obj.read_text().strip().replace("\n", "\n  "))
            elif what == "device profile" and name != "ideal":
                from ...compute.devices import load_profile

                prof = load_profile(name).model_dump()
                print("  " + ", ".join(f"{k}: {v}" for k, v in prof.items() if not isinstance(v, dict)))
            elif what == "device profile":
                print("  every kernel costs nothing: communication alone")
    return status
