"""`simsparse plot RESULTS`: PNGs from any results folder; clear errors."""
import textwrap

import pytest

from simsparse.cli import main

CFG = """
name: plotme
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
compute: [ideal, p100]
workload: {n: 512, density: 0.05, seed: 3}
algorithms: [ring, topka]
P: [2, 4]
iterations: 1
warmup: 0
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("plot")
    (d / "c.yaml").write_text(textwrap.dedent(CFG))
    assert main(["sweep", str(d / "c.yaml"), "--jobs", "1", "--out", str(d / "res"), "--no-plot",
                 "--format", "parquet"]) == 0
    return d / "res"


def test_default_plot_is_time_against_P(results, capsys):
    assert main(["plot", str(results)]) == 0
    png = results / "time_s_vs_P.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert str(png) in capsys.readouterr().out


def test_columns_filters_and_output_path(results, tmp_path):
    out = tmp_path / "b.png"
    assert main(["plot", str(results / "results.parquet"), "--y", "bytes_sent_max", "--hue", "algorithm",
                 "--where", "compute=p100", "--where", "P=4.0", "--x", "n", "--out", str(out)]) == 0
    assert out.stat().st_size > 5000


@pytest.mark.parametrize("argv, says", [
    (["--y", "time"], "did you mean 'time_s'"),
    (["--x", "ranks"], "--x ranks: no such column"),
    (["--y", "algorithm"], "holds no numbers"),
    (["--hue", "colour"], "the results have: point_id"),
    (["--where", "compute"], "expected COL=VALUE"),
    (["--where", "compute=v100"], "its values: ideal, p100"),
])
def test_bad_columns_exit_2_with_one_paragraph(results, capsys, argv, says):
    assert main(["plot", str(results), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and err.count("\n") == 1


def test_a_folder_without_results(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "no results.csv or results.parquet" in capsys.readouterr().err
