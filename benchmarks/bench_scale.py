"""The scale table of issue 23: wall time and peak memory of each row, the
event path beside it where it finishes, and the growth exponent in P.

    python benchmarks/bench_scale.py                                     # every row, P up to its target
    python benchmarks/bench_scale.py --case ab_oktopk --P 256 1024 4096 --cap 600
    python benchmarks/bench_scale.py --path fast                         # without the event path

Rows (one iteration of the config, as ``simsparse run`` runs it: the loop
adds an iteration of each kind of an algorithm's periodic work it would
otherwise miss; no check):

* ``ab_oktopk``, ``ab_topka``, ``ab_gaussiank``: 1M float32, 1 %, on
  ``aries_alphabeta``, ``values: sampled``; target P = 4096;
* ``bert_oktopk``: Ok-Topk of BERT-base (133.5M, 1 %) on ``piz_daint_aries``
  with P100 compute at ``data_scale: 0.01``; target P = 1024;
* ``bert_oktopk_sampled``: the same at ``data_scale: 0.1``, ``values: sampled``;
  ``bert_oktopk_sampled_small``: at ``data_scale: 0.01``, ``values: sampled``;
* ``bert_omgs``: one BERT-base iteration, ``omgs_sgd`` over Ok-Topk, same
  machine (the plan's simulated microbenchmarks included); target P = 1024;
* ``bert_paper``: ``configs/papers/oktopk_bert.yaml`` (every scheme) at P = 256;
* ``bert_paper_sampled``: the same with ``values: sampled`` (Ok-Topk's
  reused thresholds fall under the floors its error feedback had: run again
  with them widened, ``sampled_widen``);
  ``bert_paper_sampled_full_size``: that at ``data_scale: 1``, without
  Ok-Topk (its widened floors admit some 10 M entries a rank there);
* ``flow_ring``, ``ab_ring``: the ring allreduce of 1M float32 (lockstep rounds).

Two paths per point: ``fast`` is the default configuration (helper
collectives in bulk where the network allows, ``values`` as the row says);
``events`` is ``collectives: events`` with full values, the reference. The
``err`` column is the relative difference of their simulated times (the
fast one is exact where its ``coll`` is ``bulk`` and ``values`` is not
``sampled``; sampled values differ in distribution only). ``--path waves``
runs ``collectives: waves`` (on flow-level networks, adaptive routing
included, the collectives timed wave after wave: approximate). Each point runs
in a fresh process that writes the case as a YAML config, loads it with the
config loader and simulates every point with ``simulate_point``. Peak RSS is
the process's own (``ru_maxrss``). ``jit s`` is the part of the wall time
numba spent compiling: 0 once its disk cache holds the point's functions,
some 10 s on the first run from a fresh clone (then included in the wall
time, as a user's first run would see it). ``msgs/it`` is the points'
simulated messages in one timed iteration (``msgs_total``, summed over the
points; a plan's microbenchmarks and Ok-Topk's pilot not counted). A point is killed at ``--cap`` seconds; a
larger P is skipped when the last one, scaled by the growth seen so far
(P^2 before two points exist), would pass the cap, or when its peak RSS
scaled linearly in P would pass ``--max-rss-gb``. The load average is
printed with every point: this machine is shared, so figures are under load.
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

ROOT = Path(__file__).resolve().parent.parent
VEC = {"n": 1048576, "density": 0.01, "dtype": "float32", "seed": 0}
BERT = {"model": "bert_base", "density": 0.01, "seed": 0}
CASES = {   # (config, the P the issue targets)
    "ab_oktopk": (dict(network="aries_alphabeta", workload=VEC, algorithms=["oktopk"], values="sampled"), 4096),
    "ab_topka": (dict(network="aries_alphabeta", workload=VEC, algorithms=["topka"], values="sampled"), 4096),
    "ab_gaussiank": (dict(network="aries_alphabeta", workload=VEC, algorithms=["gaussiank"], values="sampled"), 4096),
    "bert_oktopk": (dict(network="piz_daint_aries", compute="p100", algorithms=["oktopk"], data_scale=0.01,
                         workload=BERT), 1024),
    "bert_oktopk_sampled": (dict(network="piz_daint_aries", compute="p100", algorithms=["oktopk"], data_scale=0.1,
                                 workload=BERT, values="sampled"), 1024),
    "bert_oktopk_sampled_small": (dict(network="piz_daint_aries", compute="p100", algorithms=["oktopk"],
                                       data_scale=0.01, workload=BERT, values="sampled"), 1024),
    "bert_omgs": (dict(network="piz_daint_aries", compute="p100", model="bert_base", schedules=["omgs_sgd"],
                       algorithms=["oktopk"], data_scale=0.01, workload={"seed": 0}), 1024),
    "bert_paper": ("configs/papers/oktopk_bert.yaml", 256),
    # the same with values: sampled (drift and error feedback over the iterations: sampling.paths); Ok-Topk
    # with error feedback is refused there (its reused threshold falls under the floor), so six of the seven
    "bert_paper_sampled": ("configs/papers/oktopk_bert.yaml", 256),
    "bert_paper_sampled_full_size": ("configs/papers/oktopk_bert.yaml", 256),
    "flow_ring": (dict(network="ib_fdr_fattree", workload=VEC, algorithms=["ring"]), 4096),
    "ab_ring": (dict(network="aries_alphabeta", workload=VEC, algorithms=["ring"]), 4096),
}


def config(case: str, P: int, path: str) -> dict:
    cfg, _ = CASES[case]
    if isinstance(cfg, str):
        cfg = yaml.safe_load((ROOT / cfg).read_text())
        if case.startswith("bert_paper_sampled"):
            cfg["values"] = "sampled"
            if case.endswith("full_size"):   # (Ok-Topk's widened floors: some 10 M entries a rank, 20 GB at P = 256)
                cfg["data_scale"] = 1.0
                cfg["algorithms"] = [a for a in cfg["algorithms"] if not (isinstance(a, dict) and a["name"] == "oktopk")]
    else:
        cfg = dict(name=f"scale_{case}", iterations=1, warmup=0, check=False, **cfg)
    cfg = {**cfg, "P": P}
    if path == "events":
        cfg.update(collectives="events", values="full")
    elif path == "waves":   # flow-level collectives wave after wave (approximate)
        cfg.update(collectives="waves")
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
    """Run one point (every point of the case's config) in this process and describe it."""
    from simsparse.experiments.run.runner import simulate_point

    points = points_of(config(case, P, path))
    jit = compile_clock()
    t0 = time.perf_counter()
    rows = [simulate_point(p).row for p in points]
    wall = time.perf_counter() - t0
    paths = {r["collectives"] for r in rows}
    return {"wall_s": wall, "jit_s": jit[0], "rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "time_s": [r["time_s"] for r in rows], "points": len(rows), "msgs": sum(int(r["msgs_total"]) for r in rows),
            "coll": "bulk~" if "bulk~" in paths else "bulk" if "bulk" in paths else "events",
            "values": "+".join(sorted({r["values"] for r in rows}))}


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
    ap.add_argument("--path", default="both", choices=["fast", "events", "waves", "both"])
    ap.add_argument("--cap", type=float, default=600.0, help="seconds a point may run (default 600)")
    ap.add_argument("--max-rss-gb", type=float, default=round(mem_total_gb() / 2, 1),
                    help="skip a point whose predicted peak RSS passes this (default: half the memory)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(**json.loads(a.child))))
        return
    paths = ["fast", "events"] if a.path == "both" else [a.path]
    print(f"bench_scale: {os.cpu_count()} cores, cap {a.cap:.0f} s and {a.max_rss_gb:g} GB per point, "
          f"python {sys.version.split()[0]}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'case':<20} {'P':>5} {'wall s':>8} {'jit s':>6} {'RSS MB':>7} {'coll':>6} {'values':>7} {'sim time s':>12} "
          f"{'events wall s':>13} {'err':>9} {'msgs/it':>9} {'load':>5}")
    summary = []
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
            main_r = next(got[p] for p in ("fast", "waves", "events") if p in got)
            if "error" in main_r:
                print(f"{case:<20} {P:>5} {main_r['error']}  (load {load:.1f})", flush=True)
                continue
            ev = "" if e is None or f is None else (e["error"] if "error" in e else f"{e['wall_s']:.2f}")
            err = ""
            if f is not None and e is not None and "error" not in e:
                err = f"{max(abs(x - y) / y for x, y in zip(f['time_s'], e['time_s'])):.2e}"
            print(f"{case:<20} {P:>5} {main_r['wall_s']:8.2f} {main_r['jit_s']:6.1f} {main_r['rss_MB']:7.0f} {main_r['coll']:>6} "
                  f"{main_r['values']:>7} {max(main_r['time_s']):12.6g} {ev:>13} {err:>9} {main_r['msgs']:>9.3g} "
                  f"{load:5.1f}", flush=True)
        for path in paths:
            k = exponent(seen[path])
            summary.append(f"{case:<20} {path:<6} wall ~ P^{k:.2f} over P = {', '.join(str(p) for p, _ in seen[path])}"
                           if k is not None else f"{case:<20} {path:<6} (fewer than two points: no exponent)")
    print("\ngrowth of wall time in P (log-log least squares):")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
