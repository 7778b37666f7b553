"""fft_allgather, qsgd_allgather, terngrad_allgather: results against numpy, error bounds,
unbiasedness, exact bytes, error feedback, and the same bytes and results under mpiexec."""
import dataclasses

import numpy as np
import pytest

from simsparse.algorithms import Setup, get_algorithm
from simsparse.backends.events.sim import Simulator
from simsparse.compression import fft, qsgd, rangequant as rq, terngrad
from simsparse.compression.qsgd import levels
from simsparse.compute.devices import load_profile
from simsparse.experiments.run.runner import simulate_point
from simsparse.network.alphabeta import AlphaBetaNetwork

from tests.helpers import make_point, requires_mpi, simulate
from tests import real_batch

ALGOS = ["fft_allgather", "qsgd_allgather", "terngrad_allgather"]


def run_iterations(name, grads_per_it, params=None, layers=None):
    """Run instances of ``name`` over iterations of given per-rank inputs;
    returns (instances, results per iteration, inputs per iteration)."""
    P, n = len(grads_per_it[0]), len(grads_per_it[0][0])
    cls = get_algorithm(name)
    prm = cls.Params(**(params or {}))
    algs = [cls(Setup(rank=r, P=P, n=n, density=0.01, layers=layers), prm) for r in range(P)]
    sim = Simulator(AlphaBetaNetwork(1e-6, 1e9))
    results, inputs = [], []
    for grads in grads_per_it:
        stats = sim.run([lambda ctx, a=a, g=g: a.iteration(ctx, g) for a, g in zip(algs, grads)])
        results.append(stats.results)
        inputs.append([a.last_input for a in algs])
    return algs, results, inputs


def wire(name, n, params, segments=1):
    if name == "fft_allgather":
        return fft.wire_bytes(n, params.get("theta", 0.85), params.get("bits", 10))
    if name == "qsgd_allgather":
        return qsgd.wire_bytes(n, params.get("bits", 4), params.get("bucket", 512))
    return terngrad.wire_bytes(n, segments)


@pytest.mark.parametrize("name,params", [("fft_allgather", {}), ("fft_allgather", {"theta": 0.3, "bits": 6, "fp16": False}),
                                         ("qsgd_allgather", {}), ("qsgd_allgather", {"bits": 2, "bucket": 100}),
                                         ("terngrad_allgather", {})])
@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_correct_and_exact_bytes(name, params, P):
    n = 777
    for ag in ("rd", "ring"):
        row, res = simulate(name, P, n=n, params={**params, "allgather": ag}, iterations=2, seed=P)
        assert row["correct"] is True
        m = wire(name, n, params)
        assert row["bytes_total"] == P * (P - 1) * m  # every rank receives every other rank's payload once
        if ag == "ring" or P & (P - 1) == 0:
            assert row["bytes_sent_max"] == (P - 1) * m
        for r in res[1:]:
            np.testing.assert_array_equal(r, res[0])  # every rank holds the same vector


def test_quantized_sums_are_within_the_rounding_bound():
    rng = np.random.default_rng(0)
    P, n = 4, 3000
    grads = [[(rng.standard_normal(n) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32) for _ in range(P)]]
    exact = np.sum(grads[0], axis=0, dtype=np.float64)
    for bits in (2, 4, 8):
        _, res, _ = run_iterations("qsgd_allgather", grads, {"bits": bits, "bucket": 64})
        bound = sum(np.repeat(np.abs(np.pad(g, (0, -n % 64))).reshape(-1, 64).max(axis=1), 64)[:n]
                    for g in grads[0]) / levels(bits)  # each rank within scale/s per bucket
        assert np.all(np.abs(res[0][0] - exact) <= bound * (1 + 1e-5) + 1e-5)
    _, res, _ = run_iterations("terngrad_allgather", grads, {"layerwise": False})
    assert np.all(np.abs(res[0][0] - exact) <= sum(np.abs(g).max() for g in grads[0]) * (1 + 1e-6))


def rounding_variance(name, x, bucket=50):
    """Variance of one rank's stochastic rounding of x, per entry: QSGD at 2 bits
    (one level: Bernoulli(|x|/scale) times scale) and TernGrad alike."""
    a = np.abs(x.astype(np.float64))
    if name == "qsgd_allgather":
        scale = np.repeat(a.reshape(-1, bucket).max(axis=1), bucket)
    else:
        scale = np.full_like(a, a.max())
    return a * (scale - a)


@pytest.mark.parametrize("name", ["qsgd_allgather", "terngrad_allgather"])
def test_quantized_sums_are_unbiased(name):
    rng = np.random.default_rng(1)
    P, n, T = 2, 200, 400
    g = [rng.standard_normal(n).astype(np.float32) for _ in range(P)]
    _, res, _ = run_iterations(name, [g] * T, {"bits": 2, "bucket": 50} if name == "qsgd_allgather" else {})
    out = np.array([r[0] for r in res], dtype=np.float64)  # new rounding draws every iteration
    exact = np.sum(g, axis=0, dtype=np.float64)
    var = sum(rounding_variance(name, x) for x in g)
    assert out.var(axis=0).sum() == pytest.approx(var.sum(), rel=0.05)
    random = var > 1e-6
    z = (out.mean(axis=0) - exact)[random] / np.sqrt(var[random] / T)
    assert np.abs(z).max() < 5 and abs(z.mean()) < 0.3
    np.testing.assert_allclose(out.mean(axis=0)[~random], exact[~random], atol=1e-5)


@pytest.mark.parametrize("name,params", [("fft_allgather", {}), ("qsgd_allgather", {"bits": 2}),
                                         ("terngrad_allgather", {})])
def test_error_feedback_residual_is_what_others_did_not_get(name, params):
    rng = np.random.default_rng(2)
    P, n, T = 3, 500, 4
    grads = [[rng.standard_normal(n).astype(np.float32) for _ in range(P)] for _ in range(T)]
    algs, res, inputs = run_iterations(name, grads, {**params, "error_feedback": True})
    cls = type(algs[0])
    for a in algs:  # residual = input - own round trip
        own = cls.reference([inputs[-1][a.setup.rank]], a.setup, a.params, [a.check_state()])
        np.testing.assert_allclose(a.residual, inputs[-1][a.setup.rank] - own, rtol=1e-5, atol=1e-5)
    for t in range(1, T):  # the next input is the gradient plus the residual
        np.testing.assert_allclose(inputs[t][0], grads[t][0] + inputs[t - 1][0] - own_sum(cls, algs, inputs, t - 1, 0),
                                   rtol=1e-5, atol=1e-5)
    # telescoping: what was delivered plus what is still held equals everything computed
    delivered = np.sum([r[0] for r in res], axis=0, dtype=np.float64)
    held = np.sum([a.residual for a in algs], axis=0, dtype=np.float64)
    np.testing.assert_allclose(delivered + held, np.sum(grads, axis=(0, 1), dtype=np.float64), rtol=1e-4, atol=1e-4)


def own_sum(cls, algs, inputs, t, r):
    """Rank r's own contribution at iteration t, recomputed (needs its state at t; FFT keeps its format,
    quantizers' seeds are replayed from (rank, t))."""
    a = algs[r]
    state = a.check_state()
    if "seed" in state:
        from simsparse.algorithms.compressed_allgather import _STAGE
        from simsparse.compression.rng import seed_of

        state = {"seed": seed_of(r, t, _STAGE[a.name])}
    return cls.reference([inputs[t][r]], a.setup, a.params, [state])


def test_layerwise_terngrad_and_compute_model():
    p = make_point("terngrad_allgather", 4, n=600, compute=load_profile("p100").model_dump())
    p = dataclasses.replace(p, workload={**p.workload, "layers": [100, 200, 300]})
    row = simulate_point(p).row
    assert row["correct"] is True and row["bytes_total"] == 12 * terngrad.wire_bytes(600, 3)
    ideal = simulate_point(dataclasses.replace(p, compute=None)).row
    assert row["time_s"] > ideal["time_s"] and row["bytes_total"] == ideal["bytes_total"]  # the kernels cost time
    for name in ("fft_allgather", "qsgd_allgather"):  # every kernel's work function under a cost model
        rows = [simulate_point(make_point(name, 4, n=600, compute=c, params={"error_feedback": True}, iterations=2)).row
                for c in (load_profile("p100").model_dump(), None)]
        assert rows[0]["correct"] is True and rows[0]["time_s"] > rows[1]["time_s"], name


def test_fft_retuning_and_manual_range():
    rng = np.random.default_rng(3)
    grads = [[rng.standard_normal(400).astype(np.float32) * s for _ in range(2)] for s in (1, 100, 100)]
    algs, _, _ = run_iterations("fft_allgather", grads)
    first = algs[0].fmt
    algs, _, _ = run_iterations("fft_allgather", grads, {"retune_every": 1})
    assert algs[0].fmt != first  # the range followed the 100x larger gradients
    algs, res, _ = run_iterations("fft_allgather", grads, {"range_bound": 0.5})
    m, B = algs[0].fmt
    assert B == rq.tune_base(0.5, m, 10)  # the hand-set range, not the data's
    assert np.all(np.isfinite(res[-1][0])) and algs[0].check_state()["fmt"] == (m, B)  # large values saturate


real_batch.register("compressed_allgather", [
    make_point(a, real_batch.P, n=1003, params=prm, iterations=2, warmup=1, seed=7)
    for a, prm in [("fft_allgather", {}),
                   ("fft_allgather", {"error_feedback": True, "retune_every": 1, "allgather": "ring"}),
                   ("qsgd_allgather", {}), ("qsgd_allgather", {"error_feedback": True, "bits": 2}),
                   ("terngrad_allgather", {"error_feedback": True}), ("terngrad_allgather", {"clip": 2.5})]])


@requires_mpi
@pytest.mark.mpi
def test_same_results_and_bytes_under_mpiexec(tmp_path_factory, worker_id):
    real_batch.check_against_simulator("compressed_allgather", tmp_path_factory, worker_id)
