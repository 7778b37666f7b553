"""`simsparse sweep`: the same rows whatever the executor and the number of
jobs, resume after SIGKILL, Parquet, provenance, and errors."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simsparse.cli import main
from simsparse.experiments.run import sweep as sw
from simsparse.experiments.results.store import read_csv, read_results

from tests.helpers import requires_mpi

# 60 points: 6 algorithms x 5 P x 2 seeds, tiny and alpha-beta, so about 3 s in all
GRID = """
name: grid60
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
workload: {n: 256, density: 0.05, seed: [1, 2]}
algorithms: [ring, rabenseifner, topka, gtopk, oktopk, topkdsa]
P: [2, 3, 4, 6, 8]
iterations: 1
warmup: 1
"""
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    d = tmp_path_factory.mktemp("grid")
    (d / "grid.yaml").write_text(textwrap.dedent(GRID))
    return d / "grid.yaml"


@pytest.fixture(scope="module")
def serial(grid):
    """The rows of an uninterrupted `--jobs 1` sweep."""
    out = grid.parent / "serial"
    assert main(["sweep", str(grid), "--jobs", "1", "--out", str(out), "--no-plot"]) == 0
    return rows(out)


def rows(out: Path) -> pd.DataFrame:
    """The results without the columns that say when and where a point ran,
    as text read back like a CSV (so CSV and Parquet compare value by value)."""
    df = read_results(next(out.glob("results.*")))
    df = df.drop(columns=[c for c in sw.RUN_COLUMNS if c in df.columns])
    return read_csv(io.StringIO(df.to_csv(index=False)))


def test_grid_has_60_points_in_config_order(serial, grid):
    from simsparse.experiments.config.schema import load_config

    assert len(serial) == 60 and serial["correct"].all()
    assert list(serial["point_id"]) == [sw.ident(p) for p in load_config(grid).points]


@pytest.mark.slow
def test_two_local_jobs_give_the_same_rows(grid, serial, tmp_path):
    out = tmp_path / "jobs2"
    assert main(["sweep", str(grid), "--jobs", "2", "--out", str(out), "--no-plot"]) == 0
    pd.testing.assert_frame_equal(rows(out), serial)
    where = read_results(out / "results.csv")
    assert where["worker"].nunique() == 2 and where["host"].notna().all()


@pytest.mark.slow
def test_dask_local_cluster_gives_the_same_rows(grid, serial, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "dask"
    assert main(["sweep", str(grid), "--executor", "dask", "--jobs", "2", "--out", str(out), "--no-plot"]) == 0
    pd.testing.assert_frame_equal(rows(out), serial)


@requires_mpi
@pytest.mark.mpi
def test_mpi_futures_gives_the_same_rows(grid, serial, tmp_path):
    out = tmp_path / "mpi"
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", "3", sys.executable, "-m", "mpi4py.futures", "-m", "simsparse.cli", "sweep", str(grid),
           "--executor", "mpi", "--out", str(out), "--no-plot"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    pd.testing.assert_frame_equal(rows(out), serial)
    assert read_results(out / "results.csv")["worker"].nunique() == 2  # ranks 1 and 2 simulated


def _sweep_process(grid, out, jobs=2):
    return subprocess.Popen([sys.executable, "-m", "simsparse.cli", "sweep", str(grid), "--jobs", str(jobs),
                             "--out", str(out), "--no-plot"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=ENV, start_new_session=True)


def _rows_written(results: Path) -> int:
    """Rows in the results file, by its lines: cheap enough to poll every few
    milliseconds (a pandas read took long enough on a loaded 2-core CI machine
    for the last 15 cheap points to finish between two polls)."""
    try:
        return max(results.read_bytes().count(b"\n") - 1, 0)
    except FileNotFoundError:
        return 0


def _kill_after(proc, results: Path, at_least: int, timeout_s: float = 120) -> int:
    """SIGKILL the sweep once its results hold ``at_least`` rows; the rows it had."""
    end = time.monotonic() + timeout_s
    n = 0
    while time.monotonic() < end and proc.poll() is None:
        n = _rows_written(results)
        if n >= at_least:
            break
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)   # the sweep itself, as `kill -9 PID` would
    proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # then its orphaned workers
    except ProcessLookupError:
        pass
    return n


@pytest.mark.slow
def test_sigkill_at_several_moments_then_resume_equals_uninterrupted(grid, serial, tmp_path):
    out = tmp_path / "killed"
    seen = []
    for at_least in (1, 15, 30):   # the last kill leaves half the grid to do
        proc = _sweep_process(grid, out)
        seen.append(_kill_after(proc, out / "results.csv", at_least))
        assert read_results(out / "results.csv")["point_id"].is_unique  # parseable, no duplicates
    assert seen[-1] < 60, "the sweep finished before it could be killed"
    before = len(read_results(out / "results.csv"))
    (out / ".results.csv.leftover.csv").write_text("half a file")  # what a kill inside a rename leaves
    assert main(["sweep", str(grid), "--jobs", "2", "--out", str(out), "--no-plot"]) == 0
    pd.testing.assert_frame_equal(rows(out), serial)
    assert not [f.name for f in out.iterdir() if f.name.startswith(".") and f.name != ".lock"]
    runs = json.loads((out / "provenance.json").read_text())["runs"]
    assert len(runs) == 4 and runs[-1]["ran"] == 60 - before


@pytest.mark.slow
def test_parquet_holds_the_same_rows_and_switching_format_converts(grid, serial, tmp_path):
    out = tmp_path / "pq"
    assert main(["sweep", str(grid), "--jobs", "1", "--format", "parquet", "--out", str(out), "--no-plot"]) == 0
    assert (out / "results.parquet").exists() and not (out / "results.csv").exists()
    pd.testing.assert_frame_equal(rows(out), serial)
    assert main(["sweep", str(grid), "--out", str(out), "--no-plot"]) == 0  # csv again: nothing to run
    assert (out / "results.csv").exists() and not (out / "results.parquet").exists()
    pd.testing.assert_frame_equal(rows(out), serial)


def test_provenance_beside_the_results(grid, serial):
    out = grid.parent / "serial"
    assert (out / "config.yaml").read_text() == grid.read_text()
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert [p["point_id"] for p in resolved["points"]] == list(serial["point_id"])
    assert resolved["points"][0]["network"]["alpha_s"] == 1.0e-6
    run = json.loads((out / "provenance.json").read_text())["runs"][-1]
    assert run["seeds"] == [1, 2] and run["executor"] == "local" and run["ran"] == 60
    assert run["host"]["name"] and run["python"] and "numpy" in run["dependencies"]
    assert run["simsparse"] and (run["git"] is None or len(run["git"]["commit"]) == 40)


@pytest.mark.slow
def test_a_failing_point_is_reported_and_the_others_kept(grid, tmp_path, monkeypatch, capsys):
    real = sw.run_task

    def flaky(point, trace=False, max_seconds=None):
        if point.algorithm == "gtopk" and point.P == 4:
            raise RuntimeError("boom")
        return real(point, trace, max_seconds)

    monkeypatch.setattr(sw, "run_task", flaky)
    out = tmp_path / "flaky"
    assert main(["sweep", str(grid), "--jobs", "1", "--out", str(out), "--no-plot"]) == 1
    assert len(read_results(out / "results.csv")) == 58
    assert "gtopk" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--scheduler", "tcp://127.0.0.1:1"], "with --executor dask"),
    (["--jobs", "0"], "at least 1"),
    (["--executor", "ray"], "invalid choice"),
])
def test_bad_options_exit_2_with_one_message(grid, tmp_path, capsys, argv, says):
    try:
        status = main(["sweep", str(grid), "--out", str(tmp_path / "x"), *argv])
    except SystemExit as e:  # argparse's own errors
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and says in err and "Traceback" not in err


def test_a_folder_another_sweep_writes_is_refused(grid, tmp_path, capsys):
    from simsparse.experiments.results.store import writer_lock

    out = tmp_path / "busy"
    with writer_lock(out):
        assert main(["sweep", str(grid), "--out", str(out), "--no-plot"]) == 2
    assert "another simsparse process" in capsys.readouterr().err

