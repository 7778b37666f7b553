"""Ok-Topk: the effect of each optimisation, side by side (simulated).

    python benchmarks/bench_oktopk.py [--n 1048576] [--density 0.01] [--P 8 16 32 64] [--balance-density 0.05]
        [--networks aries_alphabeta piz_daint_aries ib_edr_fattree]

Every figure is an iteration time (max over ranks) or the time of one phase
(max over ranks of its span), from the simulator with real data. Networks: Aries alpha-beta
(topologies/aries_alphabeta.yaml) for all sections; section 1 also on the
flow-level (max-min fair) Piz Daint dragonfly and an EDR fat tree.

1. destination rotation vs the naive order (Fig. 2): split-and-reduce time,
   ideal compute, uniform coordinates, thresholds reused (iteration 1), one
   step at a time and the code's 4 steps in flight;
2. balanced boundaries vs equal regions (section 3.1.1, Fig. 7a) on skewed
   coordinates -- every rank's values in the first n/8 indices scaled by 4 --
   iteration 0, boundary allreduce included;
3. data balancing vs a direct allgatherv (section 3.1.2, Fig. 7b) when the
   global top-k sits in one region (equal regions, values in the first n/16
   scaled by 8), at a higher density: balancing trades (P-1) latencies for
   log2(P)-2 transfers of the whole top-k, so it pays only for a large k;
4. overlap of the local reduction with the next bucket, P100 compute model;
5. threshold reuse vs exact thresholds every iteration (section 3.1.3), P100
   compute model, mean of iterations 1..7 (tau = 32), and the exact global
   threshold by radix select vs the code's allgatherv of all nonzeros
   (iteration 0).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import yaml

from simsparse.algorithms.oktopk import OkTopk, OkTopkParams
from simsparse.algorithms.base import Setup
from simsparse.backends.events.sim import Simulator
from simsparse.compute.devices import load_profile, make_device
from simsparse.network.spec import NETWORK_SPECS
from simsparse.workload import Workload

ROOT = Path(__file__).resolve().parents[1]


def networks(names):
    """(label, spec) for the named presets in topologies/ (the first one is
    used for sections 2-5)."""
    out = []
    for name in names:
        d = yaml.safe_load((ROOT / "topologies" / f"{name}.yaml").read_text())
        model = d.get("model", "alphabeta")
        if model not in NETWORK_SPECS:
            print(f"  (skipping {name}: network model {model!r} not available)")
            continue
        out.append((f"{name} [{model}]", NETWORK_SPECS[model].model_validate(d)))
    return out


def uniform(n, seed=0):
    return lambda P, it: Workload(n=n, seed=seed).grads(P, it)


def skewed(n, hot, scale, seed=0):
    def make(P, it):
        out = []
        for r in range(P):
            g = np.random.default_rng([seed, it, r]).standard_normal(n).astype(np.float32)
            g[: n // hot] *= scale
            g.setflags(write=False)
            out.append(g)
        return out
    return make


def run(P, n, density, params, grads, spec, device=None, iterations=1):
    """Simulate ``iterations`` iterations; returns per iteration (time, {phase: span})."""
    prm = OkTopkParams.model_validate(params)
    algs = [OkTopk(Setup(r, P, n, density), prm) for r in range(P)]
    try:
        sim = Simulator(spec.build(), device, **spec.protocol(), trace=True)
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    out = []
    for it in range(iterations):
        gs = grads(P, it)
        s = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, gs)])
        span = {}
        for rank, phase, _op, _peer, _nbytes, t0, t1 in s.trace:
            lo, hi = span.get((rank, phase), (t0, t1))
            span[(rank, phase)] = (min(lo, t0), max(hi, t1))
        phases = {}
        for (_rank, phase), (lo, hi) in span.items():
            phases[phase] = max(phases.get(phase, 0.0), hi - lo)
        out.append((s.time_s, phases))
    return out, None


def us(x):
    return f"{x * 1e6:9.1f}"


def compare(title, label_a, label_b, cases, column):
    """cases: (P, result_a, result_b); prints the column for both and b/a."""
    print(f"\n{title}")
    print(f"{'P':>4} {label_a + ' [us]':>22} {label_b + ' [us]':>22} {'ratio':>7}")
    for P, a, b in cases:
        va, vb = column(a), column(b)
        print(f"{P:>4} {us(va):>22} {us(vb):>22} {vb / va:7.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--P", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--networks", nargs="+", default=["aries_alphabeta", "piz_daint_aries", "ib_edr_fattree"],
                    help="presets in topologies/ for section 1; the first is used for sections 2-5")
    ap.add_argument("--balance-density", type=float, default=0.05,
                    help="density for section 3 (data balancing pays once the global top-k is large)")
    a = ap.parse_args()
    n, d, Ps = a.n, a.density, a.P
    t_start = time.perf_counter()
    p100 = make_device(load_profile("p100"))
    nets = networks(a.networks)
    aries = nets[0][1]
    print(f"Ok-Topk, n = {n} float32, density {d} (k = {round(n * d)}); networks: {', '.join(lbl for lbl, _ in nets)}")

    def phase(name):
        return lambda res: res[-1][1].get(name, 0.0)

    # 1. rotation
    for label, spec in nets:
        for bucket in (1, 4):
            cases = []
            for P in Ps:
                rot, err = run(P, n, d, {"bucket_size": bucket}, uniform(n), spec, iterations=2)
                if err:
                    print(f"\n1. {label}: cannot run ({err})")
                    break
                naive, _ = run(P, n, d, {"bucket_size": bucket, "rotation": False}, uniform(n), spec, iterations=2)
                cases.append((P, rot, naive))
            if cases:
                compare(f"1. split and reduce, {label}, bucket_size {bucket}: destination rotation vs naive order "
                        "(ratio = naive / rotated)", "rotated", "naive", cases, phase("split_reduce"))

    # 2. balanced boundaries on skewed coordinates
    cases = []
    for P in Ps:
        bal, _ = run(P, n, d, {}, skewed(n, 8, 4.0), aries)
        eq, _ = run(P, n, d, {"balanced_boundaries": False}, skewed(n, 8, 4.0), aries)
        cases.append((P, bal, eq))
    compare("2. split and reduce on skewed coordinates (Aries alpha-beta): balanced vs equal regions "
            "(ratio = equal / balanced; boundary allreduce included in 'balanced')", "balanced", "equal", cases,
            lambda r: r[-1][1].get("split_reduce", 0.0) + r[-1][1].get("boundaries", 0.0))
    compare("   whole iteration", "balanced", "equal", cases, lambda r: r[-1][0])

    # 3. data balancing
    cases = []
    db = a.balance_density
    for P in Ps:
        on, _ = run(P, n, db, {"balanced_boundaries": False, "balance": "auto"}, skewed(n, 16, 8.0), aries)
        off, _ = run(P, n, db, {"balanced_boundaries": False, "balance": "never"}, skewed(n, 16, 8.0), aries)
        cases.append((P, on, off))
    compare(f"3. balance + allgatherv, global top-k in one region, density {db} (k = {round(n * db)}; Aries alpha-beta): "
            "data balancing vs direct allgatherv (ratio = direct / balanced)", "balanced", "direct", cases,
            lambda r: r[-1][1].get("balance", 0.0) + r[-1][1].get("allgatherv", 0.0))

    # 4. overlap of the local reduction (P100)
    cases = []
    for P in Ps:
        ov, _ = run(P, n, d, {}, uniform(n), aries, p100, iterations=2)
        no, _ = run(P, n, d, {"overlap": False}, uniform(n), aries, p100, iterations=2)
        cases.append((P, ov, no))
    compare("4. split and reduce with the P100 model: reduction overlapped vs not (ratio = serial / overlapped)",
            "overlapped", "serial", cases, phase("split_reduce"))

    # 5. threshold reuse (P100)
    cases, exact_cases = [], []
    for P in Ps:
        reuse, _ = run(P, n, d, {}, uniform(n), aries, p100, iterations=8)
        exact, _ = run(P, n, d, {"threshold_reuse": False}, uniform(n), aries, p100, iterations=8)
        gather, _ = run(P, n, d, {"global_exact": "gather"}, uniform(n), aries, p100, iterations=1)
        cases.append((P, reuse, exact))
        exact_cases.append((P, reuse, gather))

    def mean_after_first(key):
        return lambda r: float(np.mean([key(x) for x in r[1:]]))

    compare("5. P100 model, mean of iterations 1..7: threshold reuse vs exact thresholds every iteration "
            "(ratio = exact / reuse)", "reuse", "exact", cases, mean_after_first(lambda x: x[0]))
    compare("   local selection phase", "reuse", "exact", cases, mean_after_first(lambda x: x[1]["local_select"]))
    compare("   exact iteration 0: global threshold by radix select vs allgatherv of all nonzeros "
            "(ratio = gather / select)", "select", "gather", exact_cases, lambda r: r[0][0])
    print(f"\n(wall time {time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
