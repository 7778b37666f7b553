"""simsparse validate's own logic: the rank counts read before calibrating, and the
median of repeated measurements (experiments/analysis/validate.py)."""
import pytest

from simsparse.experiments.analysis.repeats import error_on, median_phases, median_repeat, to_repeat
from simsparse.experiments.analysis.validate import _rank_counts
from simsparse.experiments.config.schema import ConfigError
from simsparse.experiments.results.store import ResultsStore, read_csv


def _store(path, times):
    st = ResultsStore(path)
    for pid, t in times.items():
        st.save_trace(pid, [{"point_id": pid, "iteration": 0, "rank": 0, "lane": "main", "phase": "main",
                             "op": "send", "peer": 1, "bytes": 8, "start_s": 0.0, "end_s": t, "weight": 0.0}])
        st.add({"point_id": pid, "algorithm": "ring", "P": 2, "n": 10, "time_s": t, "time_median_s": t})
    return st


def test_each_point_takes_the_repeat_of_median_time_with_that_repeats_trace(tmp_path):
    runs = [_store(tmp_path / f"r{i}", t) for i, t in
            enumerate([{"a": 1.0, "b": 2.0}, {"a": 5.0, "b": 2.2}, {"a": 1.2, "b": 9.0}], 1)]
    out = ResultsStore(tmp_path / "meas", fresh=True)
    spread = median_repeat(runs, ["a", "b"], out)
    rows = read_csv(tmp_path / "meas" / "results.csv").set_index("point_id")
    assert rows.loc["a", "time_s"] == 1.2 and rows.loc["b", "time_s"] == 2.2     # not the means 2.4 and 4.4
    assert rows.loc["a", "repeats"] == 3 and rows.loc["a", "time_repeat_min_s"] == 1.0
    assert rows.loc["b", "time_repeat_max_s"] == 9.0
    assert read_csv(out.trace_file("a"))["end_s"].tolist() == [1.2]              # the same run's phases
    assert len(read_csv(tmp_path / "meas" / "trace.csv")) == 2
    assert spread["points"] == 2
    assert spread["median"] == pytest.approx(((4.0 / 1.2) + (7.0 / 2.2)) / 2)
    # each repeat against the median of the other two: a 1.0 vs 3.1, 1.2 vs 3.0, 5.0 vs 1.1; b 2.0 vs 5.6, ...
    loo = sorted([1 - 1.0 / 3.1, 1 - 1.2 / 3.0, 5.0 / 1.1 - 1, 1 - 2.0 / 5.6, 1 - 2.2 / 5.5, 9.0 / 2.1 - 1])
    assert spread["one_vs_rest_median"] == pytest.approx((loo[2] + loo[3]) / 2)
    assert spread["repeated"] == ["a", "b"]


def test_two_repeats_take_the_faster_and_a_point_missing_from_a_repeat_uses_the_others(tmp_path):
    runs = [_store(tmp_path / "r1", {"a": 3.0, "b": 1.0}), _store(tmp_path / "r2", {"a": 2.0})]
    out = ResultsStore(tmp_path / "meas", fresh=True)
    median_repeat(runs, ["a", "b"], out)
    assert out.rows["a"]["time_s"] == 2.0 and out.rows["b"]["time_s"] == 1.0 and out.rows["b"]["repeats"] == 1


def test_the_prediction_is_scored_on_the_repeated_points_alone():
    import pandas as pd

    points = pd.DataFrame({"meas_point_id": ["a", "b", "c"], "rel_err": [-0.1, 0.3, 5.0]})
    got = error_on(points, ["a", "b"])                        # c was measured once
    assert got["points"] == 2 and got["median"] == pytest.approx(0.2)
    assert error_on(points, [])["points"] == 0


def test_rank_counts_are_read_before_the_profiles_they_name_exist(tmp_path):
    cfg = tmp_path / "v.yaml"
    cfg.write_text("name: v\nnetwork: results/calibration/none-{P}r.yaml\nalgorithms: [ring]\nP: [4, 2, 4]\n")
    assert _rank_counts(str(cfg)) == [2, 4]
    cfg.write_text("name: v\nalgorithms: [ring]\nP: 3\n")
    assert _rank_counts(str(cfg)) == [3]
    cfg.write_text("name: v\nworkload: {n: 10}\nalgorithms: [ring]\nP: [2, two]\n")
    with pytest.raises(ConfigError, match=r"v\.yaml.*P"):
        _rank_counts(str(cfg))


def test_ranks_replace_the_configs_rank_counts_and_name_the_run(tmp_path):
    """``validate --ranks 2`` runs a stored suite at P = 2 from the packaged config (the stored
    ``validate_testbed_p2`` is ``configs/validate_testbed.yaml --ranks 2``)."""
    from simsparse.experiments.analysis.validate import _ranks_override
    from simsparse.experiments.config.schema import load_config

    cfg = tmp_path / "v.yaml"
    cfg.write_text("name: v\nworkload: {n: 10}\nalgorithms: [ring]\nP: [4, 8]\n")
    assert _ranks_override(str(cfg), None) is None
    over = _ranks_override(str(cfg), [2, 2])
    assert over == {"P": [2], "name": "v_p2"}
    assert _rank_counts(str(cfg), over) == [2]
    exp = load_config(cfg, over)
    assert exp.name == "v_p2" and {p.P for p in exp.points} == {2}
    assert _ranks_override(str(cfg), [8, 4])["name"] == "v_p4_p8"


def test_a_config_error_is_raised_before_the_calibration_unless_it_names_the_profiles_made(tmp_path, monkeypatch):
    """A config whose network preset does not exist failed after 23 minutes of calibration
    (tree3, twenty-third session); now before it. A config that names the profile validate is
    about to write still waits for it."""
    from simsparse.experiments.analysis import validate as v

    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "v.yaml"
    cfg.write_text("name: v\nnetwork: topologies/none.yaml\nworkload: {n: 10}\nalgorithms: [ring]\nP: [2]\n")
    with pytest.raises(ConfigError, match=r"v\.yaml.*network.*none\.yaml"):
        v._check_before_calibrating(str(cfg), None, [2])
    cfg.write_text("name: v\nnetwork: results/calibration/local-{P}r.yaml\nworkload: {n: 10}\nalgorithms: [ring]\n"
                   "P: [2]\n")
    v._check_before_calibrating(str(cfg), None, [2])   # the profile validate writes: checked after it


def test_later_repeats_take_only_the_points_the_first_timed_below_the_limit(tmp_path):
    first = _store(tmp_path / "r1", {"a": 0.05, "b": 1.5, "c": 0.19})
    groups = {"a": [None], "b": [None], "c": [None], "d": [None]}     # d: not measured in the first repeat
    assert to_repeat(first, groups, 0.2) == ["a", "c"]
    assert to_repeat(first, groups, float("inf")) == ["a", "b", "c"]
    runs = [first, _store(tmp_path / "r2", {"a": 0.07, "c": 0.19})]
    spread = median_repeat(runs, ["a", "b", "c"], ResultsStore(tmp_path / "meas", fresh=True))
    assert spread["points"] == 2                                       # b, measured once, has no spread
    assert spread["median"] == pytest.approx((0.02 / 0.05 + 0.0) / 2)


def test_repeat_below_must_be_a_positive_number_of_seconds(capsys):
    from simsparse.cli import main

    with pytest.raises(SystemExit):
        main(["validate", "configs/quickstart.yaml", "--repeat-below", "-1"])
    assert "positive number of seconds" in capsys.readouterr().err


def test_a_profile_of_a_description_older_than_a_new_field_is_still_usable(tmp_path):
    import yaml

    from simsparse.experiments.analysis.validate import _usable
    from simsparse.testbed import load_spec
    from tests.helpers import REPO

    spec = load_spec(str(REPO / "topologies/testbed_tree.yaml"))
    old = spec.model_dump()
    old.pop("ack_queue_efficiency")   # written before the field existed
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"provenance": {"testbed": old}, "compute": {"core_binding": "block"}}))
    assert _usable(path, spec)
    path.write_text(yaml.safe_dump({"provenance": {"testbed": {**old, "source": "another citation"}},
                                    "compute": {"core_binding": "block"}}))
    assert _usable(path, spec)   # the same machine, cited otherwise
    path.write_text(yaml.safe_dump({"provenance": {"testbed": {**old, "link_bw_Bps": 1e9}},
                                    "compute": {"core_binding": "block"}}))
    assert not _usable(path, spec)   # another machine
    old.pop("congestion_control")   # calibrated before the testbed set its TCP (under the host's bbr)
    path.write_text(yaml.safe_dump({"provenance": {"testbed": old}, "compute": {"core_binding": "block"}}))
    assert not _usable(path, spec)


def _phased(path, pid, phases):
    """A store with one point whose trace has one record per phase, of the given length (a measured
    iteration: warmup 0); phase y is a kernel's, the others a message's."""
    st = ResultsStore(path)
    st.save_trace(pid, [{"point_id": pid, "iteration": 0, "rank": 0, "lane": "main", "phase": ph,
                         "op": "compute:add" if ph == "y" else "send",
                         "peer": 1, "bytes": 8, "start_s": 0.0, "end_s": t, "weight": 1.0} for ph, t in phases.items()])
    st.add({"point_id": pid, "algorithm": "ring", "P": 2, "n": 10, "time_s": sum(phases.values()),
            "time_median_s": sum(phases.values()), "warmup": 0})
    st.combine_traces(True)
    return st


def test_each_phase_is_compared_with_its_own_median_over_the_repeats(tmp_path):
    """Phase x took 1, 5 and 2 ms in three launches, phase y 3, 3 and nothing: their medians are
    2 and 3 ms, whichever launch had the median total; compare reads them from phases.csv."""
    from simsparse.experiments.analysis.compare import compare

    runs = [_phased(tmp_path / f"r{i}", "a", ph) for i, ph in
            enumerate([{"x": 1e-3, "y": 3e-3}, {"x": 5e-3, "y": 3e-3}, {"x": 2e-3}], 1)]
    meas = ResultsStore(tmp_path / "meas", fresh=True)
    median_repeat(runs, ["a"], meas)
    floor = median_phases(runs, ["a"], tmp_path / "meas")
    med = read_csv(tmp_path / "meas" / "phases.csv").set_index("phase")
    assert med.loc["x", "time_s"] == pytest.approx(2e-3) and med.loc["y", "time_s"] == pytest.approx(3e-3)
    assert med.loc["x", "repeats"] == 3 and floor["phases"] == 2
    # each against the median of the other two: x 1/3.5, 5/1.5, 2/3; y 3/1.5, 3/1.5, 0/3
    assert floor["phases_one_vs_rest_median"] == pytest.approx(1.0)   # of 0.71, 2.33, 0.33, 1, 1, 1
    assert floor["communication_one_vs_rest_median"] == pytest.approx(1 - 1 / 3.5)   # x alone: y is a kernel's
    assert floor["compute_one_vs_rest_median"] == pytest.approx(1.0)   # y alone: 1, 1, 1
    _phased(tmp_path / "pred", "p", {"x": 2.2e-3, "y": 2.4e-3})
    got = compare(tmp_path / "pred", tmp_path / "meas").phases.set_index("phase")
    assert got.loc["x", "kind"] == "communication" and got.loc["y", "kind"] == "compute"
    assert got.loc["x", "meas_s"] == pytest.approx(2e-3) and got.loc["y", "rel_err"] == pytest.approx(-0.2)
    assert error_on(compare(tmp_path / "pred", tmp_path / "meas").phases, ["a"])["points"] == 2


def test_a_point_measured_again_drops_its_stale_phase_medians(tmp_path):
    """phases.csv keeps the median repeat's time of each point; once the folder's row has another
    time (measured again into it), compare takes that point's phases from its trace again."""
    from simsparse.experiments.analysis.compare import compare

    runs = [_phased(tmp_path / f"r{i}", "a", {"x": t}) for i, t in enumerate([1e-3, 5e-3, 2e-3], 1)]
    median_phases(runs, ["a"], tmp_path / "r3")          # r3 (time 2 ms) is the median repeat
    _phased(tmp_path / "pred", "p", {"x": 2e-3})
    assert compare(tmp_path / "pred", tmp_path / "r3").phases["meas_s"].tolist() == pytest.approx([2e-3])
    _phased(tmp_path / "r3", "a", {"x": 4e-3})            # measured again: 4 ms, its trace says so
    assert compare(tmp_path / "pred", tmp_path / "r3").phases["meas_s"].tolist() == pytest.approx([4e-3])


def test_the_predicted_phases_are_their_median_over_the_predictions_repeats_too(tmp_path):
    """A folder of repeated predictions holds phases.csv as a measured one does: compare takes each side's
    medians (the prediction's one draw of x at 9 ms is outvoted by 2 and 2.5 ms)."""
    from simsparse.experiments.analysis.compare import compare

    _phased(tmp_path / "meas", "a", {"x": 2e-3})
    runs = [_phased(tmp_path / f"p{i}", "p", {"x": t}) for i, t in enumerate([9e-3, 2e-3, 2.5e-3], 1)]
    median_repeat(runs, ["p"], ResultsStore(tmp_path / "pred", fresh=True))
    median_phases(runs, ["p"], tmp_path / "pred")
    c = compare(tmp_path / "pred", tmp_path / "meas")
    assert c.phases["pred_s"].tolist() == pytest.approx([2.5e-3])
    assert any(n.startswith("predicted phases: each phase's median") for n in c.notes)


def test_a_noisy_prediction_is_repeated_with_other_draws_as_the_measurement_is(tmp_path):
    """With kernel noise the points the first prediction puts below the limit are predicted R times,
    noise seeds 0 to R - 1 (each another draw, each repeatable); the folder holds the median repeat
    under the point's own id, and each phase's median. A point above the limit, or a profile without
    noise, is predicted once."""
    from simsparse.experiments.analysis.validate import _predict
    from tests.helpers import make_point

    bands = [{"up_to_s": 1.0, "ratios": [0.5, 1.0, 1.0, 2.0, 4.0]}]
    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-4, "kernel_noise": bands}
    small = make_point("topka", 2, n=4096, compute=prof, iterations=2, evaluation="events")
    big = make_point("topka", 2, n=1 << 16, compute={**prof, "launch_s": 0.5}, iterations=2, evaluation="events")
    _predict(tmp_path / "pred", [small, big], 3, 0.1, False, lambda m: None)
    runs = [ResultsStore(tmp_path / "pred_runs" / f"r{i}") for i in (1, 2, 3)]
    sid, bid = small.point_id("sim"), big.point_id("sim")
    times = sorted(r.rows[sid]["time_s"] for r in runs)
    assert len(set(times)) == 3                                         # three draws of the noise
    assert bid in runs[0].rows and all(bid not in r.rows for r in runs[1:])   # above 0.1 s: once
    got = ResultsStore(tmp_path / "pred").rows
    assert got[sid]["time_s"] == times[1] and got[sid]["repeats"] == 3 and got[bid]["repeats"] == 1
    assert set(read_csv(tmp_path / "pred" / "trace.csv")["point_id"]) == {sid, bid}
    assert (tmp_path / "pred" / "phases.csv").is_file()
    _predict(tmp_path / "again", [small], 3, 0.1, False, lambda m: None)   # the same draws from run to run
    assert ResultsStore(tmp_path / "again").rows[sid]["time_s"] == times[1]
    quiet = make_point("topka", 2, n=4096, compute={k: v for k, v in prof.items() if k != "kernel_noise"})
    _predict(tmp_path / "quiet", [quiet], 3, 0.1, False, lambda m: None)
    assert not (tmp_path / "quiet_runs").exists() and quiet.point_id("sim") in ResultsStore(tmp_path / "quiet").rows


def test_a_held_out_models_layers_are_timed_on_the_ranks_once_and_kept(tmp_path, monkeypatch):
    """A training point whose model the calibration did not time (it times the tuned suite's
    model at one batch) gets its layers timed at its batch on its P ranks, once per (model,
    batch, P), kept in the output folder and read back; a model the profile holds is not timed."""
    from types import SimpleNamespace

    import simsparse.calibration as cal
    from simsparse.compute.models import model_table
    from simsparse.experiments.analysis import validate as v

    n = len(model_table("resnet32_cifar10")["tensors"])
    calls = []

    def fake_time_layers(device, models, bs, reps, ranks=1):
        calls.append((tuple(models), bs, ranks))
        return {m: {"batch_size": bs, "forward_s": 0.01, "backward_s": [1e-4] * n} for m in models}

    monkeypatch.setattr(cal, "time_layers", fake_time_layers)
    point = lambda model, bs: SimpleNamespace(P=4, schedule="whole", batch_size=bs, workload={"model": model},   # noqa: E731
                                             compute=None)
    profiles = {4: {"compute": {"models": {"resnet20_cifar10": {"batch_size": 8}}}}}
    points = [point("resnet32_cifar10", 16), point("resnet32_cifar10", 16), point("resnet20_cifar10", 8)]
    got = v._held_out_layers(points, profiles, tmp_path, "cpu", lambda m: None)
    assert calls == [(("resnet32_cifar10",), 16, 4)]
    entry = got[4]["resnet32_cifar10"]
    assert entry["batch_size"] == 16 and len(entry["t_bwd"]) == n and sum(entry["t_bwd"]) == pytest.approx(n * 1e-4)
    assert v._held_out_layers(points, profiles, tmp_path, "cpu", lambda m: None) == got and len(calls) == 1
