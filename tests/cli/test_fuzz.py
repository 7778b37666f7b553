"""Fuzz the command line with malformed input: every case ends with exit 0
or 2, no traceback, within a time limit, and writes nothing outside its
results folder.

Three sources of cases, each a hypothesis strategy: mutations of the shipped
configs (and two tiny ones that really run), configs drawn from the schemas
of every section, and ``simsparse topo`` with presets, ``-P`` and ``--set``.
The CLI runs in-process under a small work budget (SIMSPARSE_BUDGET) and a
per-case alarm. The default suite draws a few dozen fixed cases;
``SIMSPARSE_FUZZ=long`` draws fresh ones, many more. ``SIMSPARSE_FUZZ_REPORT=FILE``
appends the figures of each test (cases, exit codes, tracebacks, hangs,
stray files) to FILE as JSON lines.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import shutil
import signal
import tempfile
import time
import types
import typing
from collections import Counter
from pathlib import Path

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simsparse.algorithms import ALGORITHMS
from simsparse.cli import main
from simsparse.compute.devices import DeviceProfile, builtin_profiles
from simsparse.experiments.config.specs import RunSpec, WorkloadSpec
from simsparse.network.spec import NETWORK_SPECS

from tests.helpers import REPO

LONG = os.environ.get("SIMSPARSE_FUZZ") == "long"
CASE_S = 60 if LONG else 40          # a case running longer is a hang
BUDGET = "points=6,seconds=3,memory_gb=0.5"


def fuzz_settings(default: int, long: int):
    return settings(max_examples=long if LONG else default, derandomize=not LONG, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


# -- running one case -------------------------------------------------------------------

class Hang(Exception):
    pass


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def run_case(argv: list[str], work: Path, allowed: str) -> dict:
    """Run the CLI in ``work``; what it returned and what it wrote elsewhere."""
    watched = [work.parent, REPO / "results"]
    before = {d: set(os.listdir(d)) if d.is_dir() else set() for d in watched}
    inside = _files(work)
    buf = io.StringIO()
    old_cwd, old_alarm = os.getcwd(), signal.signal(signal.SIGALRM, _alarm)
    os.chdir(work)
    t0 = time.monotonic()
    signal.alarm(CASE_S)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc, crash = main(argv), None
    except Hang:
        rc, crash = None, "hang"
    except BaseException as e:  # noqa: B036 - anything escaping main is a traceback
        rc, crash = None, f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_alarm)
        os.chdir(old_cwd)
    new = _files(work) - inside
    stray = sorted(f for f in new if not (f == allowed or f.startswith(allowed + os.sep)))
    stray += [f"{d}/{x}" for d in watched for x in (set(os.listdir(d)) if d.is_dir() else set()) - before[d]]
    return {"rc": rc, "crash": crash, "out": buf.getvalue(), "stray": stray, "written": new,
            "took_s": time.monotonic() - t0}


def _alarm(signum, frame):
    raise Hang


STATS: dict[str, Counter] = {}


def check_case(test: str, res: dict, argv) -> None:
    st_ = STATS.setdefault(test, Counter())
    st_["cases"] += 1
    st_[f"exit {res['rc']}"] += 1
    st_["tracebacks"] += res["crash"] not in (None, "hang") or "Traceback" in res["out"]
    st_["hangs"] += res["crash"] == "hang"
    st_["files outside"] += bool(res["stray"])
    st_["slowest_s"] = round(max(st_["slowest_s"], res["took_s"]), 2)
    what = f"{argv}:\n{res['out'][-3000:]}"
    assert res["crash"] is None, f"{res['crash']} for {what}"
    assert res["rc"] in (0, 2), f"exit {res['rc']} for {what}"
    assert "Traceback" not in res["out"], what
    assert not res["stray"], f"wrote outside the results folder: {res['stray']} for {what}"
    if res["rc"] == 2 and "stopped a point" not in res["out"]:
        assert not res["written"], f"a refused config wrote {sorted(res['written'])} for {what}"
        assert res["out"].count("error:") == 1 and res["out"].strip().count("\n") == 0, what


@pytest.fixture(autouse=True, scope="module")
def _report():
    yield
    path = os.environ.get("SIMSPARSE_FUZZ_REPORT")
    if path:
        with open(path, "a") as f:
            for test, c in STATS.items():
                f.write(json.dumps({"test": test, "long": LONG, **c}) + "\n")


@pytest.fixture(autouse=True)
def _budget(monkeypatch):
    monkeypatch.setenv("SIMSPARSE_BUDGET", BUDGET)


# -- values ------------------------------------------------------------------------------------

def _deep(depth: int):
    v = 1.0
    for _ in range(depth):
        v = [v]
    return v


SPECIAL = [0, -1, 1, 2, -1e-300, 1e-300, 1e308, -1e308, math.inf, -math.inf, math.nan, 2**31, 2**63, 10**30,
           0.5, 1.5, "", " ", "abc", "1e3", "inf", "nan", "-0", "ünï\u202ecödé\u0000", "🚀" * 3, "a" * 5000,
           True, False, None, [], {}, [[[]]], {"a": {"b": {"c": {}}}}, _deep(60), list(range(400)),
           "../../../etc/passwd", "/etc/passwd", "/dev/zero", "/dev/stdin", "/proc/self/mem", "/tmp", "~", ".",
           "..", "{P}", "%s%n", "${HOME}", "results/../../x", "C:\\\\windows"]

values = st.one_of(
    st.sampled_from(SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-2**70, max_value=2**70),
    st.text(max_size=20),
    st.lists(st.sampled_from(SPECIAL[:16]), min_size=1, max_size=4),
)


def _paths(tree, prefix=()):
    """Every (key path) of a YAML tree, mappings and lists alike."""
    yield prefix
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


def _mutate(tree, path, op, value):
    if not path:
        return value if op != "delete" else {}
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    if op == "delete":
        del parent[key]
    elif op == "grid" and isinstance(parent, dict):
        parent[key] = [parent[key], value]
    elif op == "sibling" and isinstance(parent, dict):
        parent[str(value)[:20] or "x"] = parent[key]
    else:
        parent[key] = value
    return tree


TINY = {
    "tiny_collective.yaml": {"name": "tiny", "network": {"model": "alphabeta", "alpha_s": 1e-6},
                             "workload": {"n": 600, "density": 0.05, "seed": 1},
                             "algorithms": ["ring", {"name": "oktopk", "tau": 2}, "topka"], "P": [2, 3],
                             "iterations": 1, "warmup": 0},
    "tiny_flow.yaml": {"name": "tiny_flow", "network": "ib_edr_fattree", "compute": "p100",
                       "workload": {"n": 500, "density": 0.1}, "algorithms": ["gtopk", "deft"], "P": 4,
                       "iterations": 1, "warmup": 0},
}
SHIPPED = {p.name: yaml.safe_load(p.read_text()) for p in sorted((REPO / "configs").glob("*.yaml"))}


@st.composite
def mutated_configs(draw):
    name, base = draw(st.sampled_from(sorted({**SHIPPED, **TINY}.items())))
    tree = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(tree))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "delete", "grid", "sibling"]))
        tree = _mutate(tree, path, op, copy.deepcopy(draw(values)))
    return name, tree


def _write(work: Path, name: str, tree, raw_text: str | None = None) -> Path:
    cfg = work / "cfg" / name
    cfg.parent.mkdir(parents=True, exist_ok=True)
    if not (work / "topologies").exists():  # the shipped configs name presets as topologies/<preset>.yaml
        shutil.copytree(REPO / "topologies", work / "topologies")
    if raw_text is None:
        raw_text = yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)
    cfg.write_text(raw_text, encoding="utf-8", errors="surrogatepass")
    return cfg


def _argv(cfg: Path, use_out: bool) -> tuple[list[str], str]:
    argv = ["run", str(cfg), "--no-plot"]
    if use_out:
        return argv + ["--out", "out"], "out"
    return argv, "results"


@pytest.mark.slow
@fuzz_settings(default=36, long=1500)
@given(case=mutated_configs(), use_out=st.booleans())
def test_mutated_configs(case, use_out):
    name, tree = case
    with tempfile.TemporaryDirectory() as td:
        work = Path(td) / "w"
        work.mkdir()
        cfg = _write(work, name, tree)
        argv, allowed = _argv(cfg.relative_to(work), use_out)
        check_case("mutated configs", run_case(argv, work, allowed), argv)


TEXT_EDITS = st.sampled_from(["[" * 3000 + "]" * 3000, "a: &a [1,2]\nb: &b [*a,*a,*a]\nc: [*b,*b,*b,*b]\n",
                              "\t", ": :", "{", "'", "!!python/object:os.system x", "x: 1" + "0" * 6000,
                              "\x00\xff", "--- 1\n--- 2\n", "- " * 500 + "1", "a: !!binary AAA\n",
                              "P: 2001-01-01\n", "? [a]\n: b\n"])


@fuzz_settings(default=10, long=300)
@given(base=st.sampled_from(sorted(SHIPPED)), cut=st.floats(0, 1), edit=TEXT_EDITS)
def test_mangled_yaml_text(base, cut, edit):
    text = (REPO / "configs" / base).read_text()
    at = int(cut * len(text))
    with tempfile.TemporaryDirectory() as td:
        work = Path(td) / "w"
        work.mkdir()
        cfg = _write(work, base, None, text[:at] + edit + text[at:])
        argv, allowed = _argv(cfg.relative_to(work), True)
        check_case("mangled yaml text", run_case(argv, work, allowed), argv)


# -- configs drawn from the schemas ------------------------------------------------------------

def _bounds(field) -> tuple[float | None, float | None]:
    lo = hi = None
    for m in field.metadata:
        if isinstance(m, (annotated_types.Ge, annotated_types.Gt)):
            lo = float(getattr(m, "ge", getattr(m, "gt", 0)))
        if isinstance(m, (annotated_types.Le, annotated_types.Lt)):
            hi = float(getattr(m, "le", getattr(m, "lt", 0)))
    return lo, hi


def field_values(field, wild: bool):
    """Values for one schema field: inside its bounds; ``wild``: also at them, or (one in ten) anything."""
    ann = field.annotation
    args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
    opts = []
    lo, hi = _bounds(field)
    for a in args:
        if typing.get_origin(a) is typing.Literal:
            opts.append(st.sampled_from(typing.get_args(a)))
        elif a is bool:
            opts.append(st.booleans())
        elif a is int:
            low = int(lo or 0)   # small values from the lower bound up (mtu_B starts at 576)
            opts.append(st.integers(low, int(min(hi if hi is not None else low + 64, low + 64))))
        elif a is float:
            opts.append(st.floats(lo if lo is not None else -10, min(hi if hi is not None else 1e3, 1e3),
                                  exclude_min=lo is not None, exclude_max=hi is not None))
            if wild:
                opts.append(st.sampled_from([x for x in (lo, hi) if x is not None] or [0.0]))
        elif a is str:
            opts.append(st.text(max_size=12))
        elif a is type(None):
            opts.append(st.none())
    plausible = st.one_of(*opts) if opts else st.sampled_from(SPECIAL[:14])
    if not wild:
        return plausible
    return st.integers(0, 9).flatmap(lambda i: st.sampled_from(SPECIAL[:14]) if i == 0 else plausible)


@st.composite
def section(draw, schema, keep: dict, wild: bool, p: float = 0.3, skip=()):
    out = dict(keep)
    for key, field in schema.model_fields.items():
        if key not in skip and key not in keep and draw(st.floats(0, 1)) < p:
            out[key] = draw(field_values(field, wild))
    return out


@st.composite
def schema_configs(draw):
    wild = draw(st.booleans())  # else every value within its field's bounds
    model = draw(st.sampled_from(sorted(NETWORK_SPECS)))
    net = draw(section(NETWORK_SPECS[model], {"model": model}, wild, 0.15, skip=("endpoints",)))
    compute = draw(st.one_of(st.sampled_from(["ideal", *builtin_profiles()]),
                             section(DeviceProfile, {"mem_bandwidth_Bps": 1e11}, wild, 0.4, skip=("models", "kernels"))))
    wl = draw(section(WorkloadSpec, {"n": draw(st.integers(1, 3000)), "density": draw(st.floats(0.001, 1))}, wild, 0.25,
                      skip=("source", "model", "layers")))
    algos = []
    for name in draw(st.lists(st.sampled_from(sorted(ALGORITHMS)), min_size=1, max_size=2, unique=True)):
        algos.append({"name": name, **draw(section(ALGORITHMS[name].Params, {}, wild, 0.3))})
    run = draw(section(RunSpec, {"P": draw(st.integers(1, 9)), "iterations": 1, "warmup": draw(st.integers(0, 1))},
                       wild, 0.2, skip=("iterations",)))
    return {"name": "schema", "network": net, "compute": compute, "workload": wl, "algorithms": algos, **run}


@fuzz_settings(default=24, long=1500)
@given(tree=schema_configs())
def test_schema_configs(tree):
    with tempfile.TemporaryDirectory() as td:
        work = Path(td) / "w"
        work.mkdir()
        cfg = _write(work, "schema.yaml", tree)
        argv, allowed = _argv(cfg.relative_to(work), True)
        check_case("schema configs", run_case(argv, work, allowed), argv)


# -- simsparse topo ------------------------------------------------------------------------------

PRESETS = sorted(p.stem for p in (REPO / "topologies").glob("*.yaml"))
ALL_NET_KEYS = sorted({k for s in NETWORK_SPECS.values() for k in s.model_fields})


@st.composite
def topo_args(draw):
    argv = ["topo", draw(st.one_of(st.sampled_from(PRESETS), st.sampled_from(["nope", "../configs/quickstart.yaml",
                                                                             "/etc/passwd", "/dev/zero", ""])))]
    argv += ["-P", str(draw(st.one_of(st.integers(1, 300), st.sampled_from([0, -3, 2**16, 2**20, 2**31, 10**20]),
                                      st.text(max_size=5))))]
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.one_of(st.sampled_from(ALL_NET_KEYS), st.text(max_size=8)))
        val = draw(values)
        text = val if isinstance(val, str) else yaml.safe_dump(val, default_flow_style=True).strip()
        text = text.removesuffix("\n...").replace("\n", " ")
        argv += ["--set", f"{key}={text}" if draw(st.integers(0, 9)) else key]
    if draw(st.integers(0, 5)) == 0:
        argv += ["--draw", "out/m.png"]
    return argv


@fuzz_settings(default=24, long=1500)
@given(argv=topo_args())
def test_topo_and_set_overrides(argv):
    with tempfile.TemporaryDirectory() as td:
        work = Path(td) / "w"
        work.mkdir()
        res = run_case(argv, work, "out")
        if isinstance(res["crash"], str) and res["crash"].startswith("SystemExit: 2"):
            res.update(crash=None, rc=2)  # argparse's own usage error (a bad -P): one line, exit 2
            res["out"] = res["out"].splitlines()[-1] if res["out"] else ""
        check_case("topo and --set", res, argv)
