"""The host speed probe (compute/speed_probe.py): what it times, the reference a
calibration keeps, the slowdown a measured point's probe gives, and the device
work that slowdown scales (DeviceProfile.slowdown) in validate's second prediction."""
from dataclasses import replace

import numpy as np
import pytest

from simsparse.calibration import build_profile
from simsparse.compute import speed_probe
from simsparse.compute.devices import DeviceProfile, ParametricDevice
from simsparse.compute.kernels import Work
from simsparse.compute.models import model_profile
from simsparse.experiments.config.schema import load_config
from simsparse.experiments.results.store import ResultsStore

from tests.backends.test_calibration import synthetic_raw


def test_the_probe_times_every_call_on_both_clocks():
    torch = pytest.importorskip("torch")
    got = speed_probe.probe(torch.device("cpu"), reps=1)
    names = [name for name, _ in speed_probe.CALLS]
    assert set(got) == {f"{c}_{k}s" for c in ("cpu", "wall") for k in ["", *(f"{n}_" for n in names)]}
    assert all(0 < v < 5 for v in got.values())
    for clock in ("cpu", "wall"):   # the sum, and each call's median
        assert got[f"{clock}_s"] == pytest.approx(sum(got[f"{clock}_{n}_s"] for n in names))


def test_the_slowdown_is_the_measured_probe_over_the_profiles_in_the_profiles_clock():
    compute = {"speed_probe_s": 0.02, "speed_probe_clock": "cpu"}
    row = {"host_probe_cpu_s": 0.025, "host_probe_wall_s": 0.5}
    assert speed_probe.slowdown(row, compute) == pytest.approx(1.25)
    assert speed_probe.slowdown(row, {**compute, "speed_probe_clock": "wall"}) == pytest.approx(25.0)
    assert speed_probe.slowdown({}, compute) is None                                   # measured without it
    assert speed_probe.slowdown(row, {}) is None                                       # calibrated before it
    assert speed_probe.slowdown({"host_probe_cpu_s": float("nan")}, compute) is None   # a CSV's empty cell


def test_with_each_calls_time_on_both_sides_every_call_counts_once():
    # a sum dominated by the top-k (9 of 10 ms) barely moves when the memory-bound calls slow by half
    compute = {"speed_probe_s": 0.0103, "speed_probe_clock": "cpu",
               "speed_probe_calls_s": {"topk": 0.01, "add": 0.0001, "copy": 0.0001, "scatter_add": 0.0001}}
    row = {"host_probe_cpu_s": 0.01045, "host_probe_cpu_topk_s": 0.01, "host_probe_cpu_add_s": 0.00015,
           "host_probe_cpu_copy_s": 0.00015, "host_probe_cpu_scatter_add_s": 0.00015}
    assert speed_probe.slowdown(row, compute) == pytest.approx(1.5 ** 0.75)
    assert speed_probe.slowdown(row, {k: v for k, v in compute.items() if k != "speed_probe_calls_s"}) == \
        pytest.approx(0.01045 / 0.0103)   # a profile from before: the sums
    # the ranks' and the stack's CPU: the top-k's ratio, the probe's compute-bound call
    assert speed_probe.cpu_slowdown({**row, "host_probe_cpu_topk_s": 0.011}, compute) == pytest.approx(1.1)
    row.pop("host_probe_cpu_copy_s")      # a row from before: the sums
    assert speed_probe.slowdown(row, compute) == pytest.approx(0.01045 / 0.0103)
    row.pop("host_probe_cpu_topk_s")
    assert speed_probe.cpu_slowdown(row, compute) == pytest.approx(0.01045 / 0.0103)


def test_a_calibration_keeps_the_median_probe_in_its_kernels_clock():
    raw = {**synthetic_raw(), "compute_clock": "cpu",
           "speed_probe": [{"cpu_s": c, "wall_s": 9.0, "cpu_topk_s": c - 0.003, "cpu_add_s": 0.001, "cpu_copy_s": 0.001,
                            "cpu_scatter_add_s": 0.001, "wall_topk_s": 6.0, "wall_add_s": 1.0, "wall_copy_s": 1.0,
                            "wall_scatter_add_s": 1.0} for c in (0.020, 0.030, 0.022)]}
    comp = build_profile(raw, 2, "cpu", "test")["compute"]
    assert comp["speed_probe_s"] == pytest.approx(0.022) and comp["speed_probe_clock"] == "cpu"
    assert comp["speed_probe_calls_s"] == pytest.approx({"add": 0.001, "copy": 0.001, "scatter_add": 0.001,
                                                         "topk": 0.019})
    assert DeviceProfile.model_validate(comp).speed_probe_calls_s == comp["speed_probe_calls_s"]
    assert "speed_probe_s" not in build_profile(synthetic_raw(), 2, "cpu", "test")["compute"]


def test_a_slowdown_scales_every_kernel_and_layer_and_leaves_the_profile_as_measured():
    comp = build_profile(synthetic_raw(), 2, "cpu", "test")["compute"]
    base, slow = DeviceProfile.model_validate(comp), DeviceProfile.model_validate({**comp, "slowdown": 1.3})
    for kernel in ("add", "topk", "no_such_kernel"):   # fitted kernels and the roofline of the others
        w = Work(1e5, 8e5)
        assert ParametricDevice(slow).cost(kernel, w) == pytest.approx(1.3 * ParametricDevice(base).cost(kernel, w))
        a = ParametricDevice(slow).cost_array(kernel, np.array([1e3, 1e6]), np.array([8e3, 8e6]))
        assert a == pytest.approx(1.3 * ParametricDevice(base).cost_array(kernel, np.array([1e3, 1e6]),
                                                                          np.array([8e3, 8e6])))
    for bs in (8, 32):   # measured layers (batch 8) and the roofline (another batch)
        assert model_profile("resnet20_cifar10", bs, slow).t_backward == pytest.approx(
            1.3 * model_profile("resnet20_cifar10", bs, base).t_backward)
    # the ranks' own CPU is scaled where the simulator charges it (tests/backends/test_compute_cores.py)
    assert slow.message_cpu_s == base.message_cpu_s and slow.program_cpu_s == base.program_cpu_s


@pytest.mark.slow
def test_validate_predicts_again_at_each_points_measured_speed(tmp_path):
    from simsparse.experiments.analysis.validate import at_measured_speed
    from simsparse.experiments.run.measure import measured_id
    from simsparse.experiments.run.runner import simulate_point

    comp = {**build_profile(synthetic_raw(), 2, "cpu", "test")["compute"], "speed_probe_s": 0.02,
            "speed_probe_clock": "wall"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e10}\n"
                   "workload: {n: [100000, 1000000]}\nalgorithms: [topka]\nP: 2\niterations: 2\nwarmup: 0\n")
    points = [replace(p, compute=comp) for p in load_config(cfg).points]
    meas, pred = ResultsStore(tmp_path / "meas"), ResultsStore(tmp_path / "pred")
    for p, k in zip(points, (1.5, 2.0)):
        o = simulate_point(p)
        pred.add(o.row)
        meas.add({**o.row, "point_id": measured_id(p), "host_probe_wall_s": 0.02 * k})
    said = []
    got = at_measured_speed(points, {2: {"compute": comp}}, meas, tmp_path, said.append)
    # two points of one launch: each is predicted at the median of both probes (_smoothed)
    assert got["median"] == pytest.approx(1.75) and got["min"] == got["max"] == pytest.approx(1.75)
    assert got["points"] == 2
    slow = ResultsStore(tmp_path / "pred_speed").rows
    by_n = {r["n"]: r["time_s"] for r in pred.rows.values()}
    assert len(slow) == 2 and all(r["time_s"] > by_n[r["n"]] for r in slow.values())
    assert (tmp_path / "compare_speed" / "compare.csv").is_file() and "1.750x" in said[0]
    # a measurement without probes (or a profile from before them) says so and predicts nothing again
    assert at_measured_speed(points, {2: {"compute": {k: v for k, v in comp.items() if k != "speed_probe_s"}}},
                             meas, tmp_path / "b", said.append) is None


def test_a_points_speed_is_the_median_probe_of_its_neighbours_in_its_launch():
    """One probe is noisy: the speed a point is predicted at is the median of the probes of the
    SPEED_WINDOW points of its launch (its P) around it, in measured order."""
    from types import SimpleNamespace

    from simsparse.experiments.analysis.validate import SPEED_WINDOW, _smoothed

    assert SPEED_WINDOW == 5
    pts = [SimpleNamespace(P=4, i=i) for i in range(6)] + [SimpleNamespace(P=8, i=i) for i in range(2)]
    ks = [1.0, 1.4, 1.0, 1.1, 1.0, 2.0] + [3.0, 5.0]
    got = _smoothed(list(zip(pts, ks)))
    assert [p for p, _ in got] == pts
    assert [k for _, k in got] == pytest.approx([1.0, 1.05, 1.0, 1.1, 1.05, 1.1, 4.0, 4.0])
