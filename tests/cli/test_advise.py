"""`simsparse advise`: a ranking of every applicable (schedule, algorithm),
predictions that agree with simulating the schedule, --sweep-P, errors."""
import pandas as pd
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.cli import main
from simsparse.experiments.config.schema import load_config
from simsparse.experiments.run.runner import simulate_point
from simsparse.schedules import SCHEDULES

BASE = ["advise", "--network", "aries_alphabeta", "--model", "resnet20_cifar10", "--jobs", "1"]


@pytest.fixture(scope="module")
def advised(tmp_path_factory):
    out = tmp_path_factory.mktemp("advise") / "r20"
    assert main([*BASE, "-P", "8", "--out", str(out)]) == 0
    return out


def test_every_applicable_pair_is_ranked(advised):
    df = pd.read_csv(advised / "advise.csv")
    assert list(df["rank"]) == list(range(1, len(df) + 1))
    assert df["t_iter_s"].is_monotonic_increasing
    dense = {a for a, c in ALGORITHMS.items() if c.dense}
    for name, cls in SCHEDULES.items():
        got = set(df[df["schedule"].str.split(" ").str[0] == name]["algorithm"])
        assert got == (dense if cls.accepts == "dense" else set(ALGORITHMS) - dense), name
    assert ((df["overlap"] >= 0) & (df["overlap"] <= 1)).all()
    assert (df["t_iter_s"] >= df["t_forward_backward_s"]).all()


def test_prints_the_top_choices_with_why(advised, capsys):
    assert main([*BASE, "-P", "8", "--out", str(advised), "--top", "3"]) == 0
    out, err = capsys.readouterr()
    assert "aries-alphabeta, as given" in out  # an alphabeta network is used as it is
    assert out.count("per iteration") == 3 and "busiest rank sends" in out and "hidden behind" in out
    assert "simulating" not in err  # the collectives' rows were kept: nothing simulated again


def test_the_written_config_is_valid_and_the_prediction_agrees_with_the_simulator(advised):
    """One-bucket schedules have no pipelining to model: the advisor's
    prediction must match simulating the schedule."""
    exp = load_config(advised / "config.yaml")
    assert exp.points
    df = pd.read_csv(advised / "advise.csv").set_index(["schedule", "algorithm"])
    for sched, alg in [("whole", "rabenseifner"), ("topk_sgd", "topka")]:
        pt = next(p for p in load_config(_config(advised, sched, alg)).points)
        simulated = simulate_point(pt).row["t_iter_s"]
        assert df.loc[(sched, alg), "t_iter_s"] == pytest.approx(simulated, rel=0.05), (sched, alg)


def _config(folder, sched, alg):
    path = folder / f"{sched}_{alg}.yaml"
    path.write_text(f"network: aries_alphabeta\ncompute: p100\nmodel: resnet20_cifar10\nworkload: {{density: 0.01}}\n"
                    f"schedules: [{sched}]\nalgorithms: [{alg}]\nP: 8\niterations: 1\nwarmup: 1\n")
    return path


@pytest.mark.slow
def test_sweep_P_shows_the_winner_per_P(advised, capsys):
    # in the fixture's folder: P = 8's rows are kept from it, only P = 4 is simulated
    assert main([*BASE, "-P", "8", "--sweep-P", "--out", str(advised)]) == 0
    by_p = pd.read_csv(advised / "advise_by_P.csv")
    assert list(by_p["P"]) == [4, 8] and by_p["winner"].str.contains(" / ").all()
    assert "the winner as P grows" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--model", "bert_bse"], "did you mean 'bert_base'"),
    (["--density", "2"], "0 < density <= 1"),
    (["-P", "1"], "nothing to communicate"),
    (["--network", "piz_daint"], "piz_daint_aries"),
    (["--compute", "p1000"], "allowed"),
])
def test_bad_input_exits_2_with_one_paragraph(tmp_path, capsys, argv, says):
    args = {"--network": "aries_alphabeta", "--model": "resnet20_cifar10", "-P": "4"}
    args.update(dict(zip(argv[::2], argv[1::2])))
    status = main(["advise", *[x for kv in args.items() for x in kv], "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert status == 2 and says in err and "Traceback" not in err and err.count("\n") == 1
