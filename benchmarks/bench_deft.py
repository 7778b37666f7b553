"""DEFT against TopkA, gTopk, Gaussiank and CLT-k: density, selection cost, time.

    python benchmarks/bench_deft.py [model] [density] [network.yaml] [profile]

Defaults: ResNet-20 layer sizes (``simsparse/data/layer_params.json``), density
0.01, the Aries alpha-beta preset, the V100 device profile (DEFT's GPUs).
Gradients: normal, per-layer RMS log-uniform over two decades (the workload's
``layer_spread: 2``), independent across ranks. Prints for P = 2..64:

1. actual density of the result / set density (gradient build-up, DEFT Fig. 1, 4);
2. DEFT's selection speedup over a full top-k (Eq. 6, claimed >= P by Eq. 9),
   from the top-k calls each rank ran: with Eq. 3's ``n log2 k`` cost, with the
   profile's sort model ``s n log2 n`` (no launch cost), and with the profile
   as is (launch cost per call);
3. simulated iteration time and bytes sent by the busiest rank;
4. Eq. 9 at the planning level (no simulation) for every model in the table,
   norms ``sqrt(n_x)`` times the layer scale: f(P)/P, below 1 where it fails.
"""
import math
import sys
from pathlib import Path

import numpy as np
import yaml

from simsparse.algorithms import Setup, get_algorithm
from simsparse.algorithms.deft import assign_k, bin_pack, partition, selection_cost
from simsparse.backends.events.sim import Simulator
from simsparse.compute.devices import DeviceProfile, ParametricDevice, load_profile
from simsparse.compute.kernels import get_kernel
from simsparse.experiments.config.point import to_dense
from simsparse.network.spec import NETWORK_SPECS
from simsparse.workload import Workload, model_layer_params

ROOT = Path(__file__).resolve().parent.parent
ALGOS = ["topka", "gaussiank", "gtopk", "cltk", "deft"]
PS = [2, 4, 8, 16, 32, 64]


def simulate(name, grads, layers, density, network, device):
    """One iteration; returns (IterationStats, per-rank Eq. 3 selection cost)."""
    cls = get_algorithm(name)
    P = len(grads)
    algs = [cls(Setup(rank=r, P=P, n=len(grads[0]), density=density, layers=layers)) for r in range(P)]
    topk, real = get_kernel("topk"), get_kernel("topk").numpy
    owner, eq3 = {id(g): r for r, g in enumerate(grads)}, [0.0] * P

    def recording(x, k):  # attribute each top-k call to the rank whose gradient it reads
        eq3[owner[id(x if x.base is None else x.base)]] += selection_cost(len(x), k)
        return real(x, k)

    topk.numpy = recording
    try:
        sim = Simulator(network.build(), device, **network.protocol(), trace=True)
        stats = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, grads)])
    finally:
        topk.numpy = real
    return stats, eq3


def select_time(stats, P):
    t = [0.0] * P
    for rank, phase, op, _, _, start, end in stats.trace:
        if phase == "select" and op == "compute:topk":
            t[rank] += end - start
    return max(t)


def planning_table(density):
    print("\nEq. 9 at the planning level: f(P)/P with Eq. 3 costs (norms sqrt(n_x) x layer scale)")
    print(f"{'model':24s}" + "".join(f"{'P=' + str(P):>8s}" for P in PS))
    for model, rec in sorted(model_layer_params().items()):
        layers = rec["sizes_in_registration_order"]
        n, k = sum(layers), round(density * sum(layers))
        scale = 10 ** (-2 * np.random.default_rng(0).uniform(size=len(layers)))
        row = []
        for P in PS:
            frags = partition(layers, P)
            layer_of = np.searchsorted(np.cumsum(layers), [a for a, _ in frags], side="right")
            sizes = [b - a for a, b in frags]
            ks = assign_k([math.sqrt(s) * scale[li] for s, li in zip(sizes, layer_of)], sizes, k)
            bins, _ = bin_pack(sizes, ks, P)
            worst = max(sum(selection_cost(sizes[j], ks[j]) for j in b) for b in bins)
            row.append(n * math.log2(k) / worst / P)
        print(f"{model:24s}" + "".join(f"{v:8.2f}" for v in row))


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "resnet20_cifar10"
    density = float(sys.argv[2]) if len(sys.argv) > 2 else 0.01
    net_file = Path(sys.argv[3]) if len(sys.argv) > 3 else ROOT / "topologies" / "aries_alphabeta.yaml"
    profile = load_profile(sys.argv[4] if len(sys.argv) > 4 else "v100")
    spec = yaml.safe_load(net_file.read_text())
    network = NETWORK_SPECS[spec.get("model", "alphabeta")].model_validate(spec)
    sort_only = DeviceProfile(name="sort-model", mem_bandwidth_Bps=1e30,
                              kernels={"topk": {**profile.kernels["topk"].model_dump(), "launch_s": 0.0}})
    layers = tuple(model_layer_params()[model]["sizes_in_registration_order"])
    n = sum(layers)
    wl = Workload(n=n, density=density, model=model, layer_spread=2.0, seed=0)
    print(f"{model}: n = {n}, {len(layers)} tensors, density {density}, k = {round(density * n)}; "
          f"{network.label()}, {profile.name}")
    dens, t_iter, sent = {}, {}, {}
    sel = {"eq3": [], "sort": [], "profile": []}
    for P in PS:
        grads = wl.grads(P, 0)
        full = {}
        for name in ALGOS:
            stats, eq3 = simulate(name, grads, layers, density, network, ParametricDevice(profile))
            dens[name, P] = np.count_nonzero(to_dense(stats.results[0], n)) / n / density
            t_iter[name, P], sent[name, P] = stats.time_s, max(stats.bytes_sent)
            if name in ("topka", "deft"):
                fast, _ = simulate(name, grads, layers, density, network, ParametricDevice(sort_only))
                full[name] = (max(eq3), select_time(fast, P), select_time(stats, P))
        for i, key in enumerate(sel):
            sel[key].append(full["topka"][i] / full["deft"][i])
    print("\nactual density / set density")
    print(f"{'algorithm':12s}" + "".join(f"{'P=' + str(P):>9s}" for P in PS))
    for name in ALGOS:
        print(f"{name:12s}" + "".join(f"{dens[name, P]:9.2f}" for P in PS))
    print(f"{'union(iid)':12s}" + "".join(f"{(1 - (1 - density) ** P) / density:9.2f}" for P in PS))
    print("\nDEFT selection speedup over a full top-k, f(P) (Eq. 9 claims >= P)")
    for key, label in [("eq3", "Eq. 3 n log2 k"), ("sort", "s n log2 n"), ("profile", f"{profile.name} + launch")]:
        print(f"{label:16s}" + "".join(f"{v:9.2f}" for v in sel[key]))
    print("\nsimulated iteration time (ms) / bytes sent by the busiest rank (KiB)")
    for name in ALGOS:
        print(f"{name:12s}" + "".join(f"{1e3 * t_iter[name, P]:8.3f}/{sent[name, P] / 1024:<8.0f}" for P in PS))
    planning_table(density)


if __name__ == "__main__":
    main()
