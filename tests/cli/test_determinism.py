"""Determinism: the same config and seed give bit-identical results files,
apart from the columns that measure the run (wall clock, peak memory, host), across runs and both engines
(``events`` on the lean heap, ``events_simpy`` on SimPy's)."""
import io
import textwrap

import pandas as pd

import pytest

from simsparse.cli import main
from simsparse.experiments.run.sweep import RUN_COLUMNS

CFG = """
name: det
network: {preset: ib_edr_fattree, routing: ecmp, placement: random, placement_seed: 3, nodes: 16}
compute: [ideal, p100]
workload: {n: 3000, density: 0.02, seed: 9, drift: 0.3, distribution: laplace}
algorithms: [rabenseifner, oktopk, gaussiank, deft, {name: topka, error_feedback: true}, qsgd_allgather]
P: [3, 6]
iterations: 2
warmup: 1
evaluation: ENGINE
"""


def _volatile(column: str) -> bool:
    """Columns that measure this run rather than the simulated one (its time, memory and place)."""
    return column in RUN_COLUMNS or any(w in column for w in ("wall", "host", "date", "started", "finished", "elapsed"))


def _results(tmp_path, name: str, engine: str) -> str:
    import pandas as pd

    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(textwrap.dedent(CFG).replace("ENGINE", engine))
    out = tmp_path / name
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    df = pd.read_csv(out / "results.csv", dtype=str, keep_default_na=False)  # the text exactly as written
    return df[[c for c in df.columns if not _volatile(c)]].to_csv(index=False)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    return _results(tmp_path_factory.mktemp("det"), "first", "events")


def test_the_same_config_gives_the_same_results_file(first, tmp_path):
    assert _results(tmp_path, "again", "events") == first
    assert first.count("\n") == 1 + 2 * 2 * 6  # header, P x compute x algorithms


def test_both_engines_give_the_same_results_file(first, tmp_path):
    simpy, lean = (pd.read_csv(io.StringIO(t), dtype=str, keep_default_na=False)
                   for t in (_results(tmp_path, "simpy", "events_simpy"), first))
    assert (simpy.evaluator == "events_simpy").all() and (lean.evaluator == "events").all()
    same = [c for c in lean.columns if c not in ("point_id", "evaluator")]   # (the knob is part of the id)
    assert simpy[same].equals(lean[same])
