"""A training config without ``algorithms``: every schedule runs the
collective of its paper (``Schedule.default_algorithm``), and the table says
the default was taken."""
from pathlib import Path

import pandas as pd
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.cli import main
from simsparse.experiments.config.schema import ConfigError, load_config
from simsparse.schedules import SCHEDULES

PAPERS = {"whole": "rabenseifner", "dense_ovlp": "rabenseifner", "ddp": "ring", "wfbp": "ring", "mg_wfbp": "ring",
          "topk_sgd": "topka", "lags_sgd": "topka", "mgs_sgd": "topka", "omgs_sgd": "topka"}
HEAD = "network: aries_alphabeta\ncompute: p100\nmodel: resnet20_cifar10\nP: 2\niterations: 1\nwarmup: 0\n"


def _cfg(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "train.yaml"
    cfg.write_text(HEAD + body)
    return cfg


def test_every_schedule_names_the_collective_of_its_paper():
    assert {name: cls.default_algorithm for name, cls in SCHEDULES.items()} == PAPERS
    for name, cls in SCHEDULES.items():  # and one it can use
        assert cls.check_algorithm(ALGORITHMS[cls.default_algorithm]) is None, name


def test_a_config_without_algorithms_pairs_each_schedule_with_its_default(tmp_path):
    exp = load_config(_cfg(tmp_path, f"schedules: [{', '.join(PAPERS)}]\n"))
    assert {(p.schedule, p.algorithm) for p in exp.points} == set(PAPERS.items())
    assert len(exp.points) == len(PAPERS) and all(p.algorithm_default for p in exp.points)


def test_listed_algorithms_are_no_default_and_keep_their_ids(tmp_path):
    (listed,) = load_config(_cfg(tmp_path, "schedules: [whole]\nalgorithms: [rabenseifner]\n")).points
    (default,) = load_config(_cfg(tmp_path, "schedules: [whole]\n")).points
    assert not listed.algorithm_default and default.algorithm_default
    assert listed.point_id("sim") == default.point_id("sim")  # the same run, so a sweep resumes it
    assert "algorithm_default" not in listed.label_columns()
    assert default.label_columns()["algorithm_default"] is True


def test_the_table_marks_the_default(tmp_path, capsys):
    cfg = _cfg(tmp_path, "schedules: [whole, topk_sgd]\ncheck: false\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "whole / rabenseifner (default)" in out and "topk_sgd / topka (default)" in out
    rows = pd.read_csv(tmp_path / "r" / "results.csv")
    assert rows["algorithm_default"].tolist() == [True, True]  # the results keep it


def test_a_schedule_without_a_default_asks_for_algorithms(tmp_path, monkeypatch):
    (tmp_path / "no_default.py").write_text(
        "from simsparse.schedules import Schedule\n\n\n"
        "class NoDefault(Schedule):\n"
        "    @classmethod\n"
        "    def plan(cls, params, costs):\n"
        "        return (len(costs.sizes),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="no_default:NoDefault names no default collective.*list 'algorithms'"):
        load_config(_cfg(tmp_path, "schedules: ['no_default:NoDefault']\n"))
