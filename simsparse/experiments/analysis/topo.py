"""``simsparse topo``: what a network description builds at P hosts."""
from __future__ import annotations

from pathlib import Path

import yaml

from ...files import yaml_load
from ...network.spec import NETWORK_SPECS
from ...network.summary import draw, summary
from ..config import limits, sources
from ..config.errors import ConfigError


def show_topology(network: str, P: int, sets=(), draw_to=None) -> int:
    """``simsparse topo``: one network's machine at P hosts (switches, links, bisection), optionally drawn."""
    over = {}
    for kv in sets:
        key, eq, val = kv.partition("=")
        if not eq:
            raise ConfigError(f"--set {kv!r}: expected KEY=VALUE")
        try:
            over[key] = yaml_load(val)
        except (yaml.YAMLError, ValueError, RecursionError):
            raise ConfigError(f"--set {kv!r}: {val!r} is not a YAML value (a number, true/false, a name or a "
                              f"[list])") from None
    variants = sources.network_variants({"preset": network, **over}, Path.cwd() / "topo")
    if len(variants) != 1:
        raise ConfigError(f"topo describes one network; the overrides make {len(variants)}")
    spec = NETWORK_SPECS[variants[0]["model"]].model_validate(variants[0])
    too_big = limits.machine_problem(spec, P)
    if too_big:
        raise ConfigError(f"network {network}: {too_big}")
    if not hasattr(spec, "machine"):
        raise ConfigError(f"network {network}: the {spec.model} model is contention-free, with no machine to "
                          f"show (no switches or links: every message costs alpha_s + bytes / bandwidth_Bps); "
                          f"topo shows the flow-level models: fattree, dragonfly, ethernet")
    try:
        info = summary(spec, P)
        if draw_to:
            drawn = draw(spec, P, draw_to)
    except ValueError as e:
        raise ConfigError(f"network {network}: {e}") from None
    width = max(map(len, info))
    for k, v in info.items():
        lines = v if isinstance(v, list) else [v]
        for i, line in enumerate(lines):
            text = f"{line:.6g}" if isinstance(line, float) else str(line)
            print(f"{k if i == 0 else '':>{width}}{': ' if i == 0 else '  '}{text}")
    if draw_to:
        print(f"wrote {draw_to} ({drawn})")
    return 0
