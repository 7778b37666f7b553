"""Configs: grids expand; bad input gives one paragraph naming file and key, exit 2, nothing written."""
import subprocess
import sys
import textwrap

import pytest

from simsparse.cli import main
from simsparse.experiments.config.schema import load_config

GOOD = """
name: t
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
workload: {n: 256, density: 0.1}
algorithms: [ring, topka]
P: [2, 4]
iterations: 1
warmup: 0
"""


def write(tmp_path, text, name="cfg.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_lists_expand_into_a_grid(tmp_path):
    cfg = write(tmp_path, GOOD.replace("density: 0.1", "density: [0.1, 0.2]")
                .replace("alpha_s: 1.0e-6", "alpha_s: [1.0e-6, 2.0e-6]")
                .replace("[ring, topka]", "[ring, {name: topka, allgather: [rd, ring]}]"))
    exp = load_config(cfg)
    # 2 alphas x 2 densities x 2 P x (ring + 2 topka variants)
    assert len(exp.points) == 2 * 2 * 2 * 3
    assert len({p.point_id("sim") for p in exp.points}) == len(exp.points)
    assert {p.params.get("allgather") for p in exp.points if p.algorithm == "topka"} == {"rd", "ring"}


def test_preset_and_overrides(tmp_path):
    (tmp_path / "net.yaml").write_text("model: alphabeta\nalpha_s: 3.0e-6\nbandwidth_Bps: 5.0e9\n")
    cfg = write(tmp_path, GOOD.replace("network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}",
                                       "network: {preset: net.yaml, alpha_s: 4.0e-6}"))
    p = load_config(cfg).points[0]
    assert p.network["alpha_s"] == 4.0e-6 and p.network["bandwidth_Bps"] == 5.0e9


def test_builtin_preset_and_device_profile(tmp_path):
    cfg = write(tmp_path, GOOD.replace("network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}",
                                       "network: topologies/aries_alphabeta.yaml\ncompute: [ideal, p100]"))
    pts = load_config(cfg).points
    assert {p.network["alpha_s"] for p in pts} == {1.18e-6}
    assert {None if p.compute is None else p.compute["name"] for p in pts} == {None, "p100"}



def test_a_calibrated_profile_with_sizes_past_a_million_loads_as_compute(tmp_path):
    """calibrate writes idle_excess per size up to 3M elements (and older
    profiles wrote them as floats, 3000000.0): a size is a count, not a
    dimensionless factor capped at 1e6, so the profile loads as the
    README says, as ``compute:``."""
    (tmp_path / "prof.yaml").write_text(textwrap.dedent("""
        mem_bandwidth_Bps: 1.0e10
        kernels:
          add_into:
            launch_s: 1.0e-6
            per_elem_s: 1.0e-10
            idle_excess: [[0.001, [[30000.0, 1.0e-5], [3000000.0, 4.0e-6]]], [0.01, [[30000, 2.0e-5], [3145728, 1.0e-5]]]]
        """))
    cfg = write(tmp_path, GOOD + "compute: prof.yaml\n")
    rows = load_config(cfg).points[0].compute["kernels"]["add_into"]["idle_excess"]
    assert rows[0][1][1] == (3000000, 4.0e-6) and rows[1][1][1][0] == 3145728


def test_a_message_lists_six_problems_and_counts_the_rest(tmp_path, capsys):
    """One problem repeated down a profile's table is named six times and counted after that."""
    rows = ", ".join(f"[{1000 * (i + 1)}, 2.0e+6]" for i in range(10))   # ten excesses past any bound
    (tmp_path / "prof.yaml").write_text("mem_bandwidth_Bps: 1.0e10\nkernels: {copy: {launch_s: 1.0e-6, "
                                        f"per_elem_s: 1.0e-10, idle_excess: [[0.001, [{rows}]]]}}}}\n")
    cfg = write(tmp_path, GOOD + "compute: prof.yaml\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("is not allowed") == 6 and "(and 4 more)" in err and "Traceback" not in err, err


BAD = {
    "yaml_syntax": ("P: [2, 4\nworkload: {n: 4}", "not valid YAML at line"),
    "not_a_mapping": ("- 1\n- 2\n", "must be a mapping"),
    "unknown_top_key": (GOOD + "algoritms: [ring]\n", "unknown key(s) 'algoritms'"),
    "missing_P": (GOOD.replace("P: [2, 4]\n", ""), "missing required key 'P'"),
    "P_wrong_type": (GOOD.replace("P: [2, 4]", "P: four"), "P = 'four' is not allowed"),
    "P_zero": (GOOD.replace("P: [2, 4]", "P: [0, 4]"), "P = 0 is not allowed"),
    "P_empty": (GOOD.replace("P: [2, 4]", "P: []"), "P: empty list"),
    "density_too_big": (GOOD.replace("density: 0.1", "density: 1.5"), "workload.density = 1.5 is not allowed"),
    "dtype": (GOOD.replace("density: 0.1", "density: 0.1, dtype: float16"), "workload.dtype = 'float16'"),
    "workload_unknown_key": (GOOD.replace("density: 0.1", "densty: 0.1"), "workload.densty: unknown key"),
    "unknown_algorithm": (GOOD.replace("[ring, topka]", "[ring, topkq]"), "algorithms[1]: unknown algorithm 'topkq'"),
    "bad_param_value": (GOOD.replace("[ring, topka]", "[{name: topka, allgather: tree}]"),
                        "algorithms[0].allgather = 'tree' is not allowed"),
    "unknown_param": (GOOD.replace("[ring, topka]", "[{name: ring, segments: 4}]"), "algorithms[0].segments: unknown key"),
    "network_model": (GOOD.replace("model: alphabeta", "model: torus"), "network.model: 'torus' is not allowed"),
    "negative_alpha": (GOOD.replace("alpha_s: 1.0e-6", "alpha_s: -1"), "network.alpha_s = -1 is not allowed"),
    "network_typo": (GOOD.replace("bandwidth_Bps", "bandwith_Bps"), "network.bandwith_Bps: unknown key"),
    "preset_missing": (GOOD.replace("network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}",
                                    "network: nowhere.yaml"), "preset 'nowhere.yaml' not found"),
    "device_missing": (GOOD + "compute: gtx9000\n", "compute: device profile 'gtx9000' not found"),
    # a key deep in a section is named against its own model's keys; an older profile's renamed key says what to do
    "kernel_typo": (GOOD + "compute: {mem_bandwidth_Bps: 1.0e10, kernels: {copy: {launch_s: 1.0e-6, per_elem_ss: 1}}}\n",
                    "compute.kernels.copy.per_elem_ss: unknown key (did you mean 'per_elem_s'?); allowed keys: launch_s"),
    "old_profile_key": (GOOD + "compute: {mem_bandwidth_Bps: 1.0e10, kernels: {copy: {after_idle: []}}}\n",
                        "compute.kernels.copy.after_idle: unknown key (an older profile's: it became idle_excess"),
    "n_below_P": (GOOD.replace("n: 256", "n: 3"), "workload.n = 3 is smaller than P = 4"),
    "iterations_zero": (GOOD.replace("iterations: 1", "iterations: 0"), "iterations = 0 is not allowed"),
    "bad_name": (GOOD.replace("name: t", "name: ../evil"), "name: '../evil' is not allowed"),
    "machine_too_small": (GOOD.replace("network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}",
                                       "network: {preset: ib_edr_fattree, levels: 2}").replace("P: [2, 4]", "P: [2, 700]")
                          .replace("n: 256", "n: 1000"), "network: 700 hosts need"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_paragraph_exit_2_nothing_written(case, tmp_path, capsys):
    text, expect = BAD[case]
    cfg = write(tmp_path, text)
    out = tmp_path / "results"
    code = main(["run", str(cfg), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert str(cfg) in err and expect in err, err
    assert "Traceback" not in err
    assert err.strip().count("\n") == 0  # one paragraph
    assert not out.exists()


def test_missing_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_cli_process_prints_no_traceback(tmp_path):
    cfg = write(tmp_path, BAD["density_too_big"][0])
    proc = subprocess.run([sys.executable, "-m", "simsparse.cli", "run", str(cfg), "--out", str(tmp_path / "r")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "workload.density" in proc.stderr
