"""Grid expansion of one config section, and pydantic errors as messages.

A list where a single value is expected expands into a grid: every
combination is validated against the section's schema, then against the
bounds of :mod:`.limits`. Grids are counted before they are expanded, so a
typo such as a thousand-value list in two keys is refused at once.
"""
from __future__ import annotations

import itertools
import math
import re
import types
import typing

from pydantic import BaseModel, ValidationError

from . import limits
from .errors import listing
from .hints import did_you_mean

#: most variants one section (or the whole config) may expand into
MAX_VARIANTS = 100_000


class Err(Exception):
    """A problem with one section; the loader gathers them into one paragraph."""


def collect(errors: list, fn):
    """``fn()``, or ``[]`` with its :class:`Err` appended to ``errors``."""
    try:
        return fn()
    except Err as e:
        errors.append(str(e))
        return []


def join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def is_list_field(schema: type[BaseModel], key: str) -> bool:
    f = schema.model_fields.get(key)
    if f is None:
        return False
    ann = f.annotation
    args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
    args = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args]
    return any(typing.get_origin(a) in (list, tuple) or a in (list, tuple) for a in args)


def check_size(axes: list[tuple[str, int]], where: str) -> None:
    """Refuse a grid of more than :data:`MAX_VARIANTS` combinations, naming its axes."""
    total = math.prod(n for _, n in axes)
    if total > MAX_VARIANTS:
        parts = " x ".join(f"{k}: {n} values" for k, n in sorted(axes, key=lambda a: -a[1]))
        raise Err(f"{where or 'config'}: the lists make a grid of {total:,} variants ({parts}); allowed: at most "
                  f"{MAX_VARIANTS:,} (split the config)")


def validate_variants(raw, schema: type[BaseModel], where: str) -> list:
    """Expand list values at scalar keys into a grid, validate every variant."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise Err(f"{where or 'config'}: expected a mapping, got {limits.show(raw)}")
    axes = []
    for key, val in raw.items():
        if isinstance(val, list) and not is_list_field(schema, key):
            if not val:
                raise Err(f"{join(where, key)}: empty list (a list expands into a grid; give at least one value)")
            axes.append((key, val))
    check_size([(join(where, k), len(v)) for k, v in axes], where)
    keys = [k for k, _ in axes]
    out, errs = [], []
    for combo in itertools.product(*(v for _, v in axes)):
        try:
            model = schema.model_validate({**raw, **dict(zip(keys, combo))})
        except ValidationError as e:
            errs.extend(m for m in pyd_errors(e, schema, where) if m not in errs)
            continue
        bad = limits.check(model, where)
        errs.extend(m for m in bad if m not in errs)
        if not bad:
            out.append(model)
    if errs:
        raise Err(listing(errs))
    return out


def _models_in(annotation) -> list:
    """The pydantic models an annotation holds (``Model``, ``dict[str, Model]``, ``list[Model] | None``...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def _schema_at(schema: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The model whose field ``loc``'s last key is (its dict keys and list
    indices passed over), so an unknown key deep in a section is named
    against its own model's keys."""
    for key in loc:
        f = schema.model_fields.get(str(key))
        if f is None:
            continue   # a dict key or a list index inside the field before
        inner = _models_in(f.annotation)
        if not inner:
            break
        schema = inner[0]
    return schema


def pyd_errors(e: ValidationError, schema: type[BaseModel], where: str) -> list[str]:
    msgs = []
    for err in e.errors():
        loc = join(where, ".".join(str(x) for x in err["loc"]))
        typ = err["type"]
        if typ == "extra_forbidden":
            key = str(err["loc"][-1]) if err["loc"] else ""
            own = _schema_at(schema, tuple(err["loc"][:-1]))
            renamed = getattr(own, "RENAMED", {}).get(key)
            hint = f" ({renamed})" if renamed else did_you_mean(key, own.model_fields)
            msgs.append(f"{loc}: unknown key{hint}; allowed keys: {', '.join(own.model_fields)}")
        elif typ == "missing":
            msgs.append(f"{loc}: missing required key")
        elif not err["loc"]:  # a check across keys (model_validator)
            msgs.append(f"{where or 'config'}: {err['msg'].removeprefix('Value error, ')}")
        else:
            f = schema.model_fields.get(str(err["loc"][0])) if err["loc"] else None
            hint = f" ({f.description})" if f is not None and f.description else ""
            if typ == "literal_error" and isinstance(err.get("input"), str):  # a misspelt choice
                hint = did_you_mean(err["input"], re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get(
                    "expected", "")))) + hint
            numeric = typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")
            why = "must be a finite number" if numeric and _nonfinite(err.get("input")) else err["msg"].rstrip(".")
            msgs.append(f"{loc} = {limits.show(err.get('input'))} is not allowed: {why}{hint}")
    return msgs


def _nonfinite(v) -> bool:
    """inf or nan, also written as text ('inf', '-Infinity', 'nan')."""
    try:
        return isinstance(v, (float, str)) and not math.isfinite(float(v))
    except ValueError:
        return False
