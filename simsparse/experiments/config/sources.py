"""Where a config's parts come from: YAML files read with caps (size,
nesting, alias expansion), network presets, and device profiles."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml
from pydantic import ValidationError

from ...compute.devices import DEVICES, DeviceProfile, ProfileError, builtin_profiles, load_profile
from ...files import SelfAlias, YamlTooLarge, yaml_load
from ...network.presets import NETWORKS
from ...network.spec import NETWORK_SPECS
from ...registry import UnknownName, is_dotted
from . import limits
from .errors import ConfigError, listing
from .grid import Err, pyd_errors, validate_variants
from .hints import did_you_mean, yaml_where

REPO_ROOT = Path(__file__).resolve().parents[3]
TOPOLOGY_DIRS = [REPO_ROOT / "topologies"]
MAX_YAML_BYTES = 1_000_000
MAX_DEPTH = 200


def network_variants(val, cfg_path: Path) -> list[dict]:
    """The validated network dicts a ``network:`` value expands into (a
    preset name or file, a mapping, or ``{preset: ..., <overrides>}``);
    raises :class:`ConfigError` naming the key."""
    try:
        return networks(val, cfg_path)
    except Err as e:
        raise ConfigError(str(e)) from None


class PerP:
    """A ``network:`` or ``compute:`` value resolved per P: a file name may
    contain ``{P}`` (e.g. a machine profile calibrated for each rank count:
    ``results/calibration/local-{P}r.yaml``)."""

    def __init__(self, value, resolve):
        self.value, self.resolve, self.cache = value, resolve, {}

    def __call__(self, P: int) -> list:
        templated = isinstance(self.value, str) and "{P}" in self.value
        key = P if templated else None
        if key not in self.cache:
            self.cache[key] = self.resolve(self.value.replace("{P}", str(P)) if templated else self.value)
        return self.cache[key]


def network_problem(net: dict, P: int) -> str | None:
    spec = NETWORK_SPECS[net.get("model", "alphabeta")].model_validate(net)
    return limits.machine_problem(spec, P) or spec.check_P(P)


def networks(val, cfg_path: Path) -> list[dict]:
    if val is None:
        val = {}
    if isinstance(val, str):
        raw = load_preset(val, cfg_path)
    elif isinstance(val, dict):
        raw = dict(val)
        if "preset" in raw:
            preset = raw.pop("preset")
            if not isinstance(preset, str):
                raise Err(f"network.preset: expected a file name, got {preset!r}")
            raw = {**load_preset(preset, cfg_path), **raw}
    else:
        raise Err(f"network: expected a mapping or a preset file name, got {val!r}")
    model = raw.get("model", "alphabeta")
    if not isinstance(model, str) or model not in NETWORK_SPECS:
        raise Err(f"network.model: {limits.show(model)} is not allowed{did_you_mean(model, NETWORK_SPECS)}; allowed: "
                  f"{', '.join(NETWORK_SPECS)} (one model per network)")
    specs = validate_variants(raw, NETWORK_SPECS[model], "network")
    return [s.model_dump() for s in specs]


def load_preset(name: str, cfg_path: Path) -> dict:
    cands = []
    for base in [Path.cwd(), cfg_path.parent, cfg_path.parent.parent, *TOPOLOGY_DIRS]:
        for nm in (name, f"{name}.yaml", f"topologies/{name}", f"topologies/{name}.yaml"):
            cands.append(base / nm)
    for c in cands:
        try:
            found = c.is_file()
        except (OSError, ValueError):  # a name too long for the file system, or with a NUL
            found = False
        if found:
            data = read_yaml(c, "network preset")
            if not isinstance(data, dict):
                raise Err(f"network preset {c}: expected a mapping of keys")
            if data.get("kind") == "machine":  # a machine profile from `simsparse calibrate`: its network part
                if not isinstance(data.get("network"), dict):
                    raise Err(f"machine profile {c}: no 'network' section")
                return data["network"]
            return data
    if is_dotted(name) or name in NETWORKS.entry_point_names():  # a plugin's
        try:
            return NETWORKS[name]
        except UnknownName as e:
            raise Err(f"network: {e}") from None
    avail = sorted({*(p.stem for d in TOPOLOGY_DIRS for p in d.glob("*.yaml")), *NETWORKS.entry_point_names()})
    raise Err(f"network: preset {limits.show(name)} not found{did_you_mean(Path(name).stem, avail)} (looked next to the "
               f"config, in the working directory and in topologies/); available presets: {', '.join(avail) or 'none'}")


def computes(val, cfg_path: Path) -> list[dict | None]:
    vals = val if isinstance(val, list) else [val]
    if not vals:
        raise Err("compute: empty list")
    out = []
    for v in vals:
        if v is None or v == "ideal":
            out.append(None)
            continue
        try:
            if isinstance(v, str):
                prof = load_profile(v, cfg_path.parent)
            elif isinstance(v, dict) and "profile" in v:
                base = load_profile(str(v["profile"]), cfg_path.parent).model_dump()
                over = {k: x for k, x in v.items() if k != "profile"}
                prof = DeviceProfile.model_validate({**base, **over})
            elif isinstance(v, dict):
                prof = DeviceProfile.model_validate(v)
            else:
                raise Err(f"compute: expected 'ideal', a profile name ({', '.join(builtin_profiles())}), a .yaml "
                           f"path or a mapping, got {v!r}")
        except (FileNotFoundError, UnknownName) as e:
            name = v.get("profile") if isinstance(v, dict) else v
            if isinstance(name, str) and not Path(name).suffix and not is_dotted(name):
                allowed = ["ideal", *DEVICES.names()]
                raise Err(f"compute: device profile {name!r} not found{did_you_mean(name, allowed)}; allowed: "
                           f"{', '.join(allowed)}, a .yaml path, or a dotted path package.module:PROFILE") from None
            raise Err(f"compute: {e}") from None
        except ValidationError as e:
            raise Err(listing(pyd_errors(e, DeviceProfile, "compute"))) from None
        except ProfileError as e:
            raise Err(f"compute: {e}") from None
        bad = limits.check(prof, "compute")
        if bad:
            raise Err(listing(bad))
        out.append(prof.model_dump())
    return out


#: parsed YAML by the file's bytes: a sweep reads its network presets and profiles once a point
_PARSED: dict[bytes, object] = {}


def read_yaml(path: Path, what: str):
    """A YAML file's content: a regular file of at most 1 MB (not a device,
    FIFO or folder), parsed safely (no alias bomb, no value that contains
    itself); every failure as a :class:`ConfigError`."""
    if not path.exists():
        raise ConfigError(f"{path}: {what} file not found.")
    if not path.is_file():
        raise ConfigError(f"{path}: is {'a directory' if path.is_dir() else 'not a regular file'}, expected a YAML "
                          f"{what} file.")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
        if len(data) > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: the {what} file is larger than {MAX_YAML_BYTES // 1000} kB; allowed: a "
                              f"hand-written YAML file")
        if data not in _PARSED:
            text = data.decode("utf-8")
            if _flow_depth(text) > MAX_DEPTH:  # the parser takes seconds per thousand levels before it gives up
                raise RecursionError
            if len(_PARSED) >= 64:
                _PARSED.pop(next(iter(_PARSED)))
            _PARSED[data] = yaml_load(text)
        return copy.deepcopy(_PARSED[data])
    except SelfAlias as e:
        raise ConfigError(f"{path}: {e}.") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML{yaml_where(e, path)}.") from None
    except RecursionError:
        raise ConfigError(f"{path}: the {what} is nested too deeply to read.") from None
    except YamlTooLarge as e:
        raise ConfigError(f"{path}: {e}; allowed: a hand-written YAML {what}.") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: e.g. an integer of 5000 digits
        raise ConfigError(f"{path}: cannot read {what} file: {limits.show(str(e), 200)}.") from None


def _flow_depth(text: str) -> int:
    """The deepest nesting of [ and { in a YAML text (brackets in strings counted too: an upper bound)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest
