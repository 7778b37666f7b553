"""``simsparse validate CONFIG [--testbed SPEC]``: calibrate, predict,
measure and compare in one command, on an emulated cluster or on this host.

1. **Calibrate** per rank count P of the config, unless a profile of the same
   machine exists: ``results/calibration/testbed-<name>-<P>r.yaml`` made on
   SPEC (its provenance names the description, which must be the same), or
   ``local-<P>r.yaml`` on this host.
2. **Predict**: every point of the config with ``network`` and ``compute``
   replaced by that profile (the testbed's own topology with the measured
   per-message costs; the kernels of this CPU), simulated with traces. A
   model the calibration did not time keeps the times the config's own
   ``compute:`` measured for it (``simsparse model profile``). Where the
   profile draws kernel noise, the points under the repeat limit are
   predicted R times, each with other draws, and compared by their median,
   as they are measured (:func:`_predict`; the draws in ``pred_runs/r<i>``).
3. **Measure** the same points with the real backend, on the testbed
   (rank i in host namespace i, MPI over TCP through the shaped links) or
   on this host; ``--repeats R`` times over, and per point the repeat of
   median time is compared (its trace too), the spread between repeats
   reported as the noise floor. The first repeat measures every point;
   the others only those it measured below ``--repeat-below`` seconds
   (default: every point, R = 3 on this host; on a testbed R = 5 below
   0.2 s). Two launches of a short point differ by far more than its
   iterations do (on the testbed at n <= 1e5 a p90 of 27 to 37 % between
   launches, docs/validation.md), while a point of seconds is decided by
   its links and moves by a few percent; the short points' repeats cost a
   few seconds of measurement each. Each repeat's steal time (the
   hypervisor running something else on this VM's CPUs) is logged, and a
   repeat that lost more than ``STEAL_WARN_S`` is named.
4. **Compare** per point and per phase, print the error table and write it
   beside the results: ``results/<name>_<machine>/{pred,meas,compare}``
   (the repeats in ``runs/r<i>``). Then predict every point again at the
   host's speed measured just before it (:func:`at_measured_speed`) and
   compare that too (``pred_speed``, ``compare_speed``).

Results are kept between runs: points already predicted or measured are
not run again (``--fresh`` starts over; ``--recalibrate`` measures the
profiles again too); predictions made with another profile move to
``pred/results.stale.csv``, so a new calibration is compared alone. The calibration is never fitted to
the runs it predicts: it uses its own sizes and seeds (:mod:`simsparse.calibration`).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...files import yaml_load
from ..config.schema import ConfigError, load_config
from ...files import atomic_write
from ..results.store import ResultsStore
from .repeats import error_on, median_phases, median_repeat, to_repeat
from .phases import COMMUNICATION, COMPUTE, by_kind, error_stats

#: a testbed's default: repeats of each point measured below REPEAT_BELOW_S in the first one
TESTBED_REPEATS, REPEAT_BELOW_S = 5, 0.2
#: steal time in one repeat above which it is named (quiet runs of 2026-11-26: 0.01 to 0.06 s per
#: measurement; the two that ran 1.3 to 1.7x slow at P = 4, n = 1e4: 2.0 and 2.3 s)
STEAL_WARN_S = 0.5


def profile_path(spec, P: int) -> Path:
    from ...calibration import DEFAULT_OUT, TESTBED_OUT
    from ...testbed.plan import testbed_name

    tmpl = DEFAULT_OUT if spec is None else TESTBED_OUT.replace("{name}", testbed_name(spec))
    return Path(tmpl.replace("{ranks}", str(P)))


def _usable(path: Path, spec) -> bool:
    """Whether a profile exists, was measured on this same machine, and the
    way the runs now run (a testbed's ranks bound to cores)."""
    if not path.is_file():
        return False
    prof = yaml_load(path.read_text()) or {}
    made_on = (prof.get("provenance") or {}).get("testbed")
    if spec is not None and "core_binding" not in (prof.get("compute") or {}):
        return False   # calibrated before the testbed bound its ranks to cores
    if spec is None or made_on is None:
        return made_on == spec
    if "congestion_control" not in made_on:
        return False   # calibrated before the testbed set its TCP: under the host's default (bbr here)
    try:   # a description written before a field was added reads as that field's default; its source is a citation
        return type(spec).model_validate(made_on).model_dump(exclude={"source"}) == spec.model_dump(exclude={"source"})
    except ValueError:
        return False


def ensure_profiles(spec, Ps, quick: bool, device: str, say, recalibrate: bool = False) -> dict[int, dict]:
    from ...calibration import CalibrationError, calibrate

    out = {}
    for P in Ps:
        path = profile_path(spec, P)
        if recalibrate or not _usable(path, spec):
            say(f"calibrating {'testbed ' + path.stem if spec is not None else 'this host'} with {P} ranks -> {path}")
            try:
                calibrate(device, P, path, quick=quick, testbed=spec,
                          command=f"simsparse validate (calibration of {P} ranks)")
            except CalibrationError as e:
                raise ConfigError(f"calibration for P = {P} failed: {e}") from None
        prof = yaml_load(path.read_text())
        out[P] = {"network": prof["network"], "compute": {**prof["compute"], "name": prof["compute"]["name"]},
                  "path": path}
    return out


def validate(config: str, testbed: str | None = None, out: str | None = None, fresh: bool = False,
             quick: bool = False, device: str = "cpu", timeout_s: float = 900, say=None,
             repeats: int | None = None, recalibrate: bool = False, repeat_below_s: float | None = None,
             ranks: list[int] | None = None) -> Path:
    """The loop of the module docstring; returns the comparison folder.
    ``ranks`` replaces the config's P, and the run is named
    ``<name>_p<P>`` (the stored suites: ``validate_testbed_p2`` is
    ``validate_testbed.yaml --ranks 2``)."""
    from ...testbed import load_spec
    from ...testbed.plan import testbed_name
    from ..run import measure as ms
    from .compare import run_compare
    from ..run.plan import with_plan
    from ..results.provenance import git_commit, host, now

    say = say or (lambda m: print(f"simsparse: {m}", file=sys.stderr, flush=True))
    spec = load_spec(testbed) if testbed else None
    machine = f"testbed-{testbed_name(spec)}" if spec is not None else "host"
    log = {"config": str(config), "testbed": testbed, "machine": machine, "started_at": now(), "git": git_commit(),
           "host": host()}
    overrides = _ranks_override(config, ranks)
    if overrides:
        log["ranks"] = overrides["P"]
    Ps = _rank_counts(config, overrides)
    _check_before_calibrating(config, spec, Ps, overrides)
    with _stage(log, "calibrate"):
        profiles = ensure_profiles(spec, Ps, quick, device, say, recalibrate)
    exp = load_config(config, overrides)
    log["name"] = exp.name
    base = Path(out) if out else Path("results") / f"{exp.name}_{machine}"
    log["profiles"] = {P: str(v["path"]) for P, v in profiles.items()}
    with _stage(log, "layers"):
        timed = _held_out_layers(exp.points, profiles, base, device, say)
    points = [replace(p, network=profiles[p.P]["network"],
                      compute=_with_models(_with_models(profiles[p.P]["compute"], p.compute), {"models": timed.get(p.P)}),
                      data_scale=1.0) for p in exp.points]

    R = repeats or (TESTBED_REPEATS if spec is not None else 3)
    below = repeat_below_s if repeat_below_s is not None else (REPEAT_BELOW_S if spec is not None else np.inf)
    with _stage(log, "predict"):
        _predict(base / "pred", points, R, below, fresh, say, exp.name)

    ms.check_prerequisites()
    groups = ms.group_points([with_plan(p) for p in points])
    runs = [ResultsStore(base / ("meas" if R == 1 else f"runs/r{r}"), fresh=fresh) for r in range(1, R + 1)]
    with _stage(log, "measure"):
        for r, store in enumerate(runs, 1):   # whole repeats one after the other: a disturbance of a few
            wanted = list(groups) if r == 1 else to_repeat(runs[0], groups, below)   # seconds hits one repeat
            todo = [groups[mid][0] for mid in wanted if not (store.has(mid) and store.has_trace(mid))]
            which = "" if r == 1 or below == np.inf else f", the points under {below:g} s"
            say(f"measuring {len(todo)} of {len(groups)} real runs on {machine}"
                + (f" (repeat {r} of {R}{which})" if R > 1 else ""))
            with _stage(log, f"measure r{r}"):
                _measure_into(store, todo, groups, spec, device, timeout_s)
            steal = log[f"measure r{r}"]["steal_s"]
            if steal > STEAL_WARN_S:
                say(f"repeat {r} lost {steal} s to steal time (the hypervisor running something else on this "
                    f"machine's CPUs; quiet runs lose under 0.1 s): its times may be slow")
        if R > 1:
            spread = median_repeat(runs, list(groups), ResultsStore(base / "meas", fresh=True))
            log["repeat_spread"] = {**spread, **median_phases(runs, spread["repeated"], base / "meas")}
    cmp_dir = base / "compare"
    cmp = run_compare(base / "pred", base / "meas", out=cmp_dir,
                      warn=lambda m: say(m.removeprefix("simsparse: ")))
    if R > 1:
        log["repeat_spread"]["model"] = error_on(cmp.points, log["repeat_spread"]["repeated"])
        if len(cmp.phases):
            log["repeat_spread"]["model_phases"] = error_on(cmp.phases, log["repeat_spread"]["repeated"])
            for kind in (COMMUNICATION, COMPUTE):
                log["repeat_spread"][f"model_{kind}"] = error_on(cmp.phases[cmp.phases["kind"] == kind],
                                                                 log["repeat_spread"]["repeated"])
    with _stage(log, "predict at measured speed"):
        log["slowdown"] = at_measured_speed(points, profiles, ResultsStore(base / "meas"), base, say, R, below)
    log["finished_at"] = now()
    atomic_write(cmp_dir / "validate.json", lambda tmp: Path(tmp).write_text(json.dumps(log, indent=1)))
    if R > 1:
        sp = log["repeat_spread"]
        say(f"measured time per point, (max - min) / median over up to {R} repeats ({sp['points']} points "
            f"measured more than once): median {100 * sp['median']:.1f}%, p90 {100 * sp['p90']:.1f}% (the noise "
            f"floor of the errors above)")
        say(f"one repeat against the median of the others: median {100 * sp['one_vs_rest_median']:.1f}%, p90 "
            f"{100 * sp['one_vs_rest_p90']:.1f}% (what a perfect model would score against one measurement); the "
            f"prediction on the same {sp['model']['points']} points: median {100 * sp['model']['median']:.1f}%, "
            f"p90 {100 * sp['model']['p90']:.1f}%")
        for what, floor, model in (("per phase (each phase's median over the repeats)", "phases", "model_phases"),
                                   ("communication phases alone (a message in the phase)", COMMUNICATION,
                                    "model_communication"),
                                   ("compute phases alone (kernels only)", COMPUTE, "model_compute")):
            if model in sp and floor + "_one_vs_rest_median" in sp:
                say(f"{what}: one repeat against the median of the others: median "
                    f"{100 * sp[floor + '_one_vs_rest_median']:.1f}%, p90 {100 * sp[floor + '_one_vs_rest_p90']:.1f}%; "
                    f"the prediction on the same {sp[model]['points']} phases: median {100 * sp[model]['median']:.1f}%, "
                    f"p90 {100 * sp[model]['p90']:.1f}%")
    m = log["measure"]
    say(f"load average before and after measuring: {m['load_before']} and {m['load_after']}; steal time "
        f"{m['steal_s']} s in {m['wall_s']} s x {os.cpu_count()} CPUs (all stages in {cmp_dir / 'validate.json'})")
    return cmp_dir


def _measure_into(store, todo, groups, spec, device: str, timeout_s: float) -> None:
    """One measurement of the ``todo`` points into ``store`` (rows and traces)."""
    from ...testbed import Testbed
    from ..run import measure as ms

    def save(_p, o):
        store.save_trace(o.row["point_id"], o.trace)
        store.add(o.row)

    for P in dict.fromkeys(p.P for p in todo):
        batch = [p for p in todo if p.P == P]
        with (Testbed(spec, P) if spec is not None else contextlib.nullcontext()) as tb:
            ms.measure_points(batch, device=device, trace=True, timeout_s=timeout_s, members=groups,
                              on_point=save, testbed=tb, speed_probe=True)
    store.combine_traces(True)


#: the host's speed at a point: the median probe of this many consecutive points of its launch
SPEED_WINDOW = 5


def _smoothed(probed: list) -> list:
    """(point, slowdown) in measured order, each slowdown replaced by the median over the
    :data:`SPEED_WINDOW` points of the same P (one launch) centred on it. One probe is about 20 ms
    of kernels: on the tree at P = 8 consecutive points' probes jumped between 0.92 and 1.45 while
    the points around them ran at one speed, so a single probe adds its own noise to a short
    point's prediction; the host's drift, which the scaling is for, spans minutes."""
    out, half = [], SPEED_WINDOW // 2
    for P in dict.fromkeys(p.P for p, _ in probed):
        run = [(p, k) for p, k in probed if p.P == P]
        ks = np.array([k for _, k in run])
        out += [(p, float(np.median(ks[max(0, i - half):i + half + 1]))) for i, (p, _) in enumerate(run)]
    return out


def at_measured_speed(points, profiles, meas, base: Path, say, repeats: int = 1,
                      below: float = np.inf) -> dict | None:
    """Every point predicted again with its CPU work scaled by the host's speed when it was measured
    (``DeviceProfile.slowdown``: the rows' speed probes over the profile's,
    :mod:`simsparse.compute.speed_probe`, as the median over its neighbours, :func:`_smoothed`) into
    ``pred_speed``, compared into ``compare_speed``.
    The prediction as calibrated stays the headline; this one says how much of the error the host's
    state at measurement explains. Returns the slowdowns' median, min and max (None without probes)."""
    from ...compute.speed_probe import cpu_slowdown, slowdown
    from ..run.measure import measured_id
    from ..run.plan import with_plan
    from .compare import run_compare

    probed, cpu = [], []
    for p in points:
        row = meas.rows.get(measured_id(with_plan(p)))
        k = slowdown(row, profiles[p.P]["compute"]) if row else None
        if k is not None:
            probed.append((p, k))
            cpu.append((p, cpu_slowdown(row, profiles[p.P]["compute"])))
    scaled = [replace(p, compute={**p.compute, "slowdown": k, "cpu_slowdown": c})
              for (p, k), (_, c) in zip(_smoothed(probed), _smoothed(cpu))]
    if not scaled:
        say("no speed probe in the measurement or the profile (made before the probe): no prediction at the "
            "measured speed")
        return None
    ks = np.array([p.compute["slowdown"] for p in scaled])
    cs = np.array([p.compute["cpu_slowdown"] for p in scaled])
    say(f"the host ran the speed probe {np.median(ks):.3f}x its calibrated time at the median point "
        f"(min {ks.min():.3f}, max {ks.max():.3f}; each point's the median of the {SPEED_WINDOW} probes of its "
        f"launch around it), its top-k {np.median(cs):.3f}x: predicting {len(scaled)} points again with the "
        f"kernels at the first speed and the ranks' and the stack's CPU at the second")
    _predict(base / "pred_speed", scaled, repeats, below, True, lambda m: None)
    c = run_compare(base / "pred_speed", base / "meas", out=base / "compare_speed", echo=lambda m: None,
                    allow_partial=len(scaled) < len(points))
    med, p90 = error_stats(c.points["rel_err"])
    kinds = by_kind(c.phases)
    phases = "".join(f"; {kind} phases {100 * m:.1f}% / {100 * q:.1f}%" for kind, (_, m, q) in kinds.items())
    say(f"at the measured speed: median |error| {100 * med:.1f}%, p90 {100 * p90:.1f}%{phases} "
        f"({base / 'compare_speed' / 'compare.csv'})")
    return {"median": float(np.median(ks)), "min": float(ks.min()), "max": float(ks.max()),
            "cpu_median": float(np.median(cs)),
            "points": len(scaled), "error_median": med, "error_p90": p90,
            **{f"{kind}_phases": {"median": m, "p90": q, "pairs": n} for kind, (n, m, q) in kinds.items()}}


def _predict(folder: Path, points, R: int, below: float, fresh: bool, say, name: str = "") -> None:
    """Every point simulated with traces into ``folder`` (a results store), resuming what it holds.
    Where the profiles draw kernel noise (:mod:`simsparse.compute.noise`) and R > 1, the prediction
    is repeated as the measurement is: a point the first prediction puts below ``below`` seconds is
    simulated R times, with noise seeds 0 to R - 1 (``DeviceProfile.noise_seed``: each its own set of
    draws) into ``<folder>_runs/r<i>``, and ``folder`` holds the median repeat and each phase's median
    (:func:`~.repeats.median_repeat`, :func:`~.repeats.median_phases`): one draw of the noise is one
    launch of the model, and the measurement it is compared with is the median of R launches."""
    from ...compute.noise import draws_noise

    R = R if any(draws_noise(p.compute) for p in points) else 1
    runs = [folder] if R == 1 else [folder.parent / f"{folder.name}_runs" / f"r{i}" for i in range(1, R + 1)]
    ids = {p.point_id("sim") for p in points}
    stores = []
    for i, where in enumerate(runs):
        store = ResultsStore(where, fresh=fresh)
        stale = store.retain(ids)   # predictions made with an earlier profile: as `run` does with an edited config
        store.prune_traces(ids)
        if stale and i == 0:
            say(f"moved {stale} predictions made with another profile to {where / 'results.stale.csv'}")
        wanted = points if i == 0 else [p for p in points if stores[0].rows[p.point_id("sim")]["time_s"] < below]
        todo = [p for p in wanted if not (store.has(p.point_id("sim")) and store.has_trace(p.point_id("sim")))]
        if i == 0:
            say(f"predicting {len(todo)} of {len(points)} points of {name}"
                + (f" (and again with {R - 1} other draws of the kernel noise, the points under {below:g} s)"
                   if R > 1 else ""))
        for p in todo:
            _predict_into(store, replace(p, compute={**p.compute, "noise_seed": i}) if i else p, p.point_id("sim"))
        store.combine_traces(True)
        stores.append(store)
    if R > 1:
        order = [p.point_id("sim") for p in points]
        median_repeat(stores, order, ResultsStore(folder, fresh=True))
        median_phases(stores, order, folder)


def _predict_into(store, point, pid: str) -> None:
    """Simulate ``point`` with traces into ``store`` (its row and trace) as point ``pid``."""
    from ..run.runner import simulate_point

    o = simulate_point(point, trace=True)
    store.save_trace(pid, [{**t, "point_id": pid} for t in o.trace] if o.row["point_id"] != pid else o.trace)
    store.add({**o.row, "point_id": pid})


def _held_out_layers(points, profiles: dict, base: Path, device: str, say) -> dict:
    """Per rank count: the layer times of each training point's model at its batch where the
    calibration did not time it (it times the tuned suite's model at one batch) and the config's own
    profile holds none, timed on that many ranks at once by calibrate's clock
    (:func:`simsparse.calibration.time_layers`). A held-out model is then predicted from its
    measured layers, as the tuned one is, not from the roofline. Kept in ``base/layers.json``
    and read back on a later run."""
    from ...calibration import layer_reps, layer_times, time_layers

    want = {}
    for p in points:
        model = (p.workload or {}).get("model")
        if p.schedule is None or not model:
            continue
        if model not in _with_models(profiles[p.P]["compute"], p.compute).get("models", {}):
            want.setdefault(p.P, set()).add((model, p.batch_size))
    cache = base / "layers.json"
    kept = json.loads(cache.read_text()) if cache.is_file() else {}
    out = {}
    for P, models in sorted(want.items()):
        for model, bs in sorted(models):
            key = f"{model}@{bs}x{P}"
            if key not in kept:
                say(f"timing {model}'s layers at batch {bs} on {P} ranks (the calibration did not time it)")
                kept[key] = time_layers(device, [model], bs, layer_reps(P), ranks=P)[model]
                base.mkdir(parents=True, exist_ok=True)
                atomic_write(cache, lambda tmp: Path(tmp).write_text(json.dumps(kept)))
            out.setdefault(P, {}).update(layer_times({model: kept[key]})[1])
    return out


def _with_models(calibrated: dict, named: dict | None) -> dict:
    """The calibrated profile, with the measured model times of the profile the config names
    (``simsparse model profile``'s) for the models calibrate did not time: a user's own model keeps
    the times measured on this machine rather than the calibrated roofline."""
    mine = (named or {}).get("models") or {}
    extra = {k: v for k, v in mine.items() if k not in (calibrated.get("models") or {})}
    return {**calibrated, "models": {**(calibrated.get("models") or {}), **extra}} if extra else calibrated


def _ranks_override(config: str, ranks: list[int] | None) -> dict | None:
    """The config keys ``--ranks`` replaces: P, and the name with ``_p<P>`` for each rank count."""
    if not ranks:
        return None
    from ..config.sources import read_yaml

    raw = read_yaml(Path(config), "config")
    name = raw.get("name", Path(config).stem) if isinstance(raw, dict) else Path(config).stem
    Ps = sorted(set(ranks))
    return {"P": Ps, "name": f"{name}_" + "_".join(f"p{P}" for P in Ps)}


def _check_before_calibrating(config: str, spec, Ps, overrides: dict | None = None) -> None:
    """Read the config before the calibration's minutes (about 12 per rank
    count on a testbed): its error is raised now unless the config names a
    profile that this calibration is about to write (``network:`` or
    ``compute:`` naming one of :func:`profile_path`'s files, ``{P}`` for the
    rank count)."""
    from ..config.sources import read_yaml

    try:
        load_config(config, overrides)
    except ConfigError:
        raw = read_yaml(Path(config), "config")
        made = {profile_path(spec, P).name for P in Ps}
        named = {Path(v.replace("{P}", str(P))).name for k in ("network", "compute")
                 if isinstance(v := raw.get(k), str) for P in Ps}
        if not named & made:
            raise


def _rank_counts(config: str, overrides: dict | None = None) -> list[int]:
    """The config's rank counts, read before the config is checked (its ``network:`` may name a
    profile that the calibration is about to write); a config that does not give them plainly
    gets load_config's own error."""
    from ..config.sources import read_yaml

    raw = read_yaml(Path(config), "config")
    Ps = {**raw, **(overrides or {})}.get("P") if isinstance(raw, dict) else None
    Ps = [Ps] if isinstance(Ps, int) else Ps
    if not (isinstance(Ps, list) and Ps and all(isinstance(P, int) and not isinstance(P, bool) and P >= 1
                                                   for P in Ps)):
        load_config(config, overrides)   # raises the error that names the key
        raise ConfigError(f"{config}: P = {Ps!r} is not allowed here: validate needs P as an integer or a list of "
                          f"integers >= 1")
    return sorted(set(Ps))


@contextlib.contextmanager
def _stage(log: dict, name: str):
    """Record a stage's wall time, the load average (1 minute) before and after it, and the CPU time
    the hypervisor took from this virtual machine meanwhile (steal, summed over its CPUs)."""
    t0, before, steal = time.time(), _load(), _steal()
    yield
    log[name] = {"wall_s": round(time.time() - t0, 1), "load_before": before, "load_after": _load(),
                 "steal_s": round(_steal() - steal, 2)}


def _steal() -> float:
    """Seconds of steal time since boot, all CPUs (/proc/stat; NaN where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _load() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
