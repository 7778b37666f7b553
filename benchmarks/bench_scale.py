"""How the simulator's cost grows with P: wall time, peak memory and events
per second of the issue-11 runs, each point as ``simsparse run`` runs it.

    python benchmarks/bench_scale.py                                  # every case, P = 64 256 1024 4096, lean engine
    python benchmarks/bench_scale.py --engine both --P 64 256         # lean and SimPy side by side, with the ratio
    python benchmarks/bench_scale.py --case flow_ring ab_ring --cap 300

Cases (one iteration, no warm-up, no check; ``values: auto``):

* ``flow_ring``: ring allreduce of 1M float32 on ``ib_fdr_fattree`` (flow level);
* ``ab_ring``, ``ab_oktopk``: ring and Ok-Topk (1 %) of 1M float32 on
  ``aries_alphabeta``;
* ``bert_oktopk``: Ok-Topk of BERT-base's gradient (133.5M, 1 %) on
  ``piz_daint_aries`` with P100 compute at ``data_scale: 0.01``;
* ``bert_omgs``: one BERT-base iteration, ``omgs_sgd`` over Ok-Topk, same
  machine (the plan's simulated microbenchmarks included).

Every point runs in a fresh process that writes the case as a YAML config,
loads it with the config loader and simulates it with ``simulate_point``
(what ``simsparse run`` does per point). Wall and CPU times are that call's;
on a shared machine CPU time is the steadier figure, so events/s, the
``simpy/lean`` ratio (with ``--engine both``, the two engines back to back,
``same`` when their simulated times are equal) and the growth exponents
(least-squares slopes of log time against log P) are also given in CPU
time. ``path`` says whether the lean engine evaluated the schedule as
lockstep rounds (:mod:`simsparse.backends.rounds`; events then counts the
events the engines would have run) or ran the events. Peak RSS is the
process's own (``ru_maxrss``). A point is killed at ``--cap`` seconds; a larger P is skipped when the last one, scaled by the
growth seen so far (P^2 before two points exist), would pass the cap, or
when its peak RSS scaled linearly in P would pass ``--max-rss-gb`` (the
machine is shared: a run must not push others out of memory). The load
average is printed with every point.
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

ROOT = Path(__file__).resolve().parent.parent
VEC = {"n": 1048576, "density": 0.01, "dtype": "float32", "seed": 0}
CASES = {
    "flow_ring": dict(network="ib_fdr_fattree", workload=VEC, algorithms=["ring"]),
    "ab_ring": dict(network="aries_alphabeta", workload=VEC, algorithms=["ring"]),
    "ab_oktopk": dict(network="aries_alphabeta", workload=VEC, algorithms=["oktopk"]),
    "bert_oktopk": dict(network="piz_daint_aries", compute="p100", algorithms=["oktopk"], data_scale=0.01,
                        workload={"model": "bert_base", "density": 0.01, "seed": 0}),
    "bert_omgs": dict(network="piz_daint_aries", compute="p100", model="bert_base", schedules=["omgs_sgd"],
                      algorithms=["oktopk"], data_scale=0.01, workload={"seed": 0}),
}


def child(case: str, P: int, engine: str) -> dict:
    """Run one point in this process and describe it."""
    import yaml

    from simsparse.experiments import runner
    from simsparse.experiments.config import load_config
    from simsparse.experiments.runner import simulate_point

    took = []   # which path the lean engine took: lockstep rounds or events

    def spy(*args):
        out = bulk(*args)
        took.append(out is not None)
        return out

    bulk, runner.run_rounds = runner.run_rounds, spy

    cfg = dict(name=f"scale_{case}", P=P, iterations=1, warmup=0, check=False, engine=engine, **CASES[case])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "scale.yaml"
        path.write_text(yaml.safe_dump(cfg))
        (point,) = load_config(path).points
    t0, c0 = time.perf_counter(), time.process_time()
    row = simulate_point(point).row
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "events": row["sim_events"], "msgs": row["msgs_total"], "time_s": row["time_s"],
            "path": "rounds" if took and all(took) else "events"}


def run_point(case: str, P: int, engine: str, cap: float) -> dict:
    args = json.dumps({"case": case, "P": P, "engine": engine})
    try:
        out = subprocess.run([sys.executable, __file__, "--child", args], capture_output=True, text=True,
                             timeout=cap, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"> {cap:.0f} s (killed)"}
    if out.returncode:
        lines = out.stderr.strip().splitlines() or [f"exit {out.returncode}"]
        return {"error": lines[-1][:60]}
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
    ap.add_argument("--P", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--engine", default="lean", choices=["lean", "simpy", "both"])
    ap.add_argument("--cap", type=float, default=600.0, help="seconds a point may run (default 600)")
    ap.add_argument("--max-rss-gb", type=float, default=round(mem_total_gb() / 2, 1),
                    help="skip a point whose predicted peak RSS passes this (default: half the memory)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(**json.loads(a.child))))
        return
    engines = ["lean", "simpy"] if a.engine == "both" else [a.engine]
    print(f"bench_scale: {os.cpu_count()} cores, cap {a.cap:.0f} s and {a.max_rss_gb:g} GB per point, "
          f"python {sys.version.split()[0]}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    head = f"{'case':<12} {'P':>5} {'engine':<6} {'wall s':>8} {'cpu s':>8} {'RSS MB':>7} {'events':>10} {'events/s':>9} " \
           f"{'msgs':>10} {'sim time s':>12} {'path':>6} {'load':>5}"
    if len(engines) == 2:
        head += f" {'simpy/lean':>10} {'same':>5}"   # CPU time ratio; same simulated time
    print(head)
    summary = []
    for case in a.case:
        seen = {e: [] for e in engines}
        stop = {e: None for e in engines}
        rss = {e: None for e in engines}
        cpu = {e: [] for e in engines}   # (P, MB) of the last point
        for P in a.P:
            got = {}
            for e in engines:
                if stop[e] is None and seen[e] and predicted(seen[e], P) > a.cap:
                    stop[e] = f"skipped: ~{predicted(seen[e], P):.0f} s predicted"
                if stop[e] is None and rss[e] and rss[e][1] * P / rss[e][0] > a.max_rss_gb * 1024:
                    stop[e] = f"skipped: ~{rss[e][1] * P / rss[e][0] / 1024:.1f} GB predicted"
                if stop[e]:
                    print(f"{case:<12} {P:>5} {e:<6} {stop[e]}")
                    continue
                r = run_point(case, P, e, a.cap)
                load = os.getloadavg()[0]
                if "error" in r:
                    stop[e] = "skipped: a smaller P failed"
                    print(f"{case:<12} {P:>5} {e:<6} {r['error']}  (load {load:.1f})")
                    continue
                got[e] = r
                seen[e].append((P, r["wall_s"]))
                cpu[e].append((P, r["cpu_s"]))
                rss[e] = (P, r["rss_MB"])
                line = f"{case:<12} {P:>5} {e:<6} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['rss_MB']:7.0f} " \
                       f"{r['events']:>10} {r['events'] / max(r['cpu_s'], 1e-9):9.0f} {r['msgs']:>10} {r['time_s']:12.9g} {r['path']:>6} {load:5.1f}"
                if len(got) == 2:
                    same = got["lean"]["time_s"] == got["simpy"]["time_s"]
                    line += f" {got['simpy']['cpu_s'] / got['lean']['cpu_s']:10.2f} {'yes' if same else 'NO':>5}"
                print(line, flush=True)
        for e in engines:
            k, kc = exponent(seen[e]), exponent(cpu[e])
            summary.append(f"{case:<12} {e:<6} wall ~ P^{k:.2f}, cpu ~ P^{kc:.2f} over P = "
                           f"{', '.join(str(p) for p, _ in seen[e])}"
                           if k is not None else f"{case:<12} {e:<6} (fewer than two points: no exponent)")
    print("\ngrowth of wall time in P (log-log least squares):")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
