"""Training-iteration benchmark: wall time and peak memory to simulate one
iteration of a model with a layer-wise schedule, as ``simsparse run`` does it
(plan resolution with its simulated microbenchmarks, gradients, the
iteration, the numpy check).

    python benchmarks/bench_training.py                       # BERT-base, omgs_sgd over oktopk, P = 64 and 256
    python benchmarks/bench_training.py --P 64 --data-scale 0.01 --no-check
    python benchmarks/bench_training.py --model resnet50_imagenet --schedule mgs_sgd --algorithm topka

Every case runs in a fresh process (peak RSS is that case's own). Columns:
plan time (cost models + planner), simulation wall time of warm-up-free
iterations, total wall time, peak RSS, the simulated iteration time and its
breakdown, merged groups.
"""
import argparse
import json
import resource
import subprocess
import sys
import time


def child(model, schedule, algorithm, network, compute, P, data_scale, check, iterations) -> dict:
    from pathlib import Path

    from simsparse.compute.devices import load_profile
    from simsparse.compute.models import DEFAULT_BATCH
    from simsparse.experiments.config.sources import network_variants
    from simsparse.experiments.run.plan import with_plan
    from simsparse.experiments.config.point import Point
    from simsparse.experiments.run.runner import simulate_point
    from simsparse.workload import model_layer_params

    t0 = time.perf_counter()
    (net,) = network_variants(network, Path.cwd() / "bench")
    layers = model_layer_params()[model]["sizes_in_registration_order"]
    pt = Point(algorithm=algorithm, P=P, network=net, compute=load_profile(compute).model_dump(),
               workload={"n": sum(layers), "layers": layers, "model": model, "density": 0.01, "dtype": "float32",
                         "seed": 0, "drift": 0.1},
               iterations=iterations, warmup=0, check=check, data_scale=data_scale, schedule=schedule,
               batch_size=DEFAULT_BATCH[model])
    pt = with_plan(pt)
    t1 = time.perf_counter()
    row = simulate_point(pt).row
    t2 = time.perf_counter()
    return {"plan_s": t1 - t0, "sim_s": t2 - t1, "wall_s": t2 - t0,
            "peak_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **{k: row[k] for k in ("t_iter_s", "t_forward_s", "t_backward_s", "t_sparsify_s", "t_comm_nonoverlap_s",
                                   "merged_groups", "correct")}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert_base")
    ap.add_argument("--schedule", default="omgs_sgd")
    ap.add_argument("--algorithm", default="oktopk")
    ap.add_argument("--network", default="piz_daint_aries")
    ap.add_argument("--compute", default="p100")
    ap.add_argument("--P", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--data-scale", type=float, default=0.01)
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(**json.loads(a.child))))
        return
    print(f"{a.model}, {a.schedule} over {a.algorithm}, {a.network}, {a.compute}, data_scale {a.data_scale}, "
          f"check {'off' if a.no_check else 'on'}")
    print(f"{'P':>5} {'plan s':>7} {'sim s':>7} {'wall s':>7} {'peak MB':>8} {'t_iter ms':>9} {'fwd':>7} {'bwd':>7} "
          f"{'sparsify':>8} {'comm':>7} {'groups':>6}")
    for P in a.P:
        args = dict(model=a.model, schedule=a.schedule, algorithm=a.algorithm, network=a.network, compute=a.compute,
                    P=P, data_scale=a.data_scale, check=not a.no_check, iterations=a.iterations)
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)], capture_output=True, text=True)
        if out.returncode:
            print(f"{P:>5} failed: {out.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{P:>5} {r['plan_s']:7.1f} {r['sim_s']:7.1f} {r['wall_s']:7.1f} {r['peak_MB']:8.0f} "
              f"{r['t_iter_s'] * 1e3:9.2f} {r['t_forward_s'] * 1e3:7.2f} {r['t_backward_s'] * 1e3:7.2f} "
              f"{r['t_sparsify_s'] * 1e3:8.2f} {r['t_comm_nonoverlap_s'] * 1e3:7.2f} {r['merged_groups']:6d}",
              flush=True)


if __name__ == "__main__":
    main()
