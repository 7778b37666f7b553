"""`simsparse run`: results table, plot, trace, atomic writes and resume."""
import textwrap

import pandas as pd
import pytest

from simsparse.cli import main
import simsparse.experiments.run.runner as runner

CFG = """
name: e2e
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
workload: {n: 512, density: 0.05, seed: 3}
algorithms: [ring, rabenseifner, topka]
P: [2, 3, 4]
iterations: 2
warmup: 1
"""
REQUIRED = ["algorithm", "P", "n", "density", "backend", "time_s", "bytes_sent_max", "bytes_total", "correct"]


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "e2e.yaml"
    p.write_text(textwrap.dedent(CFG))
    return p


def test_run_writes_table_plot_and_trace(cfg, tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", str(cfg), "--out", str(out), "--trace"]) == 0
    df = pd.read_csv(out / "results.csv")
    assert set(REQUIRED) <= set(df.columns)
    assert len(df) == 9 and df["correct"].all() and (df["backend"] == "sim").all()
    assert (out / "time_vs_P.png").stat().st_size > 1000
    tr = pd.read_csv(out / "trace.csv")
    assert {"rank", "op", "peer", "bytes", "start_s", "end_s"} <= set(tr.columns)
    assert (tr["end_s"] >= tr["start_s"]).all()
    # the bytes in the trace's sends add up to the table's totals
    for pid, g in tr[tr.op == "send"].groupby("point_id"):
        row = df[df.point_id == pid].iloc[0]
        per_iter = g.groupby("iteration")["bytes"].sum()
        assert per_iter.iloc[-1] == row["bytes_total"]
    printed = capsys.readouterr()
    assert "rabenseifner" in printed.out and "wrote" in printed.out
    # each point's own peak memory, where it ran, and the largest said at the end
    assert (df["peak_rss_B"] > 50e6).all()
    assert "the largest peak memory of a point" in printed.err


def test_default_output_folder_is_results_name(cfg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(cfg), "--no-plot"]) == 0
    assert (tmp_path / "results" / "e2e" / "results.csv").exists()


@pytest.mark.slow
def test_interrupted_run_resumes_without_losing_or_duplicating_rows(cfg, tmp_path, monkeypatch):
    out = tmp_path / "res"
    real = runner.simulate_point
    calls = {"n": 0}

    def flaky(point, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(point, **kw)

    monkeypatch.setattr(runner, "simulate_point", flaky)
    assert main(["run", str(cfg), "--out", str(out)]) == 130
    partial = pd.read_csv(out / "results.csv")
    assert len(partial) == 4
    assert not [f for f in out.iterdir() if f.name.startswith(".") and f.name != ".lock"]  # no temporary files left
    monkeypatch.setattr(runner, "simulate_point", real)
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    full = pd.read_csv(out / "results.csv")
    assert len(full) == 9 and full["point_id"].is_unique
    # the rows computed before the interruption were kept, not recomputed
    pd.testing.assert_frame_equal(full.set_index("point_id").loc[partial.point_id, ["time_s", "wall_s"]],
                                  partial.set_index("point_id")[["time_s", "wall_s"]])


def test_edited_config_moves_stale_rows_aside(cfg, tmp_path):
    out = tmp_path / "res"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    cfg.write_text(cfg.read_text().replace("P: [2, 3, 4]", "P: [2, 3]"))
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    assert len(pd.read_csv(out / "results.csv")) == 6
    assert len(pd.read_csv(out / "results.stale.csv")) == 3


def test_quickstart_config_is_valid():
    from simsparse.experiments.config.schema import load_config

    exp = load_config("configs/quickstart.yaml")
    assert exp.name == "quickstart"
    # the full grid: 2 compute models x 6 algorithms x 6 rank counts, each point once
    grid = {(p.algorithm, p.P, (p.compute or {}).get("name", "ideal")) for p in exp.points}
    assert len(exp.points) == len(grid) == 2 * 6 * 6
    assert {a for a, _, _ in grid} == {"ring", "rabenseifner", "topka", "topkdsa", "gtopk", "oktopk"}
    assert {P for _, P, _ in grid} == {2, 4, 8, 16, 32, 64}


@pytest.mark.slow
def test_points_simulated_at_once_give_the_rows_and_trace_of_one_after_another(cfg, tmp_path):
    """``--jobs 2`` (the default on a grid estimated at 10 s or more, one per core): the same rows,
    in the config's order, and the same trace; only the wall time and peak memory differ."""
    rows, traces = [], []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        assert main(["run", str(cfg), "--out", str(out), "--no-plot", "--trace", "--jobs", jobs]) == 0
        rows.append(pd.read_csv(out / "results.csv").drop(columns=["wall_s", "peak_rss_B"]))
        traces.append(pd.read_csv(out / "trace.csv"))
    assert len(rows[0]) == 9
    pd.testing.assert_frame_equal(rows[0], rows[1])
    pd.testing.assert_frame_equal(traces[0], traces[1])


@pytest.mark.slow
def test_a_point_a_worker_stops_says_why():
    """A worker's point past its share of the memory limit ends in the watchdog's own words."""
    from simsparse.experiments.run.execute import PointStopped, simulated
    from simsparse.experiments.run.progress import Progress
    from tests.helpers import make_point

    points = [make_point("oktopk", 64, n=1 << 20, iterations=3) for _ in range(2)]
    with pytest.raises(PointStopped, match="memory reached .* over the limit of"):
        for _ in simulated(points, 2, False, 1.0, None, Progress(points, "test", tty=False)):
            pass


def test_explain_says_why_each_evaluator_and_how_many_points_run_at_once(cfg, tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["run", str(cfg), "--out", str(out), "--explain"]) == 0
    said = capsys.readouterr().out
    assert "point events" in said and "estimate:" in said and not out.exists()
    assert said.rstrip().splitlines()[-1] == "points: one after another in this process (the grid is estimated under 10 s)"
    assert main(["run", str(cfg), "--out", str(out), "--explain", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == "points: 2 at once (one per core, the longest estimated first)"


def _jobs_asked_for_two(_):
    from simsparse.experiments.run import budget
    from simsparse.experiments.run.execute import jobs_for
    from tests.helpers import make_point

    return jobs_for([make_point("ring", 4, n=1024) for _ in range(3)], budget.Budget(), False, 2)[0]


def test_a_daemon_process_runs_its_points_one_after_another():
    """A pool's worker (a daemon) may not start processes: run there takes one point at a time."""
    import multiprocessing

    assert _jobs_asked_for_two(0) == 2
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.map(_jobs_asked_for_two, [0]) == [1]
