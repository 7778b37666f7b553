"""Network presets and configs: every preset loads, builds and simulates; overrides
and sweeps work; bad input names the key; ``simsparse topo`` summarises and draws."""
import dataclasses
import textwrap

import pytest

from simsparse.cli import main
from simsparse.experiments.config.schema import ConfigError, load_config
from simsparse.experiments.run.runner import simulate_point
from simsparse.network.spec import NETWORK_SPECS

from tests.helpers import REPO

TOPOLOGIES = REPO / "topologies"
PRESETS = sorted(p.stem for p in TOPOLOGIES.glob("*.yaml"))
REQUIRED = {"piz_daint_aries", "ib_fdr_fattree", "ib_edr_fattree", "ib_hdr_fattree", "comet_fdr_4gpu", "ethernet_1g",
            "ethernet_10g", "ethernet_100g_leafspine", "dgx_nvlink"}


def config(tmp_path, network, P="[8]", algorithms="[rabenseifner]"):
    p = tmp_path / "cfg.yaml"
    p.write_text(textwrap.dedent(f"""
        name: net
        network: {network}
        workload: {{n: 4096, density: 0.01}}
        algorithms: {algorithms}
        P: {P}
        iterations: 1
        warmup: 0
        """))
    return p


def test_required_presets_exist():
    """The machines of the papers; tests/network/test_sources.py checks their citations."""
    assert REQUIRED <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_simulates_rabenseifner_correctly(preset, tmp_path):
    (pt,) = load_config(config(tmp_path, preset)).points
    row = simulate_point(dataclasses.replace(pt, evaluation="events")).row
    assert row["correct"] is True and row["time_s"] > 0
    assert row["network"] == NETWORK_SPECS[pt.network["model"]].model_validate(pt.network).label()


def test_overrides_and_sweeps(tmp_path):
    exp = load_config(config(tmp_path, "{preset: ib_fdr_fattree, oversubscription: [1, 4], routing: ecmp}",
                             P="[8, 16]"))
    assert len(exp.points) == 4
    assert {(p.network["oversubscription"], p.P) for p in exp.points} == {(1, 8), (4, 8), (1, 16), (4, 16)}
    assert {p.network["routing"] for p in exp.points} == {"ecmp"}
    row = simulate_point(exp.points[0]).row
    assert row["net_oversubscription"] == 1 and row["net_link_rate"] == "FDR"


def test_a_placement_list_is_not_expanded_into_a_grid(tmp_path):
    (pt,) = load_config(config(tmp_path, "{preset: ethernet_1g, placement: list, endpoints: [3, 2, 1, 0], nodes: 4}",
                               P="[4]")).points
    assert pt.network["endpoints"] == [3, 2, 1, 0]


@pytest.mark.parametrize("network,needle", [
    ("{preset: piz_daint_aries, routing: adaptive}", "network.routing"),
    ("{model: fattree, levels: 4}", "network.levels"),
    ("{model: fattree, oversubscription: 0.5}", "network.oversubscription"),
    ("{model: ethernet, placement: list}", "endpoints"),
    ("{model: fattree, gpus_per_node: 4, intra: nvswitch}", "nvlink_bw_Bps"),
    ("{model: dragonfly, radix: 8}", "unknown key"),
    ("{model: torus}", "allowed: alphabeta, fattree, dragonfly, ethernet"),
])
def test_bad_network_input_names_the_key(tmp_path, network, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(config(tmp_path, network))


def test_topo_prints_a_summary_and_draws(tmp_path, capsys):
    png = tmp_path / "ft.png"
    assert main(["topo", "ib_fdr_fattree", "-P", "64", "--draw", str(png)]) == 0
    out = capsys.readouterr().out
    assert "bisection_GBps: 218.176" in out and "diameter_hops: 4" in out and "switches: 22" in out
    assert png.stat().st_size > 10_000
    png = tmp_path / "df.png"
    assert main(["topo", "piz_daint_aries", "-P", "16", "--set", "groups=4", "--set", "chassis_per_group=1",
                 "--set", "routers_per_chassis=4", "--set", "nodes_per_router=2", "--draw", str(png)]) == 0
    out = capsys.readouterr().out
    assert "routers: 16" in out and "endpoints: 32" in out
    assert png.stat().st_size > 10_000


def test_topo_errors_exit_2(capsys):
    assert main(["topo", "ib_fdr_fattree", "--set", "routing=random"]) == 2
    assert "network.routing" in capsys.readouterr().err
    assert main(["topo", "ib_fdr_fattree", "-P", "20000"]) == 2
    assert "at most 36 pods" in capsys.readouterr().err
    assert main(["topo", "no_such_preset"]) == 2
    assert "available presets" in capsys.readouterr().err
