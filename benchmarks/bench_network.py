"""Flow-level network benchmark: wall time and peak memory to simulate one ring
and one Rabenseifner allreduce of n float32 (default 1M) at P = 64, 256, 1024
on a 3-level fat tree (topologies/ib_edr_fattree.yaml), on the Aries dragonfly
(topologies/piz_daint_aries.yaml, UGAL routing) and, for reference, on the
contention-free alpha-beta fast path (topologies/aries_alphabeta.yaml).

    python benchmarks/bench_network.py                  # everything (~10 min on 2 cores)
    python benchmarks/bench_network.py --P 256 --networks fattree
    python benchmarks/bench_network.py --model          # the network model alone

Every case runs in a fresh process, one at a time (P = 1024 carries ~8 GB of
real gradients), so the peak resident memory (ru_maxrss) is that case's own.
Columns: gradient generation time, simulation time (SimPy + rank programs +
numpy data + the network model), total wall time, peak RSS, the simulated
time, and the network model's ticks (event batches) and max-min solves.
The reference to beat: SimGrid's SMPI needs about 10 s (P = 256) and 97 s
(P = 1024) for the ring on this 2-core machine (the issue's figures).

``--model`` times the network model without rank programs or data: the cost
per message of ``transfer`` and its events for a ring pattern at P = 1024
(each step every rank sends 4 KiB to the next, steps 5 us apart), and
:func:`maxmin_rates` alone on F concurrent flows between random endpoint pairs
of the full Piz Daint machine (minimal routes). Then the model's worst case:
an all-to-all on piz_daint_aries with random block sizes (1 to 4095 float32),
every message posted at once (P(P-1) shared flows ending one by one, each end
a max-min solve) or 4 in flight per rank as in the Ok-Topk code.
"""
import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

NETWORKS = {"fattree": "ib_edr_fattree", "dragonfly": "piz_daint_aries", "alphabeta": "aries_alphabeta"}


def child(network: str, algorithm: str, P: int, n: int, data_scale: float = 1.0) -> dict:
    from simsparse.backends.events.sim import Simulator
    from simsparse.experiments.config.sources import network_variants
    from simsparse.experiments.config.point import Point
    from simsparse.network.spec import NETWORK_SPECS

    (raw,) = network_variants(NETWORKS[network], __import__("pathlib").Path.cwd() / "bench")
    spec = NETWORK_SPECS[raw.get("model", "alphabeta")].model_validate(raw)
    pt = Point(algorithm=algorithm, P=P, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
               network=spec.model_dump(), iterations=1, warmup=0, check=False, data_scale=data_scale)
    pt, byte_scale = pt.at_scale()
    t0 = time.perf_counter()
    net = spec.build()
    sim = Simulator(net, pt.device(), **spec.protocol(), byte_scale=byte_scale)
    algs = pt.instances()
    if hasattr(net, "machine"):
        net.machine(P)   # build the topology outside the timed simulation
    t1 = time.perf_counter()
    grads = pt.workload_obj().grads(P, 0)
    t2 = time.perf_counter()
    stats = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, grads)])
    t3 = time.perf_counter()
    return {"network": network, "algorithm": algorithm, "P": P, "build_s": t1 - t0, "grads_s": t2 - t1,
            "sim_s": t3 - t2, "wall_s": t3 - t0, "maxrss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "time_s": stats.time_s, "msgs": sum(stats.msgs_sent), "events": stats.n_events,
            "ticks": getattr(net, "ticks", 0), "solves": getattr(net, "solves", 0)}


def model_bench() -> None:
    from simsparse.engine import HeapEngine
    from simsparse.experiments.config.sources import load_preset as _load_preset
    from simsparse.network.maxmin import maxmin_rates
    from simsparse.network.spec import NETWORK_SPECS, DragonflySpec

    P, steps = 1024, 200
    print(f"network model alone: ring pattern, P = {P}, {steps} steps of 4 KiB messages")
    print(f"{'network':>10} {'us/message':>11}")
    for net, preset in NETWORKS.items():
        raw = _load_preset(preset, __import__("pathlib").Path.cwd() / "bench")
        model = NETWORK_SPECS[raw.get("model", "alphabeta")].model_validate(raw).build()
        env = HeapEngine()
        model.reset(env, P)

        def step(s, model=model, env=env):
            for r in range(P):
                model.transfer(r, (r + 1) % P, 4096, _nothing)
            if s + 1 < steps:
                env.at(5e-6, step, s + 1)

        step(0)
        t0 = time.perf_counter()
        env.run()
        print(f"{net:>10} {(time.perf_counter() - t0) / (P * steps) * 1e6:>11.2f}")

    spec = DragonflySpec(groups=14, routing="minimal")
    m, _ = spec.machine(5376)
    cap = np.append(m.topo.bw_arr, np.inf)
    rng = np.random.default_rng(0)
    print(f"max-min solver on Piz Daint ({m.topo.n_links} links), F flows between random endpoint pairs")
    print(f"{'flows':>7} {'solve [ms]':>11} {'links in use':>13}")
    for F in (1000, 4000, 16000):
        src = rng.integers(0, m.n_endpoints, F)
        dst = (src + rng.integers(1, m.n_endpoints, F)) % m.n_endpoints
        routes = [m.route(int(a), int(b)) for a, b in zip(src, dst)]
        R = np.full((F, max(map(len, routes))), len(cap) - 1)
        for i, r in enumerate(routes):
            R[i, :len(r)] = r
        reps = 5
        t0 = time.perf_counter()
        for _ in range(reps):
            maxmin_rates(R, cap)
        print(f"{F:>7} {(time.perf_counter() - t0) / reps * 1e3:>11.2f} {len(np.unique(R)):>13}")

    from simsparse.algorithms.collectives import Alltoall
    from simsparse.backends.events.sim import Simulator
    from simsparse.ops import Dense

    print("all-to-all, random block sizes, on piz_daint_aries")
    print(f"{'P':>5} {'in flight':>10} {'flows':>7} {'solves':>7} {'wall [s]':>9}")
    raw = _load_preset("piz_daint_aries", __import__("pathlib").Path.cwd() / "bench")
    for P, throttle in ((64, None), (128, 4)):
        model = DragonflySpec.model_validate(raw).build()
        sim = Simulator(model, None, raw["eager_threshold_B"])

        def program(ctx, P=P, throttle=throttle):
            rng = np.random.default_rng(ctx.rank)
            blocks = [Dense(np.zeros(int(rng.integers(1, 4096)), np.float32)) for _ in range(P)]
            yield Alltoall(blocks, bucket_size=throttle)

        t0 = time.perf_counter()
        sim.run([program] * P)
        print(f"{P:>5} {throttle or 'all':>10} {P * (P - 1):>7} {model.solves:>7} {time.perf_counter() - t0:>9.2f}")


def _nothing() -> None:
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--networks", nargs="+", default=["fattree", "dragonfly", "alphabeta"], choices=list(NETWORKS))
    ap.add_argument("--algorithms", nargs="+", default=["ring", "rabenseifner"])
    ap.add_argument("--data-scale", type=float, default=1.0,
                    help="carry n*data_scale elements and scale bytes back up (the simulator's data_scale)")
    ap.add_argument("--model", action="store_true", help="only time the network model (no rank programs)")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        net, alg, P, n, scale = args.child
        print(json.dumps(child(net, alg, int(P), int(n), float(scale))))
        return
    if args.model:
        model_bench()
        return
    print(f"allreduce of n = {args.n} float32 (data_scale {args.data_scale:g}), ideal compute, one iteration; "
          "each case in its own process")
    cols = ("network", "algorithm", "P", "grads_s", "sim_s", "wall_s", "maxrss_MB", "time_s", "msgs", "ticks", "solves")
    print(" ".join(f"{c:>11}" for c in cols))
    for P in args.P:
        for net in args.networks:
            for alg in args.algorithms:
                out = subprocess.run([sys.executable, __file__, "--child", net, alg, str(P), str(args.n),
                                      str(args.data_scale)],
                                     capture_output=True, text=True)
                if out.returncode:
                    print(f"{net} {alg} P={P}: failed\n{out.stderr[-2000:]}")
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                print(" ".join(f"{row[c]:>11.4g}" if isinstance(row[c], float) else f"{row[c]:>11}" for c in cols),
                      flush=True)


if __name__ == "__main__":
    main()
