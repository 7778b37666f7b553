"""`simsparse compare`: the join, relative errors, per-phase times, mismatches, outputs."""
import os
import shutil
import stat
import textwrap

import numpy as np
import pandas as pd
import pytest

from simsparse.cli import main
from simsparse.experiments.analysis.compare import fmt_time, read_csv
from simsparse.experiments.analysis.phases import phase_times
from simsparse.experiments.analysis.kernels import call_stats, kernel_report, kernel_summary

# (algorithm, P, predicted s, measured s): errors +10%, -20%, +50%, -5%
POINTS = [("ring", 2, 1.1e-3, 1.0e-3), ("ring", 4, 1.6e-3, 2.0e-3), ("topka", 2, 4.5e-5, 3.0e-5),
          ("topka", 4, 9.5e-2, 1.0e-1)]
ERRS = [0.1, -0.2, 0.5, -0.05]


@pytest.fixture(autouse=True)
def usual_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _results(side: str, times) -> pd.DataFrame:
    rows = []
    for i, ((alg, P, *_), t) in enumerate(zip(POINTS, times)):
        rows.append({"point_id": f"{side}{i:015d}" if side == "s" else f"{i:016d}",  # all-digit ids: read as text
                     "backend": "sim" if side == "s" else "mpi", "schedule": "", "model": "", "batch_size": "",
                     "algorithm": alg, "params": "", "P": P, "n": 4096, "density": 0.05, "k": 205, "dtype": "float32",
                     "seed": 3, "network": "alphabeta(a=1e-06s)" if side == "s" else "alphabeta(x)",
                     "compute": "p100" if side == "s" else "cpu:cpu", "iterations": 3 if side == "s" else 5,
                     "warmup": 1, "time_s": t, "data_scale": 1.0 if side == "s" else "", "wl_drift": 1.0,
                     **({"net_alpha_s": 1e-6} if side == "s" else {})})
    return pd.DataFrame(rows)


def _trace(results: pd.DataFrame, scale: float) -> pd.DataFrame:
    """Per point: a warm-up iteration with huge times (ignored) and three
    measured ones, the third (3x longer) of a kind that fills half the period."""
    rows = []
    for pid in results["point_id"]:
        for it, f, w in ((0, 100.0, 0.0), (1, 1.0, 0.25), (2, 1.0, 0.25), (3, 3.0, 0.5)):
            recs = [(0, "main", "split_reduce", "send", 1, 0.0, 2.0), (0, "main", "split_reduce", "recv", 1, 1.0, 3.0),
                    (1, "main", "split_reduce", "send", 0, 0.0, 1.0),
                    (0, "main", "split_reduce/allgather", "send", 1, 3.5, 4.0),
                    (1, "comm/b0", "select", "compute:topk", -1, 10.0, 12.0)]
            for rank, lane, phase, op, peer, s, e in recs:
                rows.append({"point_id": pid, "iteration": it, "rank": rank, "lane": lane, "phase": phase, "op": op,
                             "peer": peer, "bytes": 8 if peer >= 0 else 0, "start_s": s * f * scale * 1e-6,
                             "end_s": e * f * scale * 1e-6, "weight": w})
    return pd.DataFrame(rows)


@pytest.fixture
def folders(tmp_path):
    pred, meas = tmp_path / "pred", tmp_path / "meas"
    for d, side, times, scale in ((pred, "s", [p[2] for p in POINTS], 1.0), (meas, "m", [p[3] for p in POINTS], 2.0)):
        d.mkdir()
        r = _results(side, times)
        r.to_csv(d / "results.csv", index=False)
        _trace(r, scale).to_csv(d / "trace.csv", index=False)
    return pred, meas


def test_phase_time_is_max_over_ranks_of_the_union_mean_over_a_period():
    r = _results("s", [1.0] * 4).head(1)
    got = phase_times(_trace(r, 1.0), {r.point_id[0]: 1}).set_index("phase")["time_s"]
    # rank 0: [0,2] u [1,3] = 3 us (rank 1: 1 us); with the child [3.5, 4]: 3.5 us; iterations 1x, 1x, 3x
    # weighed 1/4, 1/4, 1/2 -> 2x
    assert got["split_reduce"] == pytest.approx(7e-6)
    assert got["split_reduce/allgather"] == pytest.approx(1e-6)
    assert got["select"] == pytest.approx(4e-6)
    # a phase absent from an iteration counts 0 there
    tr = _trace(r, 1.0)
    tr = tr[~((tr.phase == "select") & (tr.iteration == 2))]
    assert phase_times(tr, {r.point_id[0]: 1}).set_index("phase").loc["select", "time_s"] == pytest.approx(3.5e-6)
    tr = tr[~((tr.phase == "select") & (tr.iteration == 3))]
    assert phase_times(tr, {r.point_id[0]: 1}).set_index("phase").loc["select", "time_s"] == pytest.approx(0.5e-6)
    # a trace written before the weight column: the measured iterations count equally (5/3 x)
    old = phase_times(_trace(r, 1.0).drop(columns="weight"), {r.point_id[0]: 1}).set_index("phase")["time_s"]
    assert old["split_reduce"] == pytest.approx(3.5e-6 * 5 / 3)


def test_a_bucket_task_whose_lane_sends_is_a_communication_phase():
    """A schedule's bucket runs on its lane: the ``task`` record has phase
    ``comm/b0``, its messages the collective's own phases, on that lane."""
    from simsparse.experiments.analysis.phases import message_phases

    rec = dict(point_id="p", iteration=0, rank=0, peer=-1, bytes=0, start_s=0.0, end_s=1.0)
    tr = pd.DataFrame([{**rec, "lane": "comm/b0", "phase": "comm/b0", "op": "task"},
                       {**rec, "lane": "comm/b0", "phase": "reduce_scatter", "op": "send", "peer": 1},
                       {**rec, "lane": "comm/b1", "phase": "comm/b1", "op": "task"},
                       {**rec, "lane": "comm/b1", "phase": "select", "op": "compute:topk"},
                       {**rec, "lane": "main", "phase": "pack", "op": "compute:concat"}])
    assert message_phases(tr) == {("p", "reduce_scatter"), ("p", "comm"), ("p", "comm/b0")}


def test_kernel_calls_are_compared_per_point_mean_over_a_period(folders):
    r = _results("s", [1.0] * 4).head(1)
    st = call_stats(_trace(r, 1.0), {r.point_id[0]: 1}).set_index("op").loc["compute:topk"]
    # the calls of iterations 1, 2, 3 take 2, 2, 6 us, weighed 1/4, 1/4, 1/2; the warm-up's 200 us is left out
    assert (st["calls"], st["median_s"], st["mean_s"]) == (3, pytest.approx(2e-6), pytest.approx(4e-6))
    pred, meas = folders
    assert main(["compare", str(pred), str(meas), "--no-plot"]) == 0
    k = read_csv(meas / "compare_pred" / "kernels.csv")
    assert len(k) == 4 and set(k["op"]) == {"compute:topk"} and np.allclose(k["ratio"], 2.0)
    assert (k["meas_calls"] == 3).all() and np.allclose(k["meas_mean_s"], 8e-6)
    summary, total = kernel_summary(k, shown_from_s=0.0)
    assert summary[["points", "ratio median", "min", "max"]].values.tolist() == [[4, 2.0, 2.0, 2.0]]
    assert total == pytest.approx(2.0)
    assert kernel_report(k, fmt_time) == []   # calls of microseconds: below the printed summary's floor
    long = k.assign(pred_mean_s=k["pred_mean_s"] * 1e3, meas_mean_s=k["meas_mean_s"] * 1e3 * [1, 1, 3, 3],
                    meas_median_s=k["meas_median_s"] * 1e3)
    long["ratio"] = long["meas_mean_s"] / long["pred_mean_s"]
    lines = "\n".join(kernel_report(long, fmt_time))
    assert "topk" in lines and "4.00" in lines and "those calls took 4.00x their predicted time in all" in lines


@pytest.mark.slow
def test_compare_gives_known_errors_and_writes_outputs(folders, tmp_path, capsys):
    pred, meas = folders
    assert main(["compare", str(pred), str(meas)]) == 0
    out = meas / "compare_pred"
    df = read_csv(out / "compare.csv")
    pts = df[df.level == "point"].set_index(["algorithm", "P"])
    for (alg, P, *_), e in zip(POINTS, ERRS):
        assert pts.loc[(alg, P), "rel_err"] == pytest.approx(e)
    assert set(pts["meas_point_id"]) == {f"{i:016d}" for i in range(4)}
    # per phase: the measured trace is the predicted one at twice the time
    ph = df[df.level == "phase"]
    assert set(ph.phase) == {"split_reduce", "split_reduce/allgather", "select"}
    assert len(ph) == 4 * 3 and np.allclose(ph.rel_err, -0.5)
    # a phase with a message in or below it is a communication phase; one of kernels only, a compute phase
    assert dict(zip(ph.phase, ph.kind)) == {"split_reduce": "communication", "split_reduce/allgather": "communication",
                                            "select": "compute"}
    printed = capsys.readouterr().out
    a = np.abs(ERRS)
    assert f"median {100 * np.median(a):.1f}%, p90 {100 * np.percentile(a, 90):.1f}%" in printed
    assert "median 15.0%, p90 41.0%" in printed
    assert "signed error: median +2.5%; 2 of 4 points predicted low, 2 high" in printed
    assert "1.1 ms" in printed and "45 us" in printed and "+50.0%" in printed and "-20.0%" in printed
    assert "split_reduce/allgather" in printed and "wrote" in printed
    assert "|error| over 8 (point, phase) pairs of communication phases: median 50.0%, p90 50.0%" in printed
    assert "|error| over 4 (point, phase) pairs of compute phases: median 50.0%" in printed
    assert (out / "compare.png").stat().st_size > 5000
    for f in ("compare.csv", "compare.png"):
        assert stat.S_IMODE((out / f).stat().st_mode) == 0o644
    assert not [f for f in out.iterdir() if f.name.startswith(".")]


def test_results_csv_paths_out_and_no_plot(folders, tmp_path):
    pred, meas = folders
    out = tmp_path / "cmp"
    assert main(["compare", str(pred / "results.csv"), str(meas / "results.csv"), "--out", str(out), "--no-plot"]) == 0
    assert (out / "compare.csv").exists() and not (out / "compare.png").exists()


def test_without_traces_only_points_are_compared(folders, capsys):
    pred, meas = folders
    (meas / "trace.csv").unlink()
    assert main(["compare", str(pred), str(meas), "--no-plot"]) == 0
    assert "no per-phase comparison" in capsys.readouterr().err
    df = read_csv(meas / "compare_pred" / "compare.csv")
    assert set(df.level) == {"point"}


def test_a_point_missing_from_meas_exits_2_naming_it(folders, capsys):
    pred, meas = folders
    r = read_csv(meas / "results.csv")
    r[r.P != 4].to_csv(meas / "results.csv", index=False)
    assert main(["compare", str(pred), str(meas), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simsparse: error: 2 point(s) of PRED") and str(pred / "results.csv") in err
    assert "algorithm=ring P=4" in err and "algorithm=topka P=4" in err and "--allow-partial" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["compare", str(pred), str(meas), "--no-plot", "--allow-partial"]) == 0
    df = read_csv(meas / "compare_pred" / "compare.csv")
    assert sorted(df[df.level == "point"].P) == [2, 2]


def test_a_point_only_in_meas_is_an_error_too(folders, capsys):
    pred, meas = folders
    r = read_csv(pred / "results.csv")
    r[r.algorithm != "topka"].to_csv(pred / "results.csv", index=False)
    assert main(["compare", str(pred), str(meas), "--no-plot"]) == 2
    assert "2 point(s) of MEAS" in capsys.readouterr().err


@pytest.mark.parametrize("case, needle", [
    ("no_results", "no results file"),
    ("no_common", "no point of PRED"),
    ("zero_time", "not a positive number"),
    ("duplicate", "appear more than once"),
])
def test_bad_inputs_exit_2(folders, capsys, case, needle):
    pred, meas = folders
    if case == "no_results":
        (meas / "results.csv").unlink()
    elif case == "no_common":
        r = read_csv(meas / "results.csv")
        r.assign(n=8192).to_csv(meas / "results.csv", index=False)
    elif case == "zero_time":
        r = read_csv(meas / "results.csv")
        r.loc[1, "time_s"] = 0.0
        r.to_csv(meas / "results.csv", index=False)
    else:  # the same point predicted on two devices
        r = read_csv(pred / "results.csv")
        pd.concat([r, r.assign(compute="v100", point_id="x")]).to_csv(pred / "results.csv", index=False)
    assert main(["compare", str(pred), str(meas), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert needle in err
    if case == "no_common":
        assert "column(s) n" in err
    if case == "duplicate":
        assert "compute" in err
        assert main(["compare", str(pred), str(meas), "--no-plot", "--pred-where", "compute=p100"]) == 0


def test_fmt_time_units():
    assert [fmt_time(x) for x in (2.5, 3.35e-3, 4.5e-5, 2e-9)] == ["2.5 s", "3.35 ms", "45 us", "2 ns"]


CFG = """
name: tiny
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
compute: p100
workload: {n: 1024, density: 0.05, seed: 1}
algorithms: [ring, topka, oktopk]
P: [2, 4]
iterations: 2
warmup: 1
"""


@pytest.mark.slow
def test_end_to_end_measurement_25_percent_slower_gives_minus_20(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(textwrap.dedent(CFG))
    pred, meas = tmp_path / "pred", tmp_path / "meas"
    assert main(["run", str(cfg), "--out", str(pred), "--trace", "--no-plot"]) == 0
    shutil.copytree(pred, meas)
    r, tr = read_csv(meas / "results.csv"), read_csv(meas / "trace.csv")
    ids = {p: p[::-1] for p in r.point_id}  # a measurement's ids differ
    r = r.assign(backend="mpi", compute="cpu:cpu", network="measured", point_id=r.point_id.map(ids))
    for c in ("time_s", "time_min_s", "time_max_s"):
        r[c] *= 1.25
    r.to_csv(meas / "results.csv", index=False)
    tr = tr.assign(point_id=tr.point_id.map(ids), start_s=tr.start_s * 1.25, end_s=tr.end_s * 1.25)
    tr.to_csv(meas / "trace.csv", index=False)
    capsys.readouterr()
    assert main(["compare", str(pred), str(meas), "--out", str(tmp_path / "cmp")]) == 0
    assert "-20.0%" in capsys.readouterr().out
    df = read_csv(tmp_path / "cmp" / "compare.csv")
    pts = df[df.level == "point"]
    assert len(pts) == 6 and np.allclose(pts.rel_err, -0.2) and np.allclose(pts.pred_s / pts.meas_s, 0.8)
    ph = df[df.level == "phase"].dropna(subset=["rel_err"])
    assert len(ph) >= 6 * 3 and np.allclose(ph.rel_err, -0.2)
    assert {"reduce_scatter", "allgather", "split_reduce"} <= set(ph.phase)


def test_the_error_grid_shows_the_median_per_P_and_n():
    """Where P and n both vary, the median |error| of each (P, n): where a sweep's error sits."""
    from simsparse.experiments.analysis.compare import error_grid

    pts = pd.DataFrame({"P": [4, 4, 4, 8, 8, 8], "n": [10, 10, 100, 10, 100, 100],
                        "rel_err": [-0.1, 0.3, 0.05, -0.4, 0.2, -0.1]})
    g = error_grid(pts)
    assert g.loc[4, 10] == pytest.approx(0.2) and g.loc[4, 100] == pytest.approx(0.05)
    assert g.loc[8, 10] == pytest.approx(0.4) and g.loc[8, 100] == pytest.approx(0.15)
    assert error_grid(pts.assign(n=10)) is None and error_grid(pts.drop(columns="n")) is None
