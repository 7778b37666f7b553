"""Network presets of plugins: a dotted path ``package.module:PRESET`` or an
entry point of group ``simsparse.networks``, naming a mapping of network keys
(as in a ``topologies/*.yaml`` file) or the path of such a YAML file. The
built-in presets are the files in ``topologies/`` (the config loader finds
them)."""
from __future__ import annotations

from pathlib import Path

from ..files import yaml_load
from ..registry import Registry


def _as_preset(obj, name: str) -> dict:
    if isinstance(obj, (str, Path)):
        with open(obj) as f:
            obj = yaml_load(f.read())   # capped alias expansion, as every YAML the program reads
    if not isinstance(obj, dict):
        raise TypeError(f"it is {obj!r}, not a mapping of network keys")
    return dict(obj)


NETWORKS = Registry("network preset", "simsparse.networks", _as_preset,
                    "a mapping of network keys (as in topologies/*.yaml) or the path of such a YAML file")
