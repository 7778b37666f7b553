"""Kernel noise (compute.noise): a call's time drawn around its median per
band of call time, fitted from the calibration's calls, charged per rank and
call by the simulator so that a step waits for the slowest rank."""
import numpy as np
import pytest
from pydantic import ValidationError

from simsparse.calibration.fit import NOISE_QUANTILES, fit_kernel_noise
from simsparse.compute.devices import DeviceProfile, ParametricDevice
from simsparse.compute.noise import KernelNoise

BANDS = [{"up_to_s": 1e-4, "ratios": [0.9, 1.0, 1.5]}, {"up_to_s": 1.0, "ratios": [1.0, 1.1]}]


def test_draws_are_reproducible_per_rank_and_follow_the_band_of_the_calls_time():
    a, b = KernelNoise(BANDS), KernelNoise(BANDS)
    seq = [a.factor(r, 1e-5) for r in (0, 1) for _ in range(200)]
    assert seq == [b.factor(r, 1e-5) for r in (0, 1) for _ in range(200)]   # the same run, the same draws
    assert seq[:200] != seq[200:]                                            # ranks draw independently
    assert set(seq) == {0.9, 1.0, 1.5}
    long = [a.factor(0, 0.01) for _ in range(3000)] + [a.factor(0, 50.0) for _ in range(3000)]
    assert set(long) == {1.0, 1.1}                                            # longer calls: the last band
    assert np.mean(long) == pytest.approx(1.05, abs=0.005)                    # equally likely
    assert KernelNoise(BANDS).mean(1e-6) == pytest.approx(3.4 / 3)


def test_a_profile_refuses_noise_that_is_not_a_quantile_table():
    with pytest.raises(ValidationError, match="ascending"):
        DeviceProfile(mem_bandwidth_Bps=1e9, kernel_noise=[{"up_to_s": 1.0, "ratios": [1.2, 0.9]}])
    with pytest.raises(ValidationError):
        DeviceProfile(mem_bandwidth_Bps=1e9, kernel_noise=[{"up_to_s": 1.0, "ratios": [1.0]}])


def test_the_fit_recovers_each_decades_spread_and_merges_thin_bands():
    """Calls of 50 us spread by +-40 %, of 5 ms by +-5 %; a size timed 3 times is left out; a decade with too
    few samples joins the next longer one."""
    rng = np.random.default_rng(1)
    calls = []
    for elems, med, spread in ((1e3, 50e-6, 0.4), (1e5, 5e-3, 0.05)):
        for _ in range(400):
            calls.append(("add", elems, 8 * elems, med * (1 + rng.uniform(-spread, spread)), 0))
    calls += [("topk", 7.0, 28.0, 2e-6 * f, 0) for f in (1.0, 9.0, 9.0)]            # 3 calls: no median
    calls += [("copy", 30.0, 120.0, 3e-6 * (1 + 0.01 * i), 0) for i in range(10)]   # 10 samples: joins 1e-4
    bands, fits = fit_kernel_noise(calls)
    assert [b["up_to_s"] for b in bands] == pytest.approx([1e-4, 1e-2])
    assert [f["samples"] for f in fits] == [410, 400]
    assert all(len(b["ratios"]) == NOISE_QUANTILES for b in bands)
    assert bands[0]["ratios"][0] == pytest.approx(0.6, abs=0.05) and bands[0]["ratios"][-1] == pytest.approx(1.4, abs=0.05)
    assert bands[1]["ratios"][0] == pytest.approx(0.95, abs=0.01) and bands[1]["ratios"][-1] == pytest.approx(1.05, abs=0.01)
    DeviceProfile(mem_bandwidth_Bps=1e9, kernel_noise=bands)   # a valid profile field


def test_the_simulator_charges_each_call_its_drawn_factor_and_a_step_waits_for_the_slowest_rank():
    from simsparse.backends.events.sim import Simulator
    from simsparse.network.spec import AlphaBetaSpec
    from simsparse.ops import Dense

    line = 1e-8 * 1000   # 10 us per add of 1000 elements

    def run(noise):
        prof = DeviceProfile(mem_bandwidth_Bps=1e9, kernels={"add": {"launch_s": 0.0, "per_elem_s": 1e-8}},
                             kernel_noise=noise)
        sim = Simulator(AlphaBetaSpec(alpha_s=0.0, bandwidth_Bps=1e15).build(), ParametricDevice(prof))
        x = np.ones(1000, np.float32)

        def prog(ctx):
            for _ in range(6):
                yield ctx.compute("add", x, x)
            t = ctx.now()
            yield ctx.waitall([ctx.irecv(ctx.rank ^ 1), ctx.isend(ctx.rank ^ 1, Dense(x[:1]))])
            return t

        st = sim.run([prog] * 2)
        return st.results, st.finish_s

    own, finish = run(None)
    assert own == pytest.approx([6 * line] * 2)
    noisy, finish = run(BANDS)
    draw = KernelNoise(BANDS)
    expect = [sum(line * draw.factor(r, line) for _ in range(6)) for r in (0, 1)]
    assert noisy == pytest.approx(expect, rel=1e-12) and noisy[0] != noisy[1]
    assert finish == pytest.approx([max(expect)] * 2)   # the exchange ends when the slower rank is there


def test_lockstep_rounds_stand_aside_when_kernels_are_noisy():
    from simsparse.experiments.run.resolve import resolve
    from tests.helpers import make_point

    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-6}
    quiet = resolve(make_point("ring", 4, n=4096, compute=prof, evaluation="fast")).plan
    noisy = resolve(make_point("ring", 4, n=4096, compute={**prof, "kernel_noise": BANDS}, evaluation="fast")).plan
    assert quiet.point[0].name == "rounds" and noisy.point[0].name == "events"


def test_collectives_run_as_messages_when_kernels_are_noisy():
    """A bulk collective times its reductions for all ranks at once; with noise each rank's kernel draws its own
    factor, so the simulator expands collectives into messages (the row says so)."""
    from simsparse.experiments.run.runner import simulate_point
    from tests.helpers import make_point

    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-6}
    quiet = simulate_point(make_point("oktopk", 8, n=4096, density=0.05, compute=prof, evaluation="fast"))
    noisy = simulate_point(make_point("oktopk", 8, n=4096, density=0.05, compute={**prof, "kernel_noise": BANDS}))
    assert quiet.row["evaluator"] != "events" and noisy.row["evaluator"] == "events"
    assert noisy.row["bytes_total"] == quiet.row["bytes_total"]
    assert noisy.row["time_s"] > quiet.row["time_s"]   # every factor of BANDS' short band averages above 1


def test_the_layers_forward_and_backward_pieces_draw_the_noise_too():
    """Each forward and each backward piece of a training iteration draws its factor as a kernel call does
    (a rank's pieces then spread as the measured ones do, and with them where its short calls fall in the
    scheduler's slice); the row is the same with the trace on as off (the compiled backward clock, which
    draws nothing, stands aside)."""
    import dataclasses

    from simsparse.experiments.run.runner import simulate_point
    from tests.helpers import schedule_point

    quiet = schedule_point("wfbp", "ring", P=2, iterations=1, warmup=0)
    noisy = dataclasses.replace(quiet, compute={**quiet.compute, "kernel_noise": BANDS})

    def pieces(point):
        o = simulate_point(point, trace=True)
        mine = sorted((t["rank"], t["start_s"], t["end_s"]) for t in o.trace if t["op"] in ("forward", "backward"))
        return o.row, [(r, end - start) for r, start, end in mine]   # each rank's pieces in order

    q_row, q = pieces(quiet)
    n_row, n = pieces(noisy)
    assert [r for r, _ in q] == [r for r, _ in n] and len(n) > 2
    ratios = {round(b / a, 9) for (_, a), (_, b) in zip(q, n) if a > 0}
    assert ratios <= {0.9, 1.0, 1.5, 1.1} and len(ratios) > 1   # each piece one of its band's ratios
    assert simulate_point(noisy).row["time_s"] == n_row["time_s"] != q_row["time_s"]


def test_a_models_own_bands_time_its_pieces_where_its_timing_kept_them():
    """Where the model's timing kept the spread of its pieces (``ModelTimes.noise``), the forward and backward
    pieces draw from those bands, not the kernels' (two to three times wider, and skewed: every layer took
    some 5 % more than its measured median); the kernels still draw from theirs."""
    import dataclasses

    from simsparse.experiments.run.runner import simulate_point
    from simsparse.experiments.run.simulate import model_profile_of
    from tests.helpers import schedule_point

    quiet = schedule_point("wfbp", "ring", P=2, iterations=1, warmup=0)
    prof = model_profile_of(quiet)
    times = {"batch_size": prof.batch_size, "t_fwd": list(prof.t_fwd), "t_bwd": list(prof.t_bwd)}
    model = quiet.workload["model"]

    def with_times(noise):
        models = {model: {**times, **({"noise": noise} if noise else {})}}
        return dataclasses.replace(quiet, compute={**quiet.compute, "kernel_noise": BANDS, "models": models})

    def pieces(point):
        o = simulate_point(point, trace=True)
        mine = sorted((t["rank"], t["start_s"], t["end_s"]) for t in o.trace if t["op"] in ("forward", "backward"))
        kernels = [t["end_s"] - t["start_s"] for t in o.trace if t["op"].startswith("compute:")]
        return [end - start for _, start, end in mine], kernels

    base, _ = pieces(dataclasses.replace(quiet, compute={**quiet.compute, "models": {model: times}}))
    doubled, kernels = pieces(with_times([{"up_to_s": 1.0, "ratios": [2.0, 2.0]}]))
    assert len(base) > 2 and doubled == pytest.approx([2 * d for d in base], rel=1e-12)
    drawn, _ = pieces(with_times(None))   # no bands of its own: the kernels' (BANDS)
    assert {round(b / a, 9) for a, b in zip(base, drawn) if a > 0} <= {0.9, 1.0, 1.5, 1.1}
    assert kernels and any(k > 0 for k in kernels)


def test_the_layers_repetitions_give_their_own_bands():
    """calibration.layer_times fits the pieces' spread from every rank's repetitions (banded as the kernel
    calls are): the whole forward, one piece, in a band of its own where its decade holds nothing else; a
    timing without them keeps none (older profiles)."""
    from simsparse.calibration import layer_times
    from simsparse.compute.models import model_table

    rng = np.random.default_rng(3)
    L = len(model_table("resnet20_cifar10")["tensors"])
    med = np.where(np.arange(L) % 3 == 0, 2e-3, 0.0)   # a module's other tensors: ready at once (0)
    reps = [("forward", 0, 0, 0.02 * f, r) for r in range(8) for f in rng.uniform(0.99, 1.01, 5)]
    reps += [(f"backward {i}", 0, 0, t * f, r) for r in range(8) for _ in range(5) for i, t in enumerate(med)
             if t > 0 for f in rng.uniform(0.9, 1.1, 1)]
    raw = {"batch_size": 8, "forward_s": 0.02, "backward_s": list(med), "reps": reps}
    (m,) = layer_times({"resnet20_cifar10": raw})[1].values()
    pieces, forward = m["noise"]
    assert pieces["up_to_s"] == 1e-2 and forward["up_to_s"] == 0.1
    assert 0.85 < min(pieces["ratios"]) < 0.95 and 1.05 < max(pieces["ratios"]) < 1.15
    assert 0.985 < min(forward["ratios"]) and max(forward["ratios"]) < 1.015
    old = {k: v for k, v in raw.items() if k != "reps"}
    assert "noise" not in layer_times({"resnet20_cifar10": old})[1]["resnet20_cifar10"]
