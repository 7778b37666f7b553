"""Helpers shared by the test files: points to simulate, and skip marks for the real backend."""
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from simsparse.compute.devices import load_profile
from simsparse.experiments.config.sources import network_variants
from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point

HAVE_MPI = all(importlib.util.find_spec(m) for m in ("mpi4py", "torch")) and (
    (Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec") is not None)
HAVE_TORCH = importlib.util.find_spec("torch") is not None

ALPHA, BW = 2.0e-6, 1.0e9
REPO = Path(__file__).resolve().parents[1]   # the repository root

requires_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs the [mpi] extra (mpi4py, torch, mpiexec)")
requires_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")


def _have_cuda() -> bool:
    """Whether torch sees a CUDA GPU; without a GPU driver's device (NVIDIA's, or WSL's) it cannot, and
    torch (1.5 s and 220 MB per test worker) is not imported just to say so."""
    if not HAVE_MPI or not any(Path(d).exists() for d in ("/dev/nvidiactl", "/dev/dxg")):
        return False
    import torch

    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not _have_cuda(), reason="needs a CUDA GPU that torch sees (and the [mpi] extra)")


def checked(algorithm: str) -> str:
    """The knob that carries every value of ``algorithm`` (so its results are
    checked) and times it exactly: the events for a dense allreduce (exact and
    fast carry only its sizes), exact for the others."""
    from simsparse.algorithms import get_algorithm

    return "events" if get_algorithm(algorithm).value_free else "exact"


def make_point(algorithm, P, n=1024, density=0.05, params=None, alpha=ALPHA, bw=BW, eager=65536,
               iterations=1, warmup=0, seed=0, compute=None, evaluation=None, **net):
    """A bare-collective point; by default every value carried, so results are checked (:func:`checked`)."""
    return Point(algorithm=algorithm, P=P, params=params or {},
                 workload={"n": n, "density": density, "dtype": "float32", "seed": seed},
                 network={"model": "alphabeta", "alpha_s": alpha, "bandwidth_Bps": bw, "eager_threshold_B": eager,
                          **net},
                 compute=compute, iterations=iterations, warmup=warmup, check=True,
                 evaluation=evaluation or checked(algorithm))


def simulate(algorithm, P, **kw):
    """Simulate one point; returns (results row, per-rank results of the last iteration)."""
    out = simulate_point(make_point(algorithm, P, **kw), keep_results=True)
    return out.row, out.results


def net(preset):
    """The network section of a shipped preset (``topologies/<preset>.yaml``)."""
    (n,) = network_variants(preset, Path.cwd() / "x")
    return n


def schedule_point(schedule, algorithm, P=4, params=None, sparams=None, model="resnet20_cifar10",
                   compute="p102_100", network=None, density=0.01, iterations=2, warmup=1, batch_size=8,
                   data_scale=1.0, evaluation=None):
    """A training point: one iteration of ``model``'s layers under a layer-wise schedule."""
    from simsparse.workload import model_layer_params

    layers = model_layer_params()[model]["sizes_in_registration_order"]
    comp = None if compute is None else load_profile(compute).model_dump()
    return Point(algorithm=algorithm, P=P, params=params or {}, compute=comp,
                 workload={"n": sum(layers), "layers": layers, "model": model, "density": density,
                           "dtype": "float32", "seed": 3},
                 network=network or {"model": "alphabeta", "alpha_s": 5e-6, "bandwidth_Bps": 1e9},
                 iterations=iterations, warmup=warmup, schedule=schedule, schedule_params=sparams or {},
                 batch_size=batch_size, data_scale=data_scale, evaluation=evaluation or checked(algorithm))


def protocol_variants(algorithm, compute):
    """(P, variant, point) for P = 5 and 13 and four protocols: eager; rendezvous
    with a handshake; an unexpected window with reduced data; factors per size
    band from 64 B up (every message scaled). The compiled and Python twins
    of the bulk timing are compared on these."""
    import dataclasses

    scaled = {"model": "alphabeta", "alpha_s": 2e-6, "bandwidth_Bps": 5e9,
              "size_scale": [[64, 1.7], [512, 0.8], [4096, 1.3]]}
    for P in (5, 13):
        for variant in range(4):
            kw = dict(eager=256, rendezvous_rtt_s=3e-6 if variant == 1 else 0.0) if variant in (1, 2) else {}
            p = make_point(algorithm, P, n=4000, density=0.02, iterations=2, warmup=1, compute=compute, seed=P, **kw)
            if variant == 2:
                p = dataclasses.replace(p, network={**p.network, "unexpected_window_B": 1000}, data_scale=0.3)
            if variant == 3:
                p = dataclasses.replace(p, network=scaled)
            yield P, variant, p


def sim_backend(point, trace=False):
    """The simulator backend of ``point``, resolved as ``simulate`` resolves it."""
    from simsparse.experiments.run.resolve import resolve
    from simsparse.experiments.run.simulate import SimBackend

    network = point.network_spec().build()
    return SimBackend(resolve(point, network, trace), network, trace)


def cli_run(argv, capsys) -> tuple:
    """``simsparse`` in this process: (exit status, what it printed on stderr, seconds)."""
    import time

    from simsparse.cli import main

    t0 = time.perf_counter()
    code = main(argv)
    return code, capsys.readouterr().err, time.perf_counter() - t0


def write_config(tmp_path, body: str, name: str = "bad.yaml"):
    """A config file of ``body`` (dedented) in ``tmp_path``."""
    import textwrap

    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p
