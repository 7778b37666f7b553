"""The workload: section: resolution of model/layers/source into n and layers, and clear errors."""
import textwrap

import numpy as np
import pytest

from simsparse.experiments.config.schema import ConfigError, load_config
from simsparse.workload import model_layer_params


def config(tmp_path, workload, P="[4]"):
    p = tmp_path / "cfg.yaml"
    p.write_text(textwrap.dedent(f"""
        network: {{model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}}
        workload: {workload}
        algorithms: [topka]
        P: {P}
        iterations: 1
        warmup: 0
        """))
    return p


def test_model_fills_n_and_layers(tmp_path):
    info = model_layer_params()["resnet20_cifar10"]
    (pt,) = load_config(config(tmp_path, "{model: resnet20_cifar10, density: 0.001}")).points
    assert pt.workload["n"] == info["total"]
    assert pt.workload["layers"] == info["sizes_in_registration_order"]
    assert pt.setup(0).layer_sizes == tuple(info["sizes_in_registration_order"])
    g = pt.workload_obj().grad(0, 0)
    assert len(g) == info["total"]


def test_layers_fill_n_and_lists_expand(tmp_path):
    pts = load_config(config(tmp_path, "{layers: [100, 300], overlap: [0, 0.5, 1], drift: 0.1}")).points
    assert [p.workload["overlap"] for p in pts] == [0, 0.5, 1]
    assert all(p.workload["n"] == 400 and p.setup(0).layers == (100, 300) for p in pts)
    cols = [p.label_columns() for p in pts]  # results rows tell the variants apart
    assert [c["wl_overlap"] for c in cols] == [0, 0.5, 1] and cols[0]["wl_drift"] == 0.1


def test_source_fills_n_and_layers(tmp_path):
    np.savez(tmp_path / "r0_i0.npz", grad=np.arange(30.0), layers=np.array([10, 20]))
    pat = str(tmp_path / "r{rank}_i{iteration}.npz")
    (pt,) = load_config(config(tmp_path, f"{{source: {{path: '{pat}'}}}}")).points
    assert pt.workload["n"] == 30 and pt.workload["layers"] == [10, 20]
    assert pt.workload["source"] == {"path": pat, "key": "grad"}
    np.testing.assert_array_equal(pt.workload_obj().grad(0, 0), np.arange(30.0, dtype=np.float32))


BAD = {
    "n_vs_model": ("{n: 1000, model: resnet20_cifar10}", "workload.n = 1000 is not allowed", "sum to 269722"),
    "unknown_model": ("{model: resnet99}", "workload.model = 'resnet99' is not allowed", "known models: alexnet"),
    "n_vs_layers": ("{n: 31, layers: [10, 20]}", "workload.n = 31 is not allowed", "sum to 30"),
    "bad_layer": ("{layers: [10, 0]}", "workload.layers", "> 0"),
    "no_n": ("{density: 0.1}", "workload.n", "give n, or model, layers or source"),
    "overlap": ("{n: 100, overlap: 1.5}", "workload.overlap = 1.5 is not allowed", "0 disjoint"),
    "skew": ("{n: 100, skew: 1}", "workload.skew = 1 is not allowed", "less than 1"),
    "drift": ("{n: 100, drift: -0.1}", "workload.drift = -0.1 is not allowed", "independent iterations"),
    "distribution": ("{n: 100, distribution: cauchy}", "workload.distribution = 'cauchy'", "'student_t'"),
    "df": ("{n: 100, distribution: student_t, df: 2}", "workload.df = 2 is not allowed", "finite variance"),
    "disjoint_needs_room": ("{n: 1000, density: 0.1, overlap: 0}", "workload with P = 16", "<= n = 1000"),
    "missing_file": ("{source: {path: 'nowhere/r{rank}.npz'}}", "workload.source", "nowhere/r0.npz not found"),
    "source_and_knobs": ("{source: {path: 'SRC'}, overlap: 0.5}", "workload: source replays recorded",
                         "so overlap (settings of synthetic gradients) cannot be given"),
    "source_key": ("{source: {path: 'SRC', key: w}}", "workload.source", "has no array 'w'"),
    "source_typo": ("{source: {pth: x}}", "workload.source.pth", "unknown key"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_workload_names_the_key(case, tmp_path):
    np.savez(tmp_path / "s.npz", grad=np.zeros(40))
    text, where, what = BAD[case]
    with pytest.raises(ConfigError) as e:
        load_config(config(tmp_path, text.replace("SRC", str(tmp_path / "s.npz")), P="[4, 16]"))
    msg = str(e.value)
    assert where in msg and what in msg, msg
    assert "\n" not in msg
