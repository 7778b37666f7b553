"""Three bad inputs end in the one-paragraph error (exit status 2), quickly:
a YAML alias bomb, a profile path that names a file which is not a profile,
and ``workload.n`` at the top of its range whose results would not fit."""
from __future__ import annotations


import pytest

from simsparse.compute.devices import ProfileError, load_profile
from simsparse.experiments.config.errors import ConfigError
from simsparse.experiments.config.point import Point
from simsparse.experiments.config.schema import load_config
from simsparse.experiments.run import budget
from simsparse.files import MAX_YAML_NODES, YamlTooLarge, yaml_load

from tests.helpers import cli_run, write_config

NET = "{model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}"
# nine levels of nine aliases: 9**9 (387 million) strings once expanded
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


_run, _cfg = cli_run, write_config


# -- YAML alias expansion --------------------------------------------------------------------

def test_alias_bomb_config_is_refused_quickly(tmp_path, capsys):
    cfg = _cfg(tmp_path, BOMB + f"network: {NET}\nworkload: {{n: 64}}\nalgorithms: [ring]\nP: 2\n")
    code, err, took = _run(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"], capsys)
    assert code == 2
    assert f"{cfg}:" in err and "aliases expand to more than" in err and "Traceback" not in err
    assert err.count("\n") == 1   # one paragraph
    assert took < 5
    assert not (tmp_path / "o").exists()


def test_alias_bomb_as_a_network_preset_is_refused(tmp_path):
    (tmp_path / "bomb_net.yaml").write_text(BOMB)
    cfg = _cfg(tmp_path, "network: bomb_net.yaml\nworkload: {n: 64}\nalgorithms: [ring]\nP: 2\n")
    with pytest.raises(ConfigError, match="bomb_net.yaml: its aliases expand"):
        load_config(cfg)


def test_alias_bomb_as_a_device_profile_is_refused(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    with pytest.raises(ProfileError, match="bomb.yaml: not a device profile"):
        load_profile(str(tmp_path / "bomb.yaml"))


def test_alias_cap_counts_every_use_but_lets_ordinary_aliases_through():
    assert yaml_load("base: &b {alpha_s: 1.0e-6}\nnet: {<<: *b, bandwidth_Bps: 1.0e+9}\n")["net"] == {
        "alpha_s": 1e-6, "bandwidth_Bps": 1e9}
    wide = "a: &a [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a"] * (MAX_YAML_NODES // 1000 + 1)) + "]\n"
    with pytest.raises(YamlTooLarge):
        yaml_load(wide)


# -- a profile path that is not a profile -------------------------------------------------------

@pytest.mark.parametrize("content, what", [("- 1\n- 2\n", "list"), ("just a sentence\n", "str"),
                                           ("P,time_s\n2,0.1\n", "str"), ("\x00\x01\xff", "codec")])
def test_compute_file_that_is_not_a_profile(tmp_path, capsys, content, what):
    prof = tmp_path / "prof.yaml"
    prof.write_bytes(content.encode("latin-1"))
    cfg = _cfg(tmp_path, f"network: {NET}\ncompute: prof.yaml\nworkload: {{n: 64}}\nalgorithms: [ring]\nP: 2\n")
    code, err, took = _run(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"], capsys)
    assert code == 2, err
    assert f"{cfg}: compute: " in err and "prof.yaml: " in err and "not a device profile" in err and what in err and "allowed: a YAML mapping of device keys" in err
    assert "Traceback" not in err and took < 5


def test_machine_profile_whose_compute_is_not_a_mapping(tmp_path):
    prof = tmp_path / "machine.yaml"
    prof.write_text("kind: machine\ncompute: [1, 2]\nnetwork: {model: alphabeta}\n")
    cfg = _cfg(tmp_path, f"network: {NET}\ncompute: machine.yaml\nworkload: {{n: 64}}\nalgorithms: [ring]\nP: 2\n")
    with pytest.raises(ConfigError, match="'compute' section is not a mapping"):
        load_config(cfg)


@pytest.mark.parametrize("content", ["- model: alphabeta\n", "42\n", "P,time_s\n2,0.1\n"])
def test_network_file_that_is_not_a_preset(tmp_path, capsys, content):
    (tmp_path / "net.yaml").write_text(content)
    cfg = _cfg(tmp_path, "network: net.yaml\nworkload: {n: 64}\nalgorithms: [ring]\nP: 2\n")
    code, err, took = _run(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"], capsys)
    assert code == 2 and "net.yaml: expected a mapping of keys" in err and "Traceback" not in err and took < 5


# -- the largest n: the budget counts what the algorithms' results hold ---------------------------

TOP_N = 2**31 - 1


def test_largest_n_sampled_is_refused_up_front(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SIMSPARSE_BUDGET", "memory_gb=16")
    cfg = _cfg(tmp_path, f"""
        network: {NET}
        workload: {{n: {TOP_N}, density: 0.01}}
        algorithms: [dsar_split_allgather]
        evaluation: sampled
        P: 4
        data_scale: 0.5
        iterations: 1
        warmup: 0
    """)
    code, err, took = _run(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"], capsys)
    assert code == 2, err
    assert "of memory, over the limit of 16 GB" in err and "'workload.n' = 2,147,483,647" in err
    assert "Traceback" not in err
    assert took < 5
    assert not (tmp_path / "o" / "results.csv").exists()


def _sampled(algorithm: str, P: int, n: int = TOP_N) -> Point:
    return Point(algorithm=algorithm, P=P, params={}, network={"model": "alphabeta"}, compute=None,
                 workload={"n": n, "density": 0.001, "dtype": "float32", "seed": 0}, iterations=1, warmup=0,
                 check=False, evaluation="sampled")


@pytest.mark.parametrize("algorithm", ["topka", "gaussiank", "oktopk", "topkdsa"])
def test_a_dense_sum_on_a_sampled_gradient_counts_n_elements(algorithm):
    # measured (tracemalloc, n = 2M..16M, P = 4..32): one dense float32 sum of n elements per point
    assert budget.memory_B(_sampled(algorithm, 2)) > 4 * TOP_N
    assert budget.memory_B(_sampled(algorithm, 2)) > 4 * budget.memory_B(_sampled("gtopk", 2))


def test_union_and_per_rank_results_grow_with_P():
    ssar = [budget.memory_B(_sampled("ssar_recursive_double", P)) for P in (4, 32)]
    assert ssar[1] / ssar[0] > 8 * 1.5     # P entries per rank's union, on P ranks
    assert budget.memory_B(_sampled("dsar_split_allgather", 8)) > 8 * 4 * TOP_N   # a dense sum on every rank
