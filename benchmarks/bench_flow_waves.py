"""The flow-level wave evaluator (``link_load``) against the
event path, on a grid of networks, all-to-all algorithms and P (issue 67).

    python benchmarks/bench_flow_waves.py
    python benchmarks/bench_flow_waves.py --networks piz_daint_aries --algorithms oktopk --P 64 256 --bert
    python benchmarks/bench_flow_waves.py --out docs/data/flow_waves.csv   # the table docs/performance.md shows

A network is a preset, or ``preset:routing`` for another routing of it
(``piz_daint_aries:minimal``); an algorithm a name, or
``name:key=value,...`` for its parameters (``oktopk:rotation=false`` is an
alltoallv without the destination rotation). Each point (a gradient of
``--n`` float32 at 1 %, or BERT-base's at ``data_scale`` 0.01 with the
P100's compute with ``--bert``; one iteration as ``bench_scale.py`` runs
it) is simulated in this process with ``evaluation: events`` (every
message an event of the flow model: the reference) and with each
``--evaluators`` forced (the helper collectives gathered, timed wave after
wave: :mod:`simsparse.backends.fast.waves_flow`). The events carry full
values; a forced evaluator carries what ``fast`` would.
With ``--seeds S`` each runs with the network's ``routing_seed`` 0 .. S - 1:
adaptive routing and ECMP choices depend on it, and so does the event
path's own time (by up to 31 % on small bare collectives on Piz Daint).
It prints, per point, the events' median time and spread over the seeds
(max - min over the median), each evaluator's error of the medians and
the wall times; then each evaluator's median and largest |error|.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def simulate(cfg: dict) -> tuple[float, float, str]:
    """(simulated seconds, wall seconds, the row's evaluator) of the config's one point."""
    import bench_scale
    from simsparse.experiments.run.runner import simulate_point

    (point,) = bench_scale.points_of(cfg)
    t0 = time.perf_counter()
    row = simulate_point(point).row
    return row["time_s"], time.perf_counter() - t0, row["evaluator"]


def network_of(spec: str, seed: int) -> dict:
    preset, _, routing = spec.partition(":")
    return {"preset": preset, "routing_seed": seed, **({"routing": routing} if routing else {})}


def algorithm_of(spec: str):
    name, _, params = spec.partition(":")
    if not params:
        return name
    return {"name": name, **{k: yaml.safe_load(v) for k, v in (kv.split("=") for kv in params.split(","))}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", nargs="+", default=["ib_fdr_fattree", "piz_daint_aries", "piz_daint_aries:minimal",
                                                      "ethernet_100g_leafspine"])
    ap.add_argument("--algorithms", nargs="+", default=["oktopk", "topkdsa", "gtopk", "oktopk:rotation=false"])
    ap.add_argument("--evaluators", nargs="+", default=["link_load"])
    ap.add_argument("--P", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--bert", action="store_true", help="BERT-base at data_scale 0.01 with the P100's compute")
    ap.add_argument("--out", type=Path, help="also write the rows to this CSV, with FILE.provenance.json beside it")
    a = ap.parse_args()
    from bench_scale import write_rows
    from simsparse.experiments.results.provenance import git_commit, host, now

    started, load_before = now(), os.getloadavg()
    print(f"bench_flow_waves: load {' '.join(f'{x:.2f}' for x in load_before)}, routing seeds 0..{a.seeds - 1}")
    print(f"{'network':<24} {'algorithm':<22} {'P':>5} {'events s':>11} {'spread':>7} "
          + " ".join(f"{e + ' err':>15} {'wall':>6}" for e in a.evaluators) + f" {'wall events':>11}")
    rows, errs = [], {e: [] for e in a.evaluators}
    for net in a.networks:
        for alg in a.algorithms:
            for P in a.P:
                base = dict(name="flow_waves", algorithms=[algorithm_of(alg)], P=P, iterations=1, warmup=0,
                            check=False)
                if a.bert:
                    base.update(compute="p100", data_scale=0.01, workload={"model": "bert_base", "density": 0.01,
                                                                           "seed": 0})
                else:
                    base.update(workload={"n": a.n, "density": 0.01, "dtype": "float32", "seed": 0})
                times = {e: [] for e in ["events", *a.evaluators]}
                wall = dict.fromkeys(times, 0.0)
                used = dict.fromkeys(times, "")
                for seed in range(a.seeds):
                    cfg = {**base, "network": network_of(net, seed)}
                    for e in times:
                        t, w, used[e] = simulate({**cfg, "evaluation": e})
                        times[e].append(t)
                        wall[e] += w
                me = float(np.median(times["events"]))
                row = {"network": net, "algorithm": alg, "P": P, "events_s": me,
                       "events_spread": (max(times["events"]) - min(times["events"])) / me if a.seeds > 1 else float("nan"),
                       "events_wall_s": wall["events"]}
                line = []
                for e in a.evaluators:
                    timed = e in used[e].split("+")   # (else no collective was gathered: the events ran)
                    err = float(np.median(times[e])) / me - 1.0 if timed else float("nan")
                    if timed:
                        errs[e].append(abs(err))
                    row.update({f"{e}_error": err, f"{e}_wall_s": wall[e]})
                    line.append(f"{100 * err:+14.2f}% {wall[e]:5.1f}s" if timed else f"{'(events)':>15} {wall[e]:5.1f}s")
                rows.append(row)
                spread = "-" if a.seeds == 1 else f"{100 * row['events_spread']:.1f}%"
                print(f"{net:<24} {alg:<22} {P:>5} {me:11.5g} {spread:>7} " + " ".join(line)
                      + f" {wall['events']:10.1f}s", flush=True)
    for e, x in errs.items():
        if x:
            print(f"{e}: |error of the medians| median {100 * np.median(x):.2f} %, max {100 * max(x):.2f} % over "
                  f"{len(x)} points")
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.out:
        write_rows(a.out, rows, {"started_at": started, "finished_at": now(), "git": git_commit(), "host": host(),
                                 "load_before": load_before, "load_after": os.getloadavg(), "seeds": a.seeds,
                                 "command": sys.argv})


if __name__ == "__main__":
    main()
