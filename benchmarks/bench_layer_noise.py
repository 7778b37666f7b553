"""How a model's layer pieces vary around their medians, and whether the ranks of one host vary together.

    python benchmarks/bench_layer_noise.py [--model resnet32_cifar10] [--batch-size 16] [--ranks 8] [--reps 12]

Every rank (under ``mpiexec -n RANKS``, with the real backend's environment:
``rank_env``) times the model's forward and each tensor's backward interval
after a barrier, by its CPU clock, as ``calibrate`` and ``validate`` time
layers where ranks outnumber cores (``calibration.worker.layers``, whose
repetitions ``calibration.layer_times`` bands for the simulator). Rank 0 prints, for
the forward, the backward's total and the pieces of at least 0.2 ms:

* ``sd``: the standard deviation of a piece's time over its own median
  (the spread the simulator draws each piece from);
* ``icc``: the share of that spread common to all ranks at one repetition
  (one-way intra-class correlation, repetitions as groups): 0 where the ranks
  vary independently, 1 where they slow down together.

It also prints the spread of the profile's kernel bands for comparison where
``--profile`` names a calibrated machine profile.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def _icc(x: np.ndarray) -> tuple[float, float]:
    """(icc, sd) of ranks x reps times, each rank's over its own median."""
    r = x / np.median(x, axis=1, keepdims=True)
    p, n = r.shape
    grand = r.mean()
    between = p * ((r.mean(axis=0) - grand) ** 2).sum() / (n - 1)
    within = ((r - r.mean(axis=0)) ** 2).sum() / (n * (p - 1))
    return float((between - within) / (between + (p - 1) * within)), float(r.std())


def _rank(a) -> None:
    from mpi4py import MPI
    import torch

    from simsparse import models

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    now = time.process_time
    torch.manual_seed(0)
    model = models.build(a.model)
    params = list(model.parameters())
    ready = [0.0] * len(params)
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda _p, i=i: ready.__setitem__(i, now()))
    fwd, bwd = [], []
    for it in range(a.reps + 1):
        batch = models.example_batch(a.model, a.batch_size, generator=torch.Generator().manual_seed(it))
        for p in params:
            p.grad = None
        comm.Barrier()
        t0 = now()
        loss = models.loss(a.model, model, batch)
        t1 = now()
        loss.backward()
        if it == 0:
            continue   # warm-up
        fwd.append(t1 - t0)
        prev, iv = t1, [0.0] * len(params)
        for i in sorted(range(len(params)), key=lambda i: ready[i]):
            iv[i] = max(0.0, ready[i] - prev)
            prev = max(prev, ready[i])
        bwd.append(iv)
    got = comm.gather((fwd, bwd), root=0)
    if comm.Get_rank() != 0:
        return
    F = np.array([g[0] for g in got])
    B = np.array([g[1] for g in got])
    big = [j for j in range(B.shape[2]) if np.median(B[:, :, j]) > 2e-4]
    pieces = [_icc(B[:, :, j]) for j in big]
    out = {"model": a.model, "batch_size": a.batch_size, "ranks": F.shape[0], "reps": a.reps,
           "forward": dict(zip(("icc", "sd"), _icc(F))), "backward_total": dict(zip(("icc", "sd"), _icc(B.sum(axis=2)))),
           "pieces": len(big), "pieces_sd_median": float(np.median([p[1] for p in pieces])),
           "pieces_icc_median": float(np.median([p[0] for p in pieces])),
           "pieces_icc_quartiles": [float(np.quantile([p[0] for p in pieces], q)) for q in (0.25, 0.75)]}
    print(json.dumps(out, indent=1))


def _kernel_bands(path: str) -> None:
    import yaml

    with open(path) as f:
        bands = yaml.safe_load(f)["compute"].get("kernel_noise") or []
    for b in bands:
        r = np.asarray(b["ratios"])
        print(f"kernel band up to {b['up_to_s']:.0e} s: sd {r.std():.3f}, mean {r.mean():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet32_cifar10")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--profile", help="a calibrated machine profile whose kernel bands to print beside")
    a = ap.parse_args()
    if "PMI_RANK" in os.environ:
        return _rank(a)
    from simsparse.backends.real.rank_env import rank_env
    from simsparse.experiments.run.measure import find_mpiexec

    subprocess.run([find_mpiexec(), "-n", str(a.ranks), sys.executable, __file__, "--model", a.model,
                    "--batch-size", str(a.batch_size), "--reps", str(a.reps)], env=rank_env(), check=True)
    if a.profile:
        _kernel_bands(a.profile)


if __name__ == "__main__":
    main()
