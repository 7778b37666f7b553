"""The real backend with its tensors on a GPU: every algorithm and every
schedule correct and sending the simulator's bytes, and a calibration that
times the GPU's kernels and layers. Skipped where torch sees no CUDA device
(CI); run on a GPU host. With one GPU the ranks of a run share it (correct,
not timed); the calibration keeps its timed rank alone on it."""
import pytest

from simsparse.experiments.run.measure import measure_points
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, requires_cuda, schedule_point

pytestmark = [requires_cuda, pytest.mark.mpi]


def test_every_algorithm_on_the_gpu_is_correct_and_sends_the_simulators_bytes():
    from simsparse.algorithms import ALGORITHMS

    points = [make_point(a, 2, n=600, density=0.05, seed=3, iterations=2, warmup=1) for a in sorted(ALGORITHMS)]
    for point, m in zip(points, measure_points(points, device="cuda")):
        s = simulate_point(point).row
        assert m.row["correct"] is True, (point.algorithm, m.row.get("max_rel_err"))
        assert (m.row["bytes_total"], m.row["msgs_total"]) == (s["bytes_total"], s["msgs_total"]), point.algorithm


def test_every_schedule_on_the_gpu_trains_the_real_model_correctly():
    from simsparse.schedules import SCHEDULES

    algo = {"whole": "rabenseifner", "wfbp": "ring", "mg_wfbp": "recursive_doubling", "dense_ovlp": "ring"}
    points = [schedule_point(s, algo.get(s, "topka"), P=2, batch_size=2, iterations=2, warmup=1)
              for s in sorted(SCHEDULES)]
    for p, m in zip(points, measure_points(points, device="cuda")):
        row = m.row
        assert row["correct"] is True, (p.schedule, p.algorithm, row.get("max_rel_err"))
        assert row["t_forward_s"] > 0 and row["t_backward_s"] > 0
        assert row["merged_groups"] == simulate_point(p).row["merged_groups"], p.schedule


def test_calibration_times_the_gpu_with_its_partner_on_the_cpu(tmp_path):
    """One GPU, two ranks: rank 0 is timed on the GPU alone, rank 1 is its
    partner on the CPU; the profile's kernels and layers are the GPU's."""
    import torch

    from simsparse.calibration import calibrate
    from simsparse.compute.devices import load_profile
    from simsparse.files import yaml_load

    out = calibrate("cuda", 2, tmp_path / "gpu.yaml", quick=True)
    prof = yaml_load(out.read_text())
    assert prof["provenance"]["device"].startswith("cuda:")
    partners = torch.cuda.device_count() < 2
    assert ("partner ranks on the CPU" in prof["compute"]["source"]) == partners
    assert "shared_cores" not in prof["compute"] and prof["compute"]["kernels"]
    dev = load_profile(str(out))
    assert dev.launch_s < 1e-3 and dev.models["resnet20_cifar10"].batch_size == 8
    # a kernel whose result is waited for costs at least the issue of one behind others
    ops = prof["fits"]["op_launch"]
    assert dev.launch_s == ops["issue_s"] < ops["sync_s"]
    # the gradients' ready times are the GPU's (CUDA events), spread over the backward pass
    assert sum(dev.models["resnet20_cifar10"].t_bwd) > 0
