"""The scale table: wall time and peak memory of each row with the defaults,
the budget's estimate of both beside them, the event path where it finishes,
and the growth exponent in P.

    python benchmarks/bench_scale.py                                     # every row, P up to its target
    python benchmarks/bench_scale.py --case ab_oktopk --P 256 1024 4096 --cap 600
    python benchmarks/bench_scale.py --path both                         # and the events beside them

Rows (one iteration of the config, as ``simsparse run`` runs it: the loop
adds an iteration of each kind of an algorithm's periodic work it would
otherwise miss; no check), every one with no setting beyond model, network,
P and ``data_scale`` (``evaluation: fast``, the default):

* ``ab_oktopk``, ``ab_topka``, ``ab_gaussiank``, ``ab_ring``: 1M float32,
  1 %, on ``aries_alphabeta``; target P = 4096;
* ``flow_ring``: the ring of 1M float32 on the FDR fat tree; target P = 1024;
* ``bert_oktopk``: Ok-Topk of BERT-base (133.5M, 1 %) on ``piz_daint_aries``
  with P100 compute at ``data_scale: 0.01``; ``bert_oktopk_ds0.1`` at 0.1;
  target P = 1024;
* ``bert_omgs``: one BERT-base iteration, ``omgs_sgd`` over Ok-Topk, same
  machine (the plan's simulated microbenchmarks included); target P = 1024;
* ``bert_paper``: ``configs/papers/oktopk_bert.yaml`` (every scheme) at P = 256;
  ``bert_paper_daint``: the same on the flow-level Piz Daint it ran on.

``--path`` names the evaluation (``fast``, ``exact``, ``events`` or an
evaluator's name); ``both`` runs ``fast`` and ``events`` side by side, and
``err`` is the relative difference of their simulated times. The columns
``evaluator``, ``bound`` and ``values`` are the rows' own. ``est s`` and
``est MB`` are the budget's estimate before the run (``budget.point_estimate``).
Each point runs in a fresh process that writes the case as a YAML config,
loads it with the config loader and simulates every point with
``simulate_point``. Peak RSS is the process's own (``ru_maxrss``). ``jit s``
is the part of the wall time numba spent compiling: 0 once its disk cache
holds the point's functions. ``msgs/it`` is the points' simulated messages
in one timed iteration (``msgs_total``, summed over the points), ``msgs/s``
that over the wall time. A point is killed at ``--cap`` seconds; a larger P
is skipped when the last one, scaled by the growth seen so far (P^2 before
two points exist), would pass the cap, or when its peak RSS scaled linearly
in P would pass ``--max-rss-gb``. The load average is printed with every
point: measure with nothing else running. ``--out FILE.csv`` also writes the
rows as CSV and ``FILE.provenance.json`` beside it (commit, host, start and
end, loads, the command): ``simsparse report`` renders the README's scale
line and ``docs/performance.md``'s table from them.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from simsparse.experiments.results.provenance import git_commit, host, now

ROOT = Path(__file__).resolve().parent.parent
VEC = {"n": 1048576, "density": 0.01, "dtype": "float32", "seed": 0}
BERT = {"model": "bert_base", "density": 0.01, "seed": 0}
CASES = {   # (config, the P the issue targets); every key not named is the default (evaluation: fast)
    "ab_oktopk": (dict(network="aries_alphabeta", workload=VEC, algorithms=["oktopk"]), 4096),
    "ab_topka": (dict(network="aries_alphabeta", workload=VEC, algorithms=["topka"]), 4096),
    "ab_gaussiank": (dict(network="aries_alphabeta", workload=VEC, algorithms=["gaussiank"]), 4096),
    "ab_ring": (dict(network="aries_alphabeta", workload=VEC, algorithms=["ring"]), 4096),
    "flow_ring": (dict(network="ib_fdr_fattree", workload=VEC, algorithms=["ring"]), 1024),
    "bert_oktopk": (dict(network="piz_daint_aries", compute="p100", algorithms=["oktopk"], data_scale=0.01,
                         workload=BERT), 1024),
    "bert_oktopk_ds0.1": (dict(network="piz_daint_aries", compute="p100", algorithms=["oktopk"], data_scale=0.1,
                               workload=BERT), 1024),
    "bert_omgs": (dict(network="piz_daint_aries", compute="p100", model="bert_base", schedules=["omgs_sgd"],
                       algorithms=["oktopk"], data_scale=0.01, workload={"seed": 0}), 1024),
    "bert_paper": ("configs/papers/oktopk_bert.yaml", 256),
    "bert_paper_daint": ("configs/papers/oktopk_bert.yaml", 256),   # on the flow-level Piz Daint it ran on
}


def config(case: str, P: int, evaluation: str) -> dict:
    cfg, _ = CASES[case]
    if isinstance(cfg, str):
        cfg = yaml.safe_load((ROOT / cfg).read_text())
        if case == "bert_paper_daint":
            cfg["network"] = "piz_daint_aries"
    else:
        cfg = dict(name=f"scale_{case}", iterations=1, warmup=0, check=False, **cfg)
    cfg = {**cfg, "P": P}
    if evaluation != "fast":
        cfg["evaluation"] = evaluation
    return cfg


def points_of(cfg: dict) -> list:
    """The points of a config given as a dict, through the config loader (as a YAML file)."""
    from simsparse.experiments.config.schema import load_config

    with tempfile.TemporaryDirectory() as d:
        file = Path(d) / "scale.yaml"
        file.write_text(yaml.safe_dump(cfg))
        return load_config(file).points


def compile_clock() -> list:
    """A one-item list that numba's compilations (the outermost of nested
    ones) add their seconds to: 0 where its disk cache already held them."""
    spent, depth = [0.0], []
    try:
        from numba.core import event
    except ImportError:
        return spent

    class Clock(event.Listener):
        def on_start(self, ev):
            depth.append(time.perf_counter())

        def on_end(self, ev):
            t0 = depth.pop()
            if not depth:
                spent[0] += time.perf_counter() - t0

    event.register("numba:compile", Clock())
    return spent


def child(case: str, P: int, path: str) -> dict:
    """Run one point (every point of the case's config) in this process and describe it,
    beside the budget's estimate of its seconds and memory."""
    from simsparse.experiments.run.budget import point_estimate
    from simsparse.experiments.run.runner import simulate_point

    points = points_of(config(case, P, path))
    est = [point_estimate(p) for p in points]
    jit = compile_clock()
    t0 = time.perf_counter()
    rows = [simulate_point(p).row for p in points]
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "jit_s": jit[0], "rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "time_s": [r["time_s"] for r in rows], "points": len(rows), "msgs": sum(int(r["msgs_total"]) for r in rows),
            "evaluator": "/".join(sorted({r["evaluator"] for r in rows})),
            "bound": max(float(r["error_bound"]) for r in rows),
            "values": "+".join(sorted({r["values"] for r in rows})),
            "est_s": sum(e.seconds for e in est), "est_MB": max(e.memory_B for e in est) / 2**20}


def run_point(case: str, P: int, path: str, cap: float) -> dict:
    args = json.dumps({"case": case, "P": P, "path": path})
    try:
        out = subprocess.run([sys.executable, __file__, "--child", args], capture_output=True, text=True,
                             timeout=cap, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"> {cap:.0f} s (killed)"}
    if out.returncode:
        lines = out.stderr.strip().splitlines() or [f"exit {out.returncode}"]
        return {"error": lines[-1][:70]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(wall) in log(P)."""
    if len(points) < 2:
        return None
    xs = [math.log(p) for p, _ in points]
    ys = [math.log(w) for _, w in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def mem_total_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 16.0


def predicted(points: list[tuple[int, float]], P: int) -> float:
    p0, w0 = points[-1]
    k = exponent(points) or 2.0
    return w0 * (P / p0) ** max(k, 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--P", type=int, nargs="+", help="the P ladder (default: 64, 256, 1024, 4096 up to the row's target)")
    ap.add_argument("--path", default="fast", help="the evaluation (fast, exact, events, or an evaluator's name), "
                                                    "or 'both': fast and events side by side")
    ap.add_argument("--cap", type=float, default=600.0, help="seconds a point may run (default 600)")
    ap.add_argument("--max-rss-gb", type=float, default=round(mem_total_gb() / 2, 1),
                    help="skip a point whose predicted peak RSS passes this (default: half the memory)")
    ap.add_argument("--out", type=Path, help="also write the rows to this CSV, with FILE.provenance.json beside it")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(**json.loads(a.child))))
        return
    paths = ["fast", "events"] if a.path == "both" else [a.path]
    print(f"bench_scale: {os.cpu_count()} cores, cap {a.cap:.0f} s and {a.max_rss_gb:g} GB per point, "
          f"python {sys.version.split()[0]}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'case':<20} {'P':>5} {'wall s':>8} {'est s':>7} {'jit s':>6} {'RSS MB':>7} {'est MB':>7} "
          f"{'evaluator':>24} {'bound':>6} {'values':>7} {'sim time s':>12} {'events wall s':>13} {'err':>9} "
          f"{'msgs/it':>9} {'msgs/s':>9} {'load':>5}")
    summary, rows = [], []
    started, load_before = now(), os.getloadavg()
    for case in a.case:
        ladder = a.P or [p for p in (64, 256, 1024, 4096) if p <= CASES[case][1]]
        seen = {p: [] for p in paths}
        stop = {p: None for p in paths}
        rss = {p: None for p in paths}
        for P in ladder:
            got = {}
            for path in paths:
                if stop[path] is None and seen[path] and predicted(seen[path], P) > a.cap:
                    stop[path] = f"~{predicted(seen[path], P):.0f} s predicted"
                if stop[path] is None and rss[path] and rss[path][1] * P / rss[path][0] > a.max_rss_gb * 1024:
                    stop[path] = f"~{rss[path][1] * P / rss[path][0] / 1024:.1f} GB predicted"
                if stop[path]:
                    got[path] = {"error": f"skipped: {stop[path]}"}
                    continue
                r = run_point(case, P, path, a.cap)
                got[path] = r
                if "error" in r:
                    stop[path] = "a smaller P failed"
                    continue
                seen[path].append((P, r["wall_s"]))
                rss[path] = (P, r["rss_MB"])
            load = os.getloadavg()[0]
            f, e = got.get("fast"), got.get("events")
            main_r = got[paths[0]]
            if "error" in main_r:
                print(f"{case:<20} {P:>5} {main_r['error']}  (load {load:.1f})", flush=True)
                continue
            ev = "" if e is None or f is None else (e["error"] if "error" in e else f"{e['wall_s']:.2f}")
            err = ""
            if f is not None and e is not None and "error" not in e:
                err = f"{max(abs(x - y) / y for x, y in zip(f['time_s'], e['time_s'])):.2e}"
            rate = main_r["msgs"] / main_r["wall_s"] if main_r["wall_s"] else 0.0
            rows.append({"case": case, "P": P, "path": paths[0], **{k: main_r[k] for k in (
                "wall_s", "rss_MB", "est_s", "est_MB", "evaluator", "bound", "values", "msgs")},
                "sim_time_s": max(main_r["time_s"]), "load": round(load, 2)})
            print(f"{case:<20} {P:>5} {main_r['wall_s']:8.2f} {main_r['est_s']:7.3g} {main_r['jit_s']:6.1f} "
                  f"{main_r['rss_MB']:7.0f} {main_r['est_MB']:7.0f} {main_r['evaluator']:>24} {main_r['bound']:6.3g} "
                  f"{main_r['values']:>7} {max(main_r['time_s']):12.6g} {ev:>13} {err:>9} {main_r['msgs']:>9.3g} "
                  f"{rate:9.3g} {load:5.1f}", flush=True)
        for path in paths:
            k = exponent(seen[path])
            summary.append(f"{case:<20} {path:<6} wall ~ P^{k:.2f} over P = {', '.join(str(p) for p, _ in seen[path])}"
                           if k is not None else f"{case:<20} {path:<6} (fewer than two points: no exponent)")
    print("\ngrowth of wall time in P (log-log least squares):")
    print("\n".join(summary))
    if a.out:
        write_rows(a.out, rows, {"started_at": started, "finished_at": now(), "git": git_commit(), "host": host(),
                                 "load_before": load_before, "load_after": os.getloadavg(), "command": sys.argv})


def write_rows(out: Path, rows: list[dict], provenance: dict) -> None:
    """The rows as CSV and their provenance beside them, each written atomically."""
    import pandas as pd

    from simsparse.files import atomic_write

    atomic_write(out, lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
    atomic_write(out.with_suffix(".provenance.json"),
                 lambda tmp: Path(tmp).write_text(json.dumps(provenance, indent=1)))
    print(f"wrote {out} and {out.with_suffix('.provenance.json')}")


if __name__ == "__main__":
    main()
