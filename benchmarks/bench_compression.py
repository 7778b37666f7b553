"""FFT sparsification and its baselines (Wang et al., HPDC'20): fidelity, size, time, benefit.

    python benchmarks/bench_compression.py [--quick]

1. Fidelity and compression ratio of one rank's gradient (n = 2^20 synthetic
   values of three distributions, and a real gradient of a small torch CNN):
   relative L2 error ||C(x) - x|| / ||x|| and 4n / payload bytes, for FFT
   (theta 0.85 and 0.5, N = 10 bits), Top-k keeping as many values as FFT
   theta = 0.85 keeps numbers (COO), QSGD (4 and 2 bits, buckets of 512) and
   TernGrad.
2. Simulated time of one exchange against P on the Comet preset
   (topologies/comet_fdr_4gpu.yaml: the paper's 4 P100 per node, FDR fat
   tree), ideal compute, n = 2^18 float32: the three compressed allgathers
   against the dense ring allreduce.
3. The section 3.3 benefit model with the throughputs of the numpy kernels
   measured on this machine: the minimal compression ratio that pays on
   1 GbE, 10 GbE and FDR InfiniBand.
"""
import argparse
import time

import numpy as np

from simsparse.algorithms import get_algorithm
from simsparse.compression import fft
from simsparse.compression import rangequant as rq
from simsparse.compute.kernels import get_kernel
from simsparse.experiments.config.sources import networks as _networks
from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point
from simsparse.workload import Workload

CODECS = [("fft theta=0.85 N=10", "fft_allgather", {"theta": 0.85}),
          ("fft theta=0.5 N=10", "fft_allgather", {"theta": 0.5}),
          ("qsgd 4 bit", "qsgd_allgather", {"bits": 4}),
          ("qsgd 2 bit", "qsgd_allgather", {"bits": 2}),
          ("terngrad", "terngrad_allgather", {"layerwise": False})]


def roundtrip(name, params, x):
    """One rank's compress-decompress (what every receiver reconstructs) and the payload bytes."""
    from simsparse.algorithms.base import Setup

    cls = get_algorithm(name)
    alg = cls(Setup(rank=0, P=1, n=len(x), density=0.01), cls.Params(**params))
    gen = alg.compress(_Ctx(), x)
    payload = _drive(gen)
    return _drive(alg.decompress(_Ctx(), [payload], x)), payload.nbytes


class _Ctx:
    @staticmethod
    def compute(kernel, *args, **kw):
        return (kernel, args, kw)


def _drive(gen):
    value = None
    while True:
        try:
            kernel, args, kw = gen.send(value)
        except StopIteration as stop:
            return stop.value
        value = get_kernel(kernel).numpy(*args, **kw)


def cnn_gradient():
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(1024, 10))
    loss = torch.nn.functional.cross_entropy(net(torch.randn(16, 3, 32, 32)), torch.randint(0, 10, (16,)))
    loss.backward()
    return np.concatenate([p.grad.reshape(-1).numpy() for p in net.parameters()])


def fidelity(n):
    xs = {f"{d} n=2^{n.bit_length() - 1}": Workload(n=n, distribution=d, df=4).grad(0, 0)
          for d in ("normal", "laplace", "student_t")}
    try:
        xs["small CNN gradient"] = cnn_gradient()
    except ImportError:
        pass
    print("1. one rank's gradient: relative L2 error (compression ratio 4n/bytes)")
    heads = [c[0] for c in CODECS] + ["top-k same count (COO)"]
    print(f"{'gradient':<24}" + "".join(f"{h:>24}" for h in heads))
    for label, x in xs.items():
        cells = []
        for _, name, params in CODECS:
            y, nb = roundtrip(name, params, x)
            cells.append(f"{_rel(y, x):.3f} ({4 * len(x) / nb:5.1f}x)")
        k = 2 * fft.keep_count(len(x), 0.85)  # FFT keeps K complex = 2K numbers
        sel = get_kernel("topk").numpy(x, k)
        y = np.zeros_like(x)
        y[sel.indices] = sel.values
        cells.append(f"{_rel(y, x):.3f} ({4 * len(x) / sel.nbytes:5.1f}x)")
        print(f"{label:<24}" + "".join(f"{c:>24}" for c in cells))


def _rel(y, x):
    return float(np.linalg.norm(y.astype(np.float64) - x) / np.linalg.norm(x.astype(np.float64)))


def sim_time(Ps, n):
    net = _networks("topologies/comet_fdr_4gpu.yaml", __import__("pathlib").Path("."))[0]
    algos = [("dense ring", "ring", {})] + CODECS[::2]
    print(f"\n2. simulated exchange time [ms], Comet FDR preset, ideal compute, n = {n} float32")
    print(f"{'P':>4}" + "".join(f"{a[0]:>22}" for a in algos))
    for P in Ps:
        cells = []
        for _, name, params in algos:
            pt = Point(algorithm=name, P=P, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
                       network=net, params=params, iterations=1, warmup=0, check=True)
            row = simulate_point(pt).row
            assert row["correct"], (name, P)
            cells.append(f"{row['time_s'] * 1e3:.3f}")
        print(f"{P:>4}" + "".join(f"{c:>22}" for c in cells))


def throughput(fn, nbytes, reps=3):
    best = min(_time(fn) for _ in range(reps))
    return nbytes / best


def _time(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def benefit(n):
    x = Workload(n=n).grad(0, 0)
    X = np.fft.rfft(x.astype(np.float64), norm="ortho")
    v = X.view(np.float64).astype(np.float32)
    fmt = rq.tune_base(float(np.abs(v).max()), 6, 10)
    mask = np.zeros(len(X), np.int64)
    mask[: len(X) // 7] = 1
    codes = rq.encode(v, 10, 6, fmt)
    t = dict(conv=throughput(lambda: (x.astype(np.float16), rq.encode(v, 10, 6, fmt)), 4 * n),
             fft=throughput(lambda: np.fft.rfft(x.astype(np.float64), norm="ortho"), 4 * n),
             pack=throughput(lambda: (rq.pack_bits(mask, 1), rq.pack_bits(codes[: n // 7], 10)), 4 * n),
             topk=throughput(lambda: np.argpartition(-np.abs(X), n // 14), 4 * n))
    print(f"\n3. section 3.3 benefit model, numpy kernels on this CPU (n = {n}): throughputs "
          + ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in t.items()))
    ratio = 4 * n / fft.wire_bytes(n, 0.85, 10)
    for label, net in (("1 GbE", 1e9 / 8), ("10 GbE", 10e9 / 8), ("FDR 56 Gb/s", 54.5e9 / 8)):
        r = fft.min_compression_ratio(fft.Throughputs(**t, net=net))
        # the throughput every primitive needs (all equal) for theta = 0.85, N = 10 to pay
        per_byte = fft.Throughputs(1, 1, 1, 1, net).compress_s_per_byte()
        need = per_byte / ((1 - 1 / ratio) / net)
        print(f"   {label:<12} minimal ratio that pays with these kernels: {r:.2f}; "
              f"for FFT's {ratio:.1f}x every primitive needs >= {need / 1e9:.2f} GB/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer P")
    a = ap.parse_args()
    fidelity(1 << (16 if a.quick else 20))
    sim_time([2, 4] if a.quick else [2, 4, 8, 16, 32], 1 << (14 if a.quick else 18))
    benefit(1 << (16 if a.quick else 22))


if __name__ == "__main__":
    main()
