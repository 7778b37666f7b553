"""Load-time bounds: values the simulator cannot honour are refused with one
paragraph naming the file, the key path, the value and what is allowed."""
import textwrap

import pytest

from simsparse.cli import main

BASE = """
name: lim
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
workload: {n: 256, density: 0.1}
algorithms: [ring]
P: [2, 4]
iterations: 1
warmup: 0
"""


@pytest.mark.parametrize("old, new, says", [
    ("alpha_s: 1.0e-6", "alpha_s: .inf", "network.alpha_s = inf is not allowed: must be a finite number"),
    ("alpha_s: 1.0e-6", "alpha_s: 1.0e+308", "network.alpha_s = 1e+308 is not allowed: out of range: seconds"),
    ("alpha_s: 1.0e-6", "alpha_s: .nan", "network.alpha_s = nan is not allowed: must be a finite number"),
    ("bandwidth_Bps: 1.0e9", "bandwidth_Bps: 1.0e-300", "network.bandwidth_Bps = 1e-300 is not allowed"),
    ("bandwidth_Bps: 1.0e9", "bandwidth_Bps: 'inf'", "network.bandwidth_Bps = inf is not allowed"),
    ("density: 0.1", "density: .nan", "workload.density = nan is not allowed"),
    ("density: 0.1", "density: 0.1, seed: 100000000000000000000", "workload.seed = 100000000000000000000"),
    ("network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}", "network: {model: dragonfly, groups: 1000000}",
     "would have 384,000,000 endpoints (driven by 'groups' = 1000000"),
    ("name: lim", "name: '..'", "name: '..' is not allowed"),
    ("name: lim", "name: ../../elsewhere", "is not allowed"),
    ("workload: {n: 256, density: 0.1}", "workload: -1", "workload = -1 is not allowed: expected a mapping"),
    ("network: {model: alphabeta,", "network: {model: [alphabeta, fattree],", "network.model: ['alphabeta', "),
    ("P: [2, 4]", "P: [2, 4]\ncheck: " + "[" * 3000 + "]" * 3000, "nested too deeply"),
    ("algorithms: [ring]", "algorithms: [ring]\nbogus{x}: 1", "unknown key(s) 'bogus{x}'"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, capsys, monkeypatch, old, new, says):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "lim.yaml"
    text = textwrap.dedent(BASE)
    assert old in text
    cfg.write_text(text.replace(old, new, 1))
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert says in err and str(cfg) in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lim.yaml"]  # nothing written


def test_a_huge_grid_is_refused_before_it_is_expanded(tmp_path, capsys):
    cfg = tmp_path / "grid.yaml"
    vals = list(range(1, 1001))
    cfg.write_text(textwrap.dedent(BASE).replace("alpha_s: 1.0e-6", f"alpha_s: {[v * 1e-6 for v in vals]}")
                   .replace("bandwidth_Bps: 1.0e9", f"bandwidth_Bps: {[v * 1e6 for v in vals]}"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "grid of 1,000,000 variants" in err and "network.alpha_s: 1000 values" in err


def test_device_files_are_not_read(tmp_path, capsys):
    assert main(["run", "/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_topo_refuses_a_machine_too_large_to_build(capsys):
    assert main(["topo", "ethernet_1g", "-P", str(1 << 20)]) == 2
    assert "1,048,576 endpoints" in capsys.readouterr().err
    assert main(["topo", "aries_alphabeta"]) == 2
    assert "contention-free" in capsys.readouterr().err
