"""What a new user meets in the first hour (issue 13): progress lines, file
modes, stale traces, readable tables, measured rows labelled as this host,
one real run per group of simulator-only settings, `topo` and `list`, and
"did you mean" suggestions."""
import io
import os
import stat
import textwrap

import pandas as pd
import pytest

from simsparse.cli import main
from simsparse.experiments.run import measure as ms
from simsparse.experiments.config.schema import load_config
from simsparse.experiments.run.progress import Progress
from simsparse.experiments.analysis.table import fmt_bytes, fmt_time, results_table

CFG = """
name: first
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
workload: {n: 2048, density: 0.05, seed: 3}
algorithms: [ring, topka]
P: [2, 4]
iterations: 1
warmup: 1
"""


def _cfg(tmp_path, text=CFG, name="first.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_progress_prints_a_line_per_finished_point_with_time_left_when_not_a_terminal(tmp_path, capsys):
    assert main(["run", str(_cfg(tmp_path)), "--out", str(tmp_path / "r"), "--no-plot"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0] for ln in lines] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert all("left" in ln and "simulated in" in ln for ln in lines)
    assert "ring P=2" in lines[0] or "ring P=2" in err


def test_progress_weighs_points_by_their_cost():
    exp = load_config(_write_tmp(CFG))
    buf = io.StringIO()
    prog = Progress(exp.points, "x", stream=buf, tty=False)
    small = min(exp.points, key=lambda p: p.P)
    prog.finished(small, {"time_s": 1e-3, "wall_s": 1.0})
    # after the cheapest point, more than 3 times its time is left (P = 4 points carry twice the data)
    assert (prog.total - prog.done_cost) / prog.done_cost > 3
    assert buf.getvalue().startswith("[1/4]")


def _write_tmp(text):
    import tempfile

    d = tempfile.mkdtemp()
    return _cfg(__import__("pathlib").Path(d), text)


def test_results_files_are_readable_by_others(tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "r"
        assert main(["run", str(_cfg(tmp_path)), "--out", str(out), "--trace"]) == 0
    finally:
        os.umask(old)
    for f in ["results.csv", "time_vs_P.png", "trace.csv", "trace.json"]:
        assert stat.S_IMODE((out / f).stat().st_mode) == 0o644, f


def test_traces_of_points_removed_from_the_config_go_away(tmp_path):
    out = tmp_path / "r"
    cfg = _cfg(tmp_path)
    assert main(["run", str(cfg), "--out", str(out), "--trace", "--no-plot"]) == 0
    assert len(list((out / "trace").glob("*.csv"))) == 4
    assert main(["run", str(_cfg(tmp_path, CFG.replace("[ring, topka]", "[ring]"))), "--out", str(out), "--trace",
                 "--no-plot"]) == 0
    tr = pd.read_csv(out / "trace.csv")
    assert set(tr["point_id"].astype(str)) == set(pd.read_csv(out / "results.csv", dtype={"point_id": str})["point_id"])
    assert len(list((out / "trace").glob("*.csv"))) == 2


def test_table_has_units_and_a_speed_up_against_the_baseline(tmp_path, capsys):
    assert main(["run", str(_cfg(tmp_path)), "--out", str(tmp_path / "r"), "--no-plot"]) == 0
    printed = capsys.readouterr().out
    body = printed.split("speed-up:", 1)[1]  # the table (the header names an unnamed network by its parameters)
    assert "e+" not in body and "e-0" not in body  # no raw e-notation
    assert "speed-up" in printed or "vs ring" in printed
    assert fmt_time(1.5e-3) == "1.50 ms" and fmt_bytes(10367800).endswith("MB")


def test_results_table_names_a_missing_baseline():
    df = pd.DataFrame({"algorithm": ["topka"], "P": [2], "n": [10], "time_s": [1e-3], "bytes_sent_max": [100],
                       "bytes_total": [200]})
    _, notes = results_table(df, "oktopkk")
    assert any("oktopkk" in n for n in notes)


def test_a_training_table_says_what_its_breakdown_columns_hold():
    """A dense allreduce's reductions and copies are not a sparsification: the
    column of the slowest rank's other device work is named for what it holds."""
    df = pd.DataFrame({"schedule": ["whole"], "algorithm": ["rabenseifner"], "P": [4], "n": [10], "time_s": [1.0],
                       "t_forward_s": [0.1], "t_backward_s": [0.2], "t_sparsify_s": [0.5],
                       "t_comm_nonoverlap_s": [0.2], "bytes_sent_max": [100], "bytes_total": [200]})
    table, _ = results_table(df)
    assert "other compute" in table and "sparsify" not in table.replace("t_sparsify_s", "")
    assert "500 ms" in table


def test_measure_runs_once_per_group_of_simulator_only_settings(tmp_path):
    exp = load_config(_cfg(tmp_path, CFG.replace("network:", "compute: [ideal, p100]\ndata_scale: [1, 0.5]\nnetwork:")))
    groups = ms.group_points(exp.points)
    assert len(exp.points) == 16 and len(groups) == 4  # compute x data_scale collapse; algorithm x P remain
    assert all(len(g) == 4 for g in groups.values())


def test_measured_rows_are_labelled_as_this_host():
    exp = load_config(_write_tmp(CFG))
    p = exp.points[0]
    row = {"point_id": "x", "network": "aries-alphabeta", "net_alpha_s": 1e-6, "data_scale": 1.0, "time_s": 1.0}
    out = ms.relabel(row, [p])
    assert out["network"].startswith("host:") and "net_alpha_s" not in out and "data_scale" not in out


def test_measure_refuses_more_ranks_than_cores_without_oversubscribe(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mpi4py")
    monkeypatch.setattr(ms, "cores", lambda: 1)
    monkeypatch.setattr(ms, "check_prerequisites", lambda: "mpiexec")
    assert main(["measure", str(_cfg(tmp_path)), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "--oversubscribe" in err and "Traceback" not in err
    assert not (tmp_path / "m" / "results.csv").exists()


@pytest.mark.parametrize("P", ["0", "-3", "two"])
def test_topo_rejects_impossible_rank_counts(P, capsys):
    with pytest.raises(SystemExit) as e:
        main(["topo", "piz_daint_aries", "-P", P])
    assert e.value.code == 2
    assert "rank" in capsys.readouterr().err


@pytest.mark.slow
def test_topo_says_where_the_ranks_sit_and_draws_a_dragonfly(tmp_path, capsys):
    png = tmp_path / "d.png"
    assert main(["topo", "piz_daint_aries", "-P", "16", "--draw", str(png)]) == 0
    out = capsys.readouterr().out
    assert "endpoints" in out and "ranks" in out.lower()
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("word,expect", [("oktopkk", "oktopk"), ("piz_daint", "piz_daint_aries")])
def test_list_suggests_the_closest_name(word, expect, capsys):
    assert main(["list", word]) == 2
    assert f"did you mean '{expect}'" in capsys.readouterr().err


def test_config_typos_get_suggestions(tmp_path, capsys):
    bad = CFG.replace("[ring, topka]", "[ring, {name: oktopk, rotaton: true}]")
    assert main(["run", str(_cfg(tmp_path, bad)), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "rotation" in err and "Traceback" not in err


def test_list_shows_parameters_and_details(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "params:" in out and "rotation=" in out
    assert main(["list", "oktopk"]) == 0
    assert "rotation" in capsys.readouterr().out


def test_unknown_compute_profile_error_lists_ideal(tmp_path, capsys):
    assert main(["run", str(_cfg(tmp_path, CFG + "compute: p1000\n")), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "ideal" in err and "p100" in err


def test_yaml_syntax_error_points_at_the_unclosed_bracket(tmp_path, capsys):
    text = "name: y\nalgorithms: [ring, topka\nP: [2, 4]\nnetwork: aries_alphabeta\nworkload: {n: 10}\n"
    assert main(["run", str(_cfg(tmp_path, text)), "--out", str(tmp_path / "r")]) == 2
    assert "line 2" in capsys.readouterr().err


def test_rows_carry_a_compute_and_communication_breakdown(tmp_path):
    out = tmp_path / "r"
    assert main(["run", str(_cfg(tmp_path, CFG + "compute: p100\n")), "--out", str(out), "--no-plot"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert (df["t_compute_s"] > 0).all() and (df["t_comm_s"] > 0).all()
    assert (df["t_compute_s"] + df["t_comm_s"] <= df["time_max_s"] * (1 + 1e-9)).all()
