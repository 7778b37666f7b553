"""Experiment configs: YAML -> validated, fully resolved grid of points.

Top-level keys::

    name:        results go to results/<name>/ (default: the file's stem)
    description: free text
    network:     {model: alphabeta, alpha_s, bandwidth_Bps, ...}, or a preset
                 file name/path (topologies/<preset>.yaml), or
                 {preset: <file>, <overrides>}
    compute:     ideal | <built-in profile, e.g. p100> | <profile.yaml> |
                 {profile: <name or file>, <overrides>} | an inline profile
    workload:    {n, density, dtype, seed, distribution, overlap, skew, drift,
                 layers | model, layer_spread, source} (see simsparse/workload.py)
    algorithms:  [name, {name: <name>, <param>: <value>}, ...]; a name may be a
                 dotted path package.module:Class; with schedules it may be
                 omitted: each schedule runs its paper's (default_algorithm)
    P:           number of ranks
    iterations:  measured iterations per point (>= 1); the loop adds one of each kind
                 of the algorithm's periodic work they miss (experiments/period.py)
    warmup:      iterations run first and not measured (>= 0)
    check:       compare every result with the numpy reference (true/false)
    stack:       a training iteration's software stack: host staging, the
                 optimizer step, unpacking (simsparse/schedules/stack.py)

A list where a single value is expected (``P: [2, 4, 8]``,
``workload.density: [0.01, 0.001]``, ``network.alpha_s: [...]``,
``compute: [ideal, p100]``, or an algorithm parameter) expands into a grid.

Everything is validated before anything runs; a problem raises
:class:`ConfigError` whose message names the file, the key and what is
allowed.
"""
from __future__ import annotations

import itertools
import re
import typing
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ..algorithms import ALGORITHMS
from ..compute.devices import DEVICES, DeviceProfile, builtin_profiles, load_profile
from ..schedules import SCHEDULES, get_schedule
from ..network.presets import NETWORKS
from ..network.spec import NETWORK_SPECS
from ..registry import UnknownName, is_dotted
from ..sampling import sampled_problem
from ..workload import FileSource, Workload, model_layer_params, resolve_layers
from . import limits
from .grid import Err, check_size, collect, pyd_errors, validate_variants
from .hints import did_you_mean, yaml_where
from .point import Point

REPO_ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY_DIRS = [REPO_ROOT / "topologies"]
MAX_YAML_BYTES = 1_000_000
MAX_DEPTH = 200


class ConfigError(Exception):
    """A user-facing, one-paragraph description of what is wrong with a config."""


class SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="one .npz per rank and iteration, e.g. grads/rank{rank}_iter{iteration}.npz "
                                  "(relative to the working directory)")
    key: str = Field("grad", description="name of the gradient array inside each .npz")


def _probe(source: SourceSpec):
    """The recorded gradient of rank 0, iteration 0 (and its layer sizes)."""
    try:
        return FileSource(source.path, source.key).read(0, 0)
    except (OSError, ValueError) as e:
        raise ValueError(str(e).removeprefix("workload.source: ")) from None


class WorkloadSpec(BaseModel):
    """The ``workload:`` section; its fields are :class:`~simsparse.workload.Workload`'s.
    ``model``/``source`` resolve into ``layers`` and ``n`` (validated in this order)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="take n and the layer sizes from a model in "
                                                "simsparse/data/layer_params.json")
    source: SourceSpec | None = Field(None, description="replay recorded gradients instead of generating them")
    layers: list[int] | None = Field(None, min_length=1, validate_default=True,
                                     description="layer sizes in gradient order, summing to n")
    n: int | None = Field(None, gt=0, le=2**31 - 1, validate_default=True,
                          description="gradient elements per rank (may be omitted with model, layers or source)")
    density: float = Field(0.01, gt=0, le=1, description="k/n, the fraction selected by sparse algorithms")
    dtype: typing.Literal["float32", "float64"] = "float32"
    seed: int = Field(0, ge=0)
    distribution: typing.Literal["normal", "laplace", "student_t"] = Field(
        "normal", description="marginal distribution of the values (laplace and student_t: heavy tails, unit variance)")
    df: float = Field(3.0, gt=2, description="degrees of freedom of student_t (> 2: finite variance)")
    overlap: float | None = Field(None, ge=0, le=1, description="fraction of each rank's top-k coordinates shared by "
                                  "all ranks (1 identical, 0 disjoint); unset: independent ranks")
    skew: float = Field(0.0, ge=0, lt=1, description="concentration of the large coordinates at the start of the index "
                        "space: a fraction q^(1-skew) of them lies in the first q (0: uniform)")
    drift: float = Field(1.0, ge=0, le=1, description="change between iterations: g_t = (1-drift) g_(t-1) + noise "
                         "(1: independent iterations, 0: the same gradient every iteration)")
    layer_spread: float = Field(2.0, ge=0, le=30, description="decades over which the per-layer RMS values are spread "
                                "(log-uniform; with layers or model)")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v):
        if v is not None and v not in model_layer_params():
            raise ValueError(f"unknown model{did_you_mean(v, model_layer_params())}; known models: "
                             f"{', '.join(sorted(model_layer_params()))}")
        return v

    @field_validator("source")
    @classmethod
    def _source_readable(cls, v):
        if v is not None:
            _probe(v)  # rank 0, iteration 0 must be there
        return v

    @field_validator("layers")
    @classmethod
    def _layers(cls, v, info: ValidationInfo):
        model, source = info.data.get("model"), info.data.get("source")
        if v is None and model is None and source is not None:
            v = _probe(source)[1]
        layers, _ = resolve_layers(model, v, None)
        return None if layers is None else list(layers)

    @field_validator("n")
    @classmethod
    def _n(cls, v, info: ValidationInfo):
        layers, source = info.data.get("layers"), info.data.get("source")
        if source is not None:
            got = len(_probe(source)[0])
            if v is not None and v != got:
                raise ValueError(f"the recorded gradient {source.path!r} (rank 0, iteration 0) has {got} values")
            v = got
        if layers is not None:
            if v is not None and v != sum(layers):
                raise ValueError(f"the layers (or model) sum to {sum(layers)}; omit n or set it to that")
            v = sum(layers)
        if v is None:
            raise ValueError("missing: give n, or model, layers or source to take it from")
        return v

    @model_validator(mode="after")
    def _generator_knobs_need_no_source(self):
        if self.source is not None:
            set_ = [k for k in ("distribution", "overlap", "skew", "drift") if k in self.model_fields_set]
            if set_:
                raise ValueError(f"source replays recorded gradients, so {', '.join(set_)} (settings of synthetic "
                                 f"gradients) cannot be given with it")
        return self

    def check_P(self, P: int) -> str | None:
        """Why these gradients cannot feed P ranks (disjoint top-k sets need P k <= n), or None."""
        return Workload(**self.model_dump()).check_P(P)


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    P: int = Field(ge=1, le=1 << 20, description="number of ranks")
    iterations: int = Field(3, ge=1, le=100000)
    warmup: int = Field(1, ge=0, le=100000)
    check: bool = True
    data_scale: float = Field(1.0, gt=0, le=1, description="simulator only: carry gradients at this fraction of n and "
                                                           "scale bytes and compute work back up (1 = full size)")
    engine: typing.Literal["lean", "simpy"] = Field("lean", description="simulator only: the event engine (the same "
                                                                        "results; lean also evaluates dense collectives "
                                                                        "on sizes as bulk rounds; simpy is the "
                                                                        "reference)")
    values: typing.Literal["auto", "full", "sampled"] = Field(
        "auto", description="simulator only: auto carries sizes only for dense collectives (same times and bytes, no "
                            "check); full: values; sampled: also sizes for dense collectives, and for sparse ones only "
                            "the gradient entries above a floor near the top k, exact in distribution (no check)")
    collectives: typing.Literal["auto", "events"] = Field(
        "auto", description="simulator only: auto evaluates helper collectives (allgather, alltoall, host allreduce) "
                            "for all ranks at once where the network allows, exactly or as a recorded approximation "
                            "(row column 'collectives'); events: always as their point-to-point messages")


class TrainingSpec(BaseModel):
    """The training keys: a model, its batch size per rank, a schedule."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a model with a compute table (simsparse list shows them)")
    batch_size: int | None = Field(None, ge=1, le=1 << 20, description="samples per rank per iteration "
                                                                        "(default: the model's, from its paper)")
    density: float | None = Field(None, gt=0, le=1, description="this model's k/n (overrides workload.density)")

    @field_validator("model")
    @classmethod
    def _known(cls, v):
        from ..compute.models import model_costs

        if v not in model_costs():
            raise ValueError(f"no compute table for this model{did_you_mean(v, model_costs())}; known: "
                             f"{', '.join(sorted(model_costs()))}")
        return v

    @model_validator(mode="after")
    def _batch(self):
        from ..compute.models import DEFAULT_BATCH

        if self.batch_size is None:
            if self.model not in DEFAULT_BATCH:
                raise ValueError(f"model {self.model!r} has no default batch size; set batch_size")
            self.batch_size = DEFAULT_BATCH[self.model]
        return self


TOP_KEYS = ["name", "description", "network", "compute", "model", "batch_size", "schedules", "workload", "algorithms",
            "P", "iterations", "warmup", "check", "data_scale", "engine", "values", "collectives", "stack"]
#: workload keys the top-level ``model`` decides in a training config
_MODEL_KEYS = ("model", "n", "layers", "source")


@dataclass
class Experiment:
    name: str
    path: Path
    points: list[Point]
    description: str = ""


# -- entry point -----------------------------------------------------------------

def load_config(path: str | Path) -> Experiment:
    path = Path(path)
    raw = _read_yaml(path, "config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping of keys (name, network, workload, algorithms, P, ...), "
                          f"got {type(raw).__name__}.")
    errors: list[str] = []
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        hints = "".join(f" ({limits.show(k)}: did you mean {close}?)" for k in unknown
                        if (close := did_you_mean(k, TOP_KEYS, "{}")))
        errors.append(f"unknown key(s) {', '.join(map(limits.show, unknown))}{hints}; allowed keys: "
                      f"{', '.join(TOP_KEYS)}")
    if raw.get("workload") is not None and not isinstance(raw["workload"], dict):
        raise ConfigError(f"{path}: workload = {limits.show(raw['workload'])} is not allowed: expected a mapping of "
                          f"keys (n, density, ...).")
    training = "schedules" in raw
    for req in ("P",) if training else ("workload", "algorithms", "P"):
        if req not in raw:
            errors.append(f"missing required key '{req}'")
    if training:
        if "model" not in raw:
            errors.append("missing required key 'model' (schedules simulate training iterations of a model)")
        clash = [k for k in _MODEL_KEYS if k in (raw.get("workload") or {})]
        if clash:
            errors.append(f"workload: {', '.join(clash)} cannot be given with schedules: the top-level 'model' "
                          f"sets the gradient's tensors")
    else:
        for key in ("model", "batch_size", "stack"):
            if key in raw:
                errors.append(f"{key}: only with 'schedules' (a training iteration); for a bare collective on a "
                              f"model's tensors use workload.model")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,99}", name):
        errors.append(f"name: {limits.show(name)} is not allowed; use up to 100 letters, digits, '_', '-' and '.' "
                      f"(not '.' first; it names the results folder under results/)")
    if errors:
        raise ConfigError(_paragraph(path, errors))

    networks = _PerP(raw.get("network"), lambda v: collect(errors, lambda: _networks(v, path)))
    computes = _PerP(raw.get("compute", "ideal"), lambda v: collect(errors, lambda: _computes(v, path)))
    trainings = collect(errors, lambda: _trainings(raw)) if training else [None]
    variants = {}  # the workload variants of each training variant's model and density (None: no training)
    for tr in trainings:
        wl_raw = dict(raw.get("workload") or {})
        if tr is not None:
            wl_raw["model"] = tr[0].model
            if tr[0].density is not None:
                wl_raw["density"] = tr[0].density
        variants.setdefault(_wl_key(tr), collect(
            errors, lambda wl_raw=wl_raw: validate_variants(wl_raw, WorkloadSpec, "workload")))
    cases = [(tr, wl) for tr in trainings for wl in variants[_wl_key(tr)]]
    defaulted = training and "algorithms" not in raw
    algos = collect(errors, lambda: _default_algorithms(trainings) if defaulted else _algorithms(raw["algorithms"]))
    stack = collect(errors, lambda: _stack(raw.get("stack")))
    run_raw = {k: raw[k] for k in ("P", "iterations", "warmup", "check", "data_scale", "engine", "values",
                                   "collectives") if k in raw}
    runs = collect(errors, lambda: validate_variants(run_raw, RunSpec, ""))
    for run in runs:  # resolve (and validate) every network and compute variant before building points
        networks(run.P), computes(run.P)
    if not errors:
        collect(errors, lambda: check_size([("P and run keys", len(runs)), ("workload", len(cases)),
                                            ("algorithms", len(algos)),
                                            ("network", max(len(networks(r.P)) for r in runs)),
                                            ("compute", max(len(computes(r.P)) for r in runs))], ""))
    if errors:
        raise ConfigError(_paragraph(path, errors))

    points = []
    used = set()
    # algorithms innermost: consecutive points share their gradients (cached)
    grid = ((net, comp, case, run, algo) for run in runs for net in networks(run.P) for comp in computes(run.P)
            for case, algo in itertools.product(cases, algos))
    for net, comp, (tr, wl), run, (aname, params) in grid:
        if tr is not None:
            spec, (sname, sparams) = tr
            if defaulted and aname != get_schedule(sname).default_algorithm:
                continue  # each schedule with its own paper's collective
            problem = get_schedule(sname).check_algorithm(ALGORITHMS[aname])
            if problem:
                continue  # the grid pairs every schedule with every algorithm it can use
            used.add(sname)
            if comp is not None and comp.get("peak_flops") is None:
                errors.append(f"compute: profile {comp.get('name')!r} has no peak_flops; a training iteration needs "
                              f"it to time the model's layers")
                continue
        if wl.n < run.P:
            errors.append(f"workload.n = {wl.n} is smaller than P = {run.P}; allowed: n >= P")
            continue
        problem = wl.check_P(run.P)
        if problem:
            errors.append(f"workload with P = {run.P}: {problem}")
            continue
        problem = _network_problem(net, run.P)
        if problem:
            errors.append(f"network: {problem}")
            continue
        problem = ALGORITHMS[aname].check_setup(run.P, wl.n, params)
        if problem:
            errors.append(f"algorithms: {aname} with P = {run.P}: {problem}")
            continue
        point = Point(algorithm=aname, P=run.P, workload=wl.model_dump(), network=net,
                      params=params.model_dump(exclude_unset=True), compute=comp,
                      iterations=run.iterations, warmup=run.warmup, check=run.check, data_scale=run.data_scale,
                      engine=run.engine, values=run.values, collectives=run.collectives)
        if tr is not None:
            point = replace(point, schedule=sname, schedule_params=sparams.model_dump(exclude_unset=True),
                            batch_size=spec.batch_size, algorithm_default=defaulted)
            if stack is not None:
                point = replace(point, stack=stack.model_dump(exclude_defaults=True),
                                compute=stack.device_costs(comp, len(wl.layers)))
        problem = _scale_problem(point)
        if problem:
            errors.append(f"data_scale = {run.data_scale}: {problem}")
            continue
        problem = sampled_problem(point) if run.values == "sampled" else None
        if problem:
            errors.append(f"values: sampled with {aname}: {problem}")
            continue
        points.append(point)
    for tr in trainings if training else []:
        sname = tr[1][0]
        if sname not in used:
            need = "an exact dense allreduce (ring, recursive_doubling, rabenseifner)" \
                if get_schedule(sname).accepts == "dense" else "a compressing allreduce (topka, oktopk, gtopk, ...)"
            errors.append(f"schedules: {sname} communicates with {need}, and 'algorithms' lists none")
    if errors:
        raise ConfigError(_paragraph(path, sorted(set(errors), key=errors.index)))
    return Experiment(name=name, path=path, points=points, description=str(raw.get("description", "")))


# -- sections -----------------------------------------------------------------------

def network_variants(val, cfg_path: Path) -> list[dict]:
    """The validated network dicts a ``network:`` value expands into (a
    preset name or file, a mapping, or ``{preset: ..., <overrides>}``);
    raises :class:`ConfigError` naming the key."""
    try:
        return _networks(val, cfg_path)
    except Err as e:
        raise ConfigError(str(e)) from None


class _PerP:
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


def _scale_problem(point: Point) -> str | None:
    if point.data_scale >= 1:
        return None
    try:
        small, _ = point.at_scale()
    except ValueError as e:
        return str(e)
    if small.workload["n"] < point.P:
        return f"leaves n = {small.workload['n']} elements, fewer than P = {point.P}; allowed: n * data_scale >= P"
    return None


def _network_problem(net: dict, P: int) -> str | None:
    spec = NETWORK_SPECS[net.get("model", "alphabeta")].model_validate(net)
    return limits.machine_problem(spec, P) or spec.check_P(P)


def _networks(val, cfg_path: Path) -> list[dict]:
    if val is None:
        val = {}
    if isinstance(val, str):
        raw = _load_preset(val, cfg_path)
    elif isinstance(val, dict):
        raw = dict(val)
        if "preset" in raw:
            preset = raw.pop("preset")
            if not isinstance(preset, str):
                raise Err(f"network.preset: expected a file name, got {preset!r}")
            raw = {**_load_preset(preset, cfg_path), **raw}
    else:
        raise Err(f"network: expected a mapping or a preset file name, got {val!r}")
    model = raw.get("model", "alphabeta")
    if not isinstance(model, str) or model not in NETWORK_SPECS:
        raise Err(f"network.model: {limits.show(model)} is not allowed{did_you_mean(model, NETWORK_SPECS)}; allowed: "
                  f"{', '.join(NETWORK_SPECS)} (one model per network)")
    specs = validate_variants(raw, NETWORK_SPECS[model], "network")
    return [s.model_dump() for s in specs]


def _load_preset(name: str, cfg_path: Path) -> dict:
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
            data = _read_yaml(c, "network preset")
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


def _computes(val, cfg_path: Path) -> list[dict | None]:
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
            raise Err("; ".join(pyd_errors(e, DeviceProfile, "compute"))) from None
        bad = limits.check(prof, "compute")
        if bad:
            raise Err("; ".join(bad))
        out.append(prof.model_dump())
    return out


def _wl_key(tr):
    return None if tr is None else (tr[0].model, tr[0].density)


def _trainings(raw) -> list[tuple[TrainingSpec, tuple[str, BaseModel]]]:
    """(model, batch size and density, (schedule, params)) variants of a
    training config. ``model`` is a name, a list, or list entries
    ``{name, batch_size, density}`` pairing a model with its own settings."""
    models = raw["model"] if isinstance(raw["model"], list) else [raw["model"]]
    specs, errs = [], []
    for i, m in enumerate(models):
        entry = {"model": m} if not isinstance(m, dict) else \
            {("model" if k == "name" else k): v for k, v in m.items()}
        if "batch_size" in raw and "batch_size" not in entry:
            entry["batch_size"] = raw["batch_size"]
        try:
            specs += validate_variants(entry, TrainingSpec, f"model[{i}]" if isinstance(m, dict) else "")
        except Err as e:
            errs.append(str(e))
    if errs:
        raise Err("; ".join(errs))
    scheds = _named_entries(raw["schedules"], "schedules", SCHEDULES)
    return [(t, s) for t in specs for s in scheds]


def _stack(val):
    """The ``stack:`` section (:class:`~simsparse.schedules.stack.Stack`), or None."""
    from ..schedules.stack import Stack

    if val is None:
        return None
    if not isinstance(val, dict):
        raise Err(f"stack: expected a mapping of mechanisms ({', '.join(Stack.model_fields)}), got "
                  f"{limits.show(val)}")
    try:
        return Stack.model_validate(val)
    except ValidationError as e:
        raise Err("; ".join(pyd_errors(e, Stack, "stack"))) from None


def _algorithms(val) -> list[tuple[str, BaseModel]]:
    return _named_entries(val, "algorithms", ALGORITHMS)


def _default_algorithms(trainings) -> list[tuple[str, BaseModel]]:
    """The collectives of the schedules' papers (``Schedule.default_algorithm``),
    for a training config that lists no algorithms."""
    names, errs = [], []
    for sname in dict.fromkeys(s for _, (s, _) in trainings):
        default = get_schedule(sname).default_algorithm
        if not default:
            errs.append(f"schedules: {sname} names no default collective (default_algorithm); list 'algorithms'")
        elif default not in names:
            names.append(default)
    if errs:
        raise Err("; ".join(errs))
    return [(name, ALGORITHMS[name].Params()) for name in names]


def _named_entries(val, key: str, registry: dict) -> list[tuple[str, BaseModel]]:
    """A list of registered names or ``{name: ..., <params>}`` mappings, each
    expanded into its grid of validated params."""
    what = key.rstrip("s")
    if isinstance(val, str):
        val = [val]
    if not isinstance(val, list) or not val:
        raise Err(f"{key}: expected a non-empty list of {what} names or {{name: ..., <params>}} mappings")
    out, errs = [], []
    for i, entry in enumerate(val):
        where = f"{key}[{i}]"
        if isinstance(entry, str):
            name, params = entry, {}
        elif isinstance(entry, dict):
            params = dict(entry)
            name = params.pop("name", None)
        else:
            errs.append(f"{where}: expected a name or a mapping with 'name', got {entry!r}")
            continue
        try:
            cls = registry[name]
        except UnknownName as e:
            errs.append(f"{where}: {e}")
            continue
        try:
            for p in validate_variants(params, cls.Params, where):
                out.append((name, p))
        except Err as e:
            errs.append(str(e))
    if errs:
        raise Err("; ".join(errs))
    return out


# -- small helpers ---------------------------------------------------------------------

def _paragraph(path: Path, errors: list[str]) -> str:
    shown = errors[:6]
    more = f" (and {len(errors) - 6} more)" if len(errors) > 6 else ""
    return f"{path}: " + "; ".join(shown) + more + "."


def _read_yaml(path: Path, what: str):
    """A YAML file's content: a regular file of at most 1 MB (not a device,
    FIFO or folder), parsed safely; every failure as a :class:`ConfigError`."""
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
        text = data.decode("utf-8")
        if _flow_depth(text) > MAX_DEPTH:  # the parser takes seconds per thousand levels before it gives up
            raise RecursionError
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML{yaml_where(e, path)}.") from None
    except RecursionError:
        raise ConfigError(f"{path}: the {what} is nested too deeply to read.") from None
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
