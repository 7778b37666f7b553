"""Plugins: an algorithm outside the package (examples/my_allreduce), named by
a dotted path or registered through an entry point, runs the same in ``run``,
``sweep --jobs 2`` and ``measure``; bad dotted paths get a clear error."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.cli import main
from simsparse.compute.devices import load_profile
from simsparse.compute.kernels import KERNELS, get_kernel
from simsparse.experiments.config.schema import load_config
from simsparse.registry import UnknownName
from simsparse.schedules import SCHEDULES

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_allreduce"
DOTTED = "my_allreduce:RingTopk"
HAVE_MPI = all(importlib.util.find_spec(m) for m in ("mpi4py", "torch")) and (
    (Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec") is not None)


def _cfg(tmp_path: Path, algorithms: str, extra: str = "") -> Path:
    cfg = tmp_path / "plugin.yaml"
    cfg.write_text(f"network: ethernet_10g\nworkload: {{n: 20000, density: 0.01}}\nalgorithms: {algorithms}\n"
                   f"P: 2\niterations: 2\nwarmup: 1\n{extra}")
    return cfg


def _rows(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "results.csv").set_index("algorithm")


@pytest.fixture
def on_path(monkeypatch):
    """The example package importable in this process only (not via PYTHONPATH)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delenv("PYTHONPATH", raising=False)


@pytest.mark.slow
def test_the_example_runs_in_run_sweep_and_measure_correct_and_with_the_same_bytes(tmp_path, on_path):
    cfg = EXAMPLE / "measure.yaml"  # the guide's P = 2 config
    assert main(["run", str(cfg), "--out", str(tmp_path / "run"), "--no-plot"]) == 0
    run = _rows(tmp_path / "run")
    assert run.loc[DOTTED, "correct"] == True and run.loc["topka", "correct"] == True  # noqa: E712 (NaN is truthy)
    # the ring sends each selection P - 1 = 1 times: k = 1000 (int32 index, float32 value) pairs per rank
    assert run.loc[DOTTED, "bytes_total"] == 2 * 1000 * 8 == run.loc["topka", "bytes_total"]

    # sweep's process pool: a fresh interpreter that finds the package on PYTHONPATH
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE)}
    exe = Path(sys.executable).parent / "simsparse"
    done = subprocess.run([str(exe), "sweep", str(cfg), "--out", str(tmp_path / "sweep"), "--jobs", "2",
                           "--no-plot"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    sweep = _rows(tmp_path / "sweep")
    assert sweep.loc[DOTTED, "correct"] == True  # noqa: E712
    assert sweep.loc[DOTTED, "bytes_total"] == run.loc[DOTTED, "bytes_total"]

    if not HAVE_MPI:
        pytest.skip("measure needs the [mpi] extra (mpi4py, torch, mpiexec)")
    # mpiexec's ranks: measure hands them the folder this process imported the plugin from
    assert main(["measure", str(cfg), "--out", str(tmp_path / "mpi"), "--no-plot", "--device", "cpu"]) == 0
    mpi = _rows(tmp_path / "mpi")
    assert mpi.loc[DOTTED, "backend"] == "mpi" and mpi.loc[DOTTED, "correct"] == True  # noqa: E712
    for col in ("bytes_total", "bytes_sent_max", "msgs_total"):
        assert mpi.loc[DOTTED, col] == run.loc[DOTTED, col], col


def test_list_explains_a_plugin_by_its_dotted_path(on_path, capsys):
    assert main(["list", DOTTED]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{DOTTED} (algorithm)") and "Ring top-k" in out and "error_feedback = False" in out


@pytest.fixture
def installed(tmp_path, monkeypatch, on_path):
    """A fake installed distribution declaring the example's entry point (as its pyproject.toml does)."""
    dist = tmp_path / "site" / "my_allreduce-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-allreduce\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[simsparse.algorithms]\nring_topk = my_allreduce:RingTopk\n"
                                           "not_an_algorithm = my_allreduce:np\n")
    monkeypatch.syspath_prepend(str(dist.parent))
    yield
    for name in ("ring_topk", "not_an_algorithm"):
        ALGORITHMS._plugins.pop(name, None)


def test_an_entry_point_registers_the_algorithm_by_its_name(tmp_path, installed):
    assert ALGORITHMS["ring_topk"].__name__ == "RingTopk"
    assert "ring_topk" in ALGORITHMS.names() and "ring_topk" not in list(ALGORITHMS)  # listings stay the package's
    assert main(["run", str(_cfg(tmp_path, "[ring_topk]")), "--out", str(tmp_path / "r"), "--no-plot"]) == 0
    assert _rows(tmp_path / "r").loc["ring_topk", "correct"] == True  # noqa: E712


def test_an_entry_point_of_the_wrong_kind_is_refused(installed):
    with pytest.raises(UnknownName, match=r"not_an_algorithm.*entry point 'my_allreduce:np'.*not a subclass of "
                                          r"simsparse.algorithms.base.Algorithm"):
        ALGORITHMS["not_an_algorithm"]


@pytest.mark.parametrize("name,why", [
    ("nowhere_pkg.mod:Algo", "cannot import module 'nowhere_pkg.mod' (ModuleNotFoundError"),
    ("my_allreduce:RingTopK", "module 'my_allreduce' has no 'RingTopK'"),
    ("my_allreduce:np", "not a subclass of simsparse.algorithms.base.Algorithm"),
])
def test_a_bad_dotted_path_names_the_file_the_key_and_what_is_allowed(tmp_path, on_path, capsys, name, why):
    cfg = _cfg(tmp_path, f"[ring, '{name}']")
    assert main(["run", str(cfg), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: algorithms[1]: algorithm '{name}': " in err and why in err
    assert "allowed: a dotted path package.module:Object naming a subclass of simsparse.algorithms.Algorithm" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.fixture
def my_machine(tmp_path, monkeypatch):
    yield
    KERNELS._items.pop("my_machine_negate", None)  # what importing the module registered
    sys.modules.pop("my_machine", None)


def test_the_other_registries_take_dotted_paths(tmp_path, monkeypatch, my_machine):
    """A device profile, a network preset and a kernel from a module outside the package."""
    (tmp_path / "my_machine.py").write_text(
        "from simsparse.compute.kernels import kernel, streaming\n"
        "P9 = {'launch_s': 1.0e-5, 'mem_bandwidth_Bps': 7.0e11, 'peak_flops': 1.0e13}\n"
        "NET = {'model': 'alphabeta', 'alpha_s': 3.0e-6, 'bandwidth_Bps': 2.0e9}\n"
        "@kernel('my_machine_negate', work=streaming(1, 1))\n"
        "def negate(a):\n    return -a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_profile("my_machine:P9").mem_bandwidth_Bps == 7.0e11
    assert get_kernel("my_machine:negate") is get_kernel("my_machine_negate")
    cfg = _cfg(tmp_path, "[ring]", "compute: 'my_machine:P9'\n").read_text().replace("ethernet_10g", "'my_machine:NET'")
    (tmp_path / "c.yaml").write_text(cfg)
    (point,) = load_config(tmp_path / "c.yaml").points
    assert point.network["alpha_s"] == 3.0e-6 and point.compute["launch_s"] == 1.0e-5
    with pytest.raises(UnknownName, match="Kernel object .*, not a DeviceProfile, a mapping or a profile path"):
        load_profile("my_machine:negate")


def test_a_schedule_by_dotted_path_runs_a_training_iteration_with_its_default(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_sched.py").write_text(
        "from simsparse.schedules.layerwise import Whole\n\n\n"
        "class Whole2(Whole):\n    \"\"\"Whole, from outside the package.\"\"\"\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "t.yaml"
    cfg.write_text("network: aries_alphabeta\ncompute: p100\nmodel: resnet20_cifar10\nschedules: ['my_sched:Whole2']\n"
                   "P: 2\niterations: 1\nwarmup: 0\nevaluation: events\n")  # events: every value, so the result is checked
    assert main(["run", str(cfg), "--out", str(tmp_path / "r"), "--no-plot"]) == 0
    assert "my_sched:Whole2 / rabenseifner (default)" in capsys.readouterr().out
    row = pd.read_csv(tmp_path / "r" / "results.csv").iloc[0]
    assert row["schedule"] == "my_sched:Whole2" and row["correct"] == True  # noqa: E712
    assert SCHEDULES["my_sched:Whole2"].name == "my_sched:Whole2" and SCHEDULES["whole"].name == "whole"
