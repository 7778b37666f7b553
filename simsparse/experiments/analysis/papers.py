"""The seeds' headline experiments replayed: the paper's number beside ours.

The papers' numbers are data (``simsparse/data/papers/<paper>.yaml``), each
with its citation (table, figure or sentence) and kept apart from what
predicts them: one config per experiment in ``configs/papers/``. A claim
says how to read our number from the experiment's results:

``{col: t_iter_s, where: {...}}``
    the value of a results column in the one row matching ``where``
    (``minus_phases: [select]``: less the time of those phases, for a
    benchmark whose input comes already selected);
``{ratio: [A, B]}``
    A / B for two such expressions;
``{phase: [names], where: {...}}``
    from the point's trace: per rank the span of the records of those
    phases, the slowest rank, weighted over the measured iterations;
``{speedups: {col, where, over: {...}}}``
    the range [min, max] of ``row / base`` over the rows matching ``where``
    other than the base row ``over`` (the paper's "outperforms the others
    by a-b x");
``{range: [A, B, ...]}``
    [min, max] of several expressions (a speed-up "from a to b" over P);
``{lowest: {col or phase, where, expect: {...}}}``
    whether the row with the lowest ``col`` (or ``phase`` span) among ``where`` matches ``expect``
    (the paper's "X is the fastest", "X has the lowest overhead");
``{holds: [A, "<" or ">", B]}``
    whether the relation holds (the paper's orderings and crossovers);
    ``{const: c}`` is a constant.

A ``from: <experiment>`` key reads another experiment's results (a claim
across two configs, e.g. two networks). ``where`` matches columns by value; ``params`` and ``schedule_params`` as a
subset of the row's JSON. A claim's ``paper`` is a number, a [lo, hi] range
or ``true`` / ``false`` (a stated relation). The aim: a number within 25 %,
a range's ends within 25 % and, for a ratio, on the paper's side of 1; an
efficiency within 10 points; a relation that holds (:func:`verdict`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd
import yaml
from ...files import yaml_load
from pydantic import BaseModel, ConfigDict, Field, ValidationError

REPO_ROOT = Path(__file__).resolve().parents[3]
#: |ours / paper - 1| counted as agreement (issue 22's aim)
TOLERANCE = 0.25
#: an efficiency's agreement, in percentage points
POINTS = 10


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    what: str
    source: str = Field(description="where the paper states it: table, figure or the sentence")
    paper: float | list[float] | bool
    unit: str = ""
    ours: dict


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str = Field(description="path of the config, relative to the repository")
    trace: bool = Field(False, description="run with --trace (claims that read phases)")
    smoke: dict = Field(default_factory=dict, description="config keys replaced for the reduced CI run")
    claims: list[Claim]


class Paper(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    title: str
    experiments: dict[str, Experiment]


class PapersError(Exception):
    """A paper data file or a name on the command line that cannot be used."""


def load_papers() -> dict[str, Paper]:
    """Every paper of ``simsparse/data/papers`` by name."""
    out = {}
    for f in sorted(resources.files("simsparse").joinpath("data", "papers").iterdir()):
        if not f.name.endswith(".yaml"):
            continue
        try:
            paper = Paper.model_validate(yaml_load(f.read_text()))
        except (ValidationError, yaml.YAMLError) as e:
            raise PapersError(f"simsparse/data/papers/{f.name}: {e}") from None
        out[paper.name] = paper
    return out


def select(papers: dict[str, Paper], names: list[str]) -> list[tuple[Paper, str, Experiment]]:
    """(paper, experiment name, experiment) for each paper or experiment named (all when none)."""
    chosen = []
    for name in names or list(papers):
        hits = [(p, e, x) for p in papers.values() for e, x in p.experiments.items() if name in (p.name, e)]
        if not hits:
            allowed = sorted(set(papers) | {e for p in papers.values() for e in p.experiments})
            raise PapersError(f"papers: {name!r} is neither a paper nor an experiment; allowed: {', '.join(allowed)}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


# -- our side of a claim --------------------------------------------------------------------

@dataclass
class Results:
    """An experiment's results rows and, for phase claims, its per-point
    traces; ``others``: the other experiments' results by name (``from:``)."""

    rows: pd.DataFrame
    trace_dir: Path | None = None
    others: dict = field(default_factory=dict)


def _matches(row: pd.Series, where: dict) -> bool:
    for key, want in where.items():
        if key in ("params", "schedule_params"):
            got = row.get(key)
            have = json.loads(got) if isinstance(got, str) and got else {}
            if any(have.get(k) != v for k, v in want.items()):
                return False
        elif key not in row or str(row[key]) != str(want):
            return False
    return True


def _rows(res: Results, where: dict) -> pd.DataFrame:
    mask = [_matches(r, where) for _, r in res.rows.iterrows()]
    return res.rows[mask] if len(res.rows) else res.rows


def _one(res: Results, where: dict) -> pd.Series:
    rows = _rows(res, where)
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} rows match {where}")
    return rows.iloc[0]


def _phase_time(res: Results, row: pd.Series, phases: list[str]) -> float:
    """The slowest rank's span of ``phases`` (and the phases nested in them,
    ``split_reduce/allgather``), weighted over the measured iterations."""
    if res.trace_dir is None:
        raise LookupError("phase claims need the experiment's trace (trace: true)")
    tr = pd.read_csv(res.trace_dir / f"{row['point_id']}.csv")
    tr = tr[tr["phase"].astype(str).map(lambda ph: any(ph == p or ph.startswith(p + "/") for p in phases))]
    if "weight" in tr:
        tr = tr[tr["weight"] > 0]
    if tr.empty:
        raise LookupError(f"no trace records of phases {phases}")
    span = tr.groupby(["iteration", "rank"]).agg(start=("start_s", "min"), end=("end_s", "max"))
    per_it = (span["end"] - span["start"]).groupby("iteration").max()
    if "weight" in tr:
        w = tr.groupby("iteration")["weight"].first().reindex(per_it.index)
        return float((per_it * w).sum() / w.sum())
    return float(per_it.mean())


def evaluate(expr: dict, res: Results):
    """Our number, [lo, hi] range or truth value for a claim's ``ours``."""
    if "from" in expr:
        other = res.others.get(expr["from"])
        if other is None:
            raise LookupError(f"the results of experiment {expr['from']!r} are not at hand")
        return evaluate({k: v for k, v in expr.items() if k != "from"}, other)
    if "col" in expr:
        row = _one(res, expr.get("where", {}))
        value = float(row[expr["col"]])
        if expr.get("minus_phases"):
            try:
                value -= _phase_time(res, row, list(expr["minus_phases"]))
            except LookupError as e:
                if "no trace records" not in str(e):
                    raise
        return value
    if "phase" in expr:
        return _phase_time(res, _one(res, expr.get("where", {})), list(expr["phase"]))
    if "ratio" in expr:
        a, b = (evaluate(e, res) for e in expr["ratio"])
        return a / b
    if "speedups" in expr:
        s = expr["speedups"]
        base = _one(res, {**s.get("where", {}), **s["over"]})
        others = [r for _, r in _rows(res, s.get("where", {})).iterrows() if r["point_id"] != base["point_id"]]
        if not others:
            raise LookupError(f"no rows besides the base {s['over']}")
        vals = [float(r[s["col"]]) / float(base[s["col"]]) for r in others]
        return [min(vals), max(vals)]
    if "range" in expr:
        vals = [evaluate(e, res) for e in expr["range"]]
        return [min(vals), max(vals)]
    if "lowest" in expr:
        s = expr["lowest"]
        rows = _rows(res, s.get("where", {}))
        if rows.empty:
            raise LookupError(f"no rows match {s.get('where', {})}")
        value = {k: v for k, v in s.items() if k in ("col", "minus_phases", "phase")}
        vals = [evaluate({**value, "where": {"point_id": r["point_id"]}}, res) for _, r in rows.iterrows()]
        return _matches(rows.iloc[vals.index(min(vals))], s["expect"])
    if "const" in expr:
        return float(expr["const"])
    if "holds" in expr:
        a, op, b = expr["holds"]
        x, y = evaluate(a, res), evaluate(b, res)
        return bool(x < y) if op == "<" else bool(x > y)
    raise PapersError(f"claim expression {expr}: expected one of col, phase, ratio, speedups, range, lowest, "
                      f"const, holds")


def verdict(paper, ours, unit: str = "") -> tuple[str, bool | None]:
    """(ours against the paper as text, whether it meets the aim); None when ours is missing.

    * a relation: it holds as the paper says;
    * an efficiency (``unit: efficiency``, a fraction): within :data:`POINTS` percentage points
      (a number capped at 100 % leaves a relative band little room to fail);
    * a number or a range: every end within :data:`TOLERANCE` of the paper's; for a ratio
      (``unit: x``) every end also on the paper's side of 1, so a speed-up the paper states is
      not met by a slowdown within the band."""
    if ours is None:
        return "-", None
    if isinstance(paper, bool):
        return "holds" if ours == paper else "does not hold", ours == paper
    if unit == "efficiency":
        d = 100 * (ours - paper)
        return f"{d:+.1f} pt", abs(d) <= POINTS
    ends, mine = (paper, ours) if isinstance(paper, list) else ([paper], [ours])
    r = [o / p for o, p in zip(mine, ends)]
    ok = all(abs(x - 1) <= TOLERANCE for x in r)
    if unit == "x":
        ok = ok and all((o > 1) == (p > 1) and (o < 1) == (p < 1) for o, p in zip(mine, ends))
    return " / ".join(f"{x:.2f}" for x in r), ok


def compare(paper: Paper, name: str, exp: Experiment, res: Results) -> list[dict]:
    """One row per claim: the paper's value beside ours."""
    out = []
    for c in exp.claims:
        try:
            ours, note = evaluate(c.ours, res), ""
        except (LookupError, KeyError, ZeroDivisionError, FileNotFoundError) as e:
            ours, note = None, f"not computed: {e}"
        ratio, ok = verdict(c.paper, ours, c.unit)
        out.append({"paper": paper.name, "experiment": name, "claim": c.id, "what": c.what, "unit": c.unit,
                    "source": c.source, "paper_value": _show(c.paper), "ours": _show(ours), "ours_exact": _exact(ours),
                    "ratio": ratio,
                    "meets_aim": ok, "note": note})
    return out


def _show(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return " to ".join(_num(x) for x in v)
    return _num(v)


def _exact(v) -> str:
    """``ours`` to 9 significant digits (what the pinned test compares: any change of a simulated
    time shows in its diff)."""
    if v is None or isinstance(v, bool):
        return _show(v)
    return " to ".join(f"{x:.9g}" for x in (v if isinstance(v, list) else [v]))


def _num(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return str(x)
    return f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}"
