"""Bounds every number of a config must respect, beyond its field's own.

Pydantic checks each field's declared constraints (``gt=0``, ``le=1``); this
module adds what the simulator needs on top, by the unit a key's name
carries, so that no value can make a run loop forever, overflow to inf or
ask for an astronomical machine:

* every float is finite (no ``inf``, ``nan``);
* ``*_s`` and ``t_*`` (seconds): 0 to 3600 (an hour per message or kernel);
* ``*_Bps`` (bytes per second): 1 kB/s to 1 PB/s;
* ``*flops`` (FLOP/s): 1e6 to 1e18;
* ``*_B`` (bytes): at most 1 TiB;
* any other number without an upper bound of its own: at most 2^31 - 1
  (a count or a seed) or 1e6 in magnitude (a dimensionless setting).

:func:`check` walks a validated model (nested models, lists, dicts) and
returns one message per value out of bounds, naming its key path.
"""
from __future__ import annotations

import math

import annotated_types
from pydantic import BaseModel

MAX_SECONDS = 3600.0
BPS_RANGE = (1e3, 1e15)
FLOPS_RANGE = (1e6, 1e18)
MAX_BYTES = 1 << 40
MAX_COUNT = 2**31 - 1
MAX_FACTOR = 1e6


def _rule(key: str) -> tuple[float, float, str] | None:
    """(low, high, what) implied by a key's unit suffix, or None."""
    if key.endswith("_s") or key.startswith("t_"):
        return 0.0, MAX_SECONDS, "seconds from 0 to 3600"
    if key.endswith("_Bps"):
        return (*BPS_RANGE, "bytes/s from 1e3 to 1e15")
    if key.endswith("flops"):
        return (*FLOPS_RANGE, "FLOP/s from 1e6 to 1e18")
    if key.endswith("_B"):
        return 0, MAX_BYTES, "bytes from 0 to 2^40"
    return None


def _has_upper(field) -> bool:
    return any(isinstance(m, (annotated_types.Le, annotated_types.Lt)) for m in getattr(field, "metadata", ()))


def _value_problem(key: str, v, field) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return "must be a finite number"
    rule = _rule(key)
    if rule is not None:
        low, high, what = rule
        return None if low <= v <= high else f"out of range: {what}"
    if field is not None and _has_upper(field):
        return None
    if isinstance(v, int):
        return None if abs(v) <= MAX_COUNT else f"too large: at most {MAX_COUNT} (2^31 - 1)"
    return None if abs(v) <= MAX_FACTOR else f"too large: at most {MAX_FACTOR:g} in magnitude"


def show(v, width: int = 60) -> str:
    """A value's repr, clipped for an error message."""
    text = repr(v)
    return text if len(text) <= width else text[:width - 3] + "..."


def check(model: BaseModel, where: str = "") -> list[str]:
    """Messages for every number in ``model`` that is out of bounds."""
    out: list[str] = []
    for key, field in type(model).model_fields.items():
        _walk(getattr(model, key), key, field, f"{where}.{key}" if where else key, out)
    return out


def _walk(v, key: str, field, path: str, out: list[str]) -> None:
    if isinstance(v, BaseModel):
        out.extend(check(v, path))
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _walk(x, key, None, f"{path}[{i}]", out)
    elif isinstance(v, dict):
        for k, x in v.items():
            _walk(x, str(k), None, f"{path}.{k}", out)
    else:
        problem = _value_problem(key, v, field)
        if problem:
            out.append(f"{path} = {show(v)} is not allowed: {problem}")


#: the largest machine a flow-level network model may build (endpoints, links)
MAX_ENDPOINTS = 1 << 16
MAX_LINKS = 1 << 22


def machine_problem(spec, P: int) -> str | None:
    """Why the flow-level machine for P ranks is too large to build (or
    cannot hold them), checked before anything is built; None if it is fine."""
    if not hasattr(spec, "nodes_for"):
        return None  # alphabeta: no machine
    try:
        nodes = spec.nodes_for(P)
    except ValueError as e:
        return str(e)
    fixed = next((k for k in ("nodes", "groups") if getattr(spec, k, None) is not None), None)
    key = f"'{fixed}' = {getattr(spec, fixed)}" if fixed else f"P = {P}"
    if hasattr(spec, "routers_per_chassis"):
        group = spec.chassis_per_group * spec.routers_per_chassis * spec.nodes_per_router
        key += f" and groups of {group:,} nodes (chassis_per_group x routers_per_chassis x nodes_per_router)"
    endpoints = nodes * max(spec.gpus_per_node, spec.nics_per_node)
    if endpoints > MAX_ENDPOINTS:
        return (f"the machine for P = {P} would have {endpoints:,} endpoints (driven by {key}); allowed: at most "
                f"{MAX_ENDPOINTS:,}")
    per_router = getattr(spec, "routers_per_chassis", 0) + getattr(spec, "chassis_per_group", 0) + \
        getattr(spec, "global_links_per_router", 0)
    links = nodes * 4 + nodes * per_router  # a dragonfly has at most one router per node
    if links > MAX_LINKS:
        return (f"the machine for P = {P} would have about {links:,} links (driven by routers_per_chassis, "
                f"chassis_per_group and global_links_per_router); allowed: at most {MAX_LINKS:,}")
    return None
