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
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ...algorithms import ALGORITHMS
from ...registry import UnknownName
from ...schedules import SCHEDULES, get_schedule
from ...compute.models import missing_peak
from ...sampling import sampled_problem
from . import limits
from .errors import ConfigError, listing
from .grid import Err, check_size, collect, pyd_errors, validate_variants
from .hints import did_you_mean
from .point import Point
from . import sources
from .sources import PerP, network_problem, read_yaml
from .specs import RunSpec, TrainingSpec, WorkloadSpec



TOP_KEYS = ["name", "description", "network", "compute", "model", "batch_size", "schedules", "workload", "algorithms",
            "P", "iterations", "warmup", "check", "data_scale", "evaluation", "stack"]
#: keys the knob ``evaluation`` replaced, and what to write instead
REPLACED = {
    "engine": "evaluation: events_simpy for SimPy's engine (lean, the default, needs no key)",
    "values": "evaluation: sampled for sampled values, exact for full values of sparse algorithms, events for "
              "full values of every algorithm (auto, the default, needs no key)",
    "collectives": "evaluation: events for every collective as its messages, link_load for the flow-level waves "
                   "(auto, the default, needs no key)",
}
#: workload keys the top-level ``model`` decides in a training config
_MODEL_KEYS = ("model", "n", "layers", "source")


@dataclass
class Experiment:
    name: str
    path: Path
    points: list[Point]
    description: str = ""


# -- entry point -----------------------------------------------------------------

def load_config(path: str | Path, overrides: dict | None = None) -> Experiment:
    """The experiment a config file describes; ``overrides`` replace its
    top-level keys (``simsparse validate --ranks`` sets P and the name)."""
    path = Path(path)
    raw = read_yaml(path, "config")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a mapping of keys (name, network, workload, algorithms, P, ...), "
                          f"got {type(raw).__name__}.")
    raw = {**raw, **(overrides or {})}
    errors: list[str] = []
    old = [k for k in raw if k in REPLACED]
    if old:
        raise ConfigError(f"{path}: " + "; ".join(f"'{k}' was replaced by 'evaluation': write {REPLACED[k]}"
                                                   for k in old) + ". Allowed values of evaluation: fast (the "
                          "default), exact, events, sampled, or one evaluator's name (simsparse run --explain "
                          "lists them).")
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

    networks = PerP(raw.get("network"), lambda v: collect(errors, lambda: sources.networks(v, path)))
    computes = PerP(raw.get("compute", "ideal"), lambda v: collect(errors, lambda: sources.computes(v, path)))
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
    run_raw = {k: raw[k] for k in ("P", "iterations", "warmup", "check", "data_scale", "evaluation") if k in raw}
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
            measured = (comp or {}).get("models", {}).get(spec.model)
            if measured and measured.get("settings") and measured["batch_size"] != spec.batch_size:
                errors.append(f"compute: profile {comp.get('name')!r} holds {spec.model}'s times measured at batch "
                              f"{measured['batch_size']} ({measured['settings'].get('device')}); model.batch_size is "
                              f"{spec.batch_size}: set batch_size {measured['batch_size']}, or profile the model "
                              f"again (simsparse model profile --batch-size {spec.batch_size})")
                continue
            problem = comp is not None and not measured and missing_peak(
                spec.model, comp.get("name"), comp.get("peak_flops"), comp.get("peak_bf16_flops"))
            if problem:
                errors.append(f"compute: {problem}")
                continue
        if wl.n < run.P:
            errors.append(f"workload.n = {wl.n} is smaller than P = {run.P}; allowed: n >= P")
            continue
        problem = wl.check_P(run.P)
        if problem:
            errors.append(f"workload with P = {run.P}: {problem}")
            continue
        problem = network_problem(net, run.P)
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
                      evaluation=run.evaluation)
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
        problem = sampled_problem(point) if run.evaluation == "sampled" else None
        if problem:
            errors.append(f"evaluation: sampled with {aname}: {problem}")
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
        raise Err(listing(errs))
    scheds = _named_entries(raw["schedules"], "schedules", SCHEDULES)
    return [(t, s) for t in specs for s in scheds]


def _stack(val):
    """The ``stack:`` section (:class:`~simsparse.schedules.stack.Stack`), or None."""
    from ...schedules.stack import Stack

    if val is None:
        return None
    if not isinstance(val, dict):
        raise Err(f"stack: expected a mapping of mechanisms ({', '.join(Stack.model_fields)}), got "
                  f"{limits.show(val)}")
    try:
        return Stack.model_validate(val)
    except ValidationError as e:
        raise Err(listing(pyd_errors(e, Stack, "stack"))) from None


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
        raise Err(listing(errs))
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
        raise Err(listing(errs))
    return out


# -- small helpers ---------------------------------------------------------------------

def _paragraph(path: Path, errors: list[str]) -> str:
    return f"{path}: {listing(errors)}."


