"""Models from elsewhere (simsparse.models.sources): specs, their per-tensor tables, a user's
own module through run, sweep and measure, and the errors a user meets."""
from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")

from simsparse.cli import main  # noqa: E402
from simsparse.compute.models import model_table  # noqa: E402
from simsparse.experiments.config.schema import ConfigError, load_config  # noqa: E402
from simsparse.models import sources  # noqa: E402
from simsparse.models.sources import ModelSpecError, canonical, parse  # noqa: E402

from tests.helpers import cli_run, requires_mpi, write_config  # noqa: E402

#: a small transformer a user keeps in a folder of their own
TINY = '''
import torch.nn as nn


class Tiny(nn.Module):
    def __init__(self, vocab=100, d=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        block = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)))


def make(layers=2):
    return Tiny(layers=layers)


def not_a_module():
    return 42
'''


def one_ring(tmp_path, model: str, extra: str = ""):
    """A config of one ring allreduce over ``model``'s gradients at P = 2 (``extra``: more keys)."""
    return write_config(tmp_path, textwrap.dedent(f"""\
        network: aries_alphabeta
        compute: a100
        model: [{model}]
        schedules: [whole]
        algorithms: [ring]
        P: 2
        """) + extra, "one_ring.yaml")


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    """A folder outside the package holding ``tinynet.py``, on sys.path and PYTHONPATH, and a
    fresh table cache."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "tinynet.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.setenv("SIMSPARSE_CACHE", str(tmp_path / "cache"))
    sources.table.cache_clear()
    sources.resolve.cache_clear()
    yield folder
    sources.table.cache_clear()
    sources.resolve.cache_clear()


def test_a_spec_is_parsed_and_written_back_one_way():
    assert parse("hf:LlamaConfig(num_hidden_layers=4, seq=512)") == ("hf", "LlamaConfig",
                                                                     {"num_hidden_layers": 4, "seq": 512})
    assert canonical("hf:LlamaConfig( seq=512,num_hidden_layers=4 )") == "hf:LlamaConfig(num_hidden_layers=4, seq=512)"
    assert canonical("pkg.mod:make(image=[3, 32, 32])") == "pkg.mod:make(image=[3, 32, 32])"
    for bad in ("hf:LlamaConfig(4)", "hf:LlamaConfig(x=open)", "nocolon"):
        with pytest.raises(ModelSpecError):
            canonical(bad)


@pytest.mark.slow
def test_gpt2_tensors_are_its_parameters_with_the_tied_embedding_once():
    """GPT-2 (124M) from its config: 148 tensors summing to sum(p.numel()), the output layer
    sharing the token embedding (one tensor, one gradient); its table counts them the same."""
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config())
    assert model.lm_head.weight is model.transformer.wte.weight
    sizes = [p.numel() for p in model.parameters()]
    assert len(sizes) == 148 and sum(sizes) == 124_439_808
    small = model_table("hf:GPT2Config(n_layer=1, n_embd=64, n_head=2, seq=32)")
    with torch.device("meta"):
        tiny = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2))
    assert [t["size"] for t in small["tensors"]] == [p.numel() for p in tiny.parameters()]
    assert small["input"] == "32 tokens over a 50,257 vocabulary"
    # the tied matrix carries the output layer's work too: forward FLOPs 2 x 64 x 50,257 per token
    assert small["tensors"][0]["fwd_flops"] >= 2 * 64 * 50257 * 32


@pytest.mark.slow
def test_a_users_module_trains_through_run_and_sweep(user_models, tmp_path, capsys):
    cfg = write_config(tmp_path, """\
        network: aries_alphabeta
        compute: a100
        model: [{name: "tinynet:make(layers=2, seq=16, vocab=100)", batch_size: 4, density: 0.05}]
        schedules: [dense_ovlp, topk_sgd]
        algorithms: [rabenseifner, oktopk]
        P: 2
        iterations: 1
        warmup: 0
        check: false
        """, "tiny.yaml")
    (point, *_) = load_config(cfg).points
    assert point.model == "tinynet:make(layers=2, seq=16, vocab=100)"
    table = model_table(point.model)
    assert sum(t["size"] for t in table["tensors"]) == sum(p.numel() for p in
                                                           __import__("tinynet").make().parameters())
    code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / "r"), "--no-plot"], capsys)
    assert code == 0, err
    assert main(["sweep", str(cfg), "--jobs", "2", "--out", str(tmp_path / "s"), "--no-plot"]) == 0
    import pandas as pd
    run, sweep = (pd.read_csv(tmp_path / d / "results.csv").sort_values("point_id") for d in ("r", "s"))
    assert list(run["t_iter_s"]) == list(sweep["t_iter_s"]) and (run["t_iter_s"] > 0).all()


@requires_mpi
@pytest.mark.mpi
def test_measure_trains_the_users_module(user_models, tmp_path):
    from simsparse.experiments.run.measure import measure_points

    cfg = write_config(tmp_path, """\
        network: aries_alphabeta
        compute: ideal
        model: [{name: "tinynet:make(seq=16, vocab=100)", batch_size: 2, density: 0.05}]
        schedules: [topk_sgd]
        algorithms: [oktopk]
        P: 2
        iterations: 1
        warmup: 0
        """, "tiny.yaml")
    (point,) = load_config(cfg).points
    (m,) = measure_points([point], device="cpu")
    assert m.row["backend"] == "mpi" and m.row["t_iter_s"] > 0


@pytest.mark.slow
def test_model_import_writes_a_table_a_config_names(user_models, tmp_path, capsys):
    out = tmp_path / "tiny.json"
    code, err, _ = cli_run(["model", "import", "tinynet:make(seq=8)", "-o", str(out)], capsys)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["spec"] == "tinynet:make(seq=8)" and doc["num_tensors"] == len(doc["tensors"])
    cfg = one_ring(tmp_path, f'{{name: "{out}", batch_size: 2}}', "iterations: 1\nwarmup: 0\ncheck: false\n")
    code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / "r"), "--no-plot"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("spec, says", [
    ("tinynet:not_a_module(seq=8)", "returned int, not a torch.nn.Module"),
    ("tinynet:nothing(seq=8)", "has no 'nothing'"),
    ("tinynet:make", "say what one sample is"),
    ("hf:GPT3Config", "has no config class 'GPT3Config'"),
    ("hf:GPT2Config(n_layers=2)", "has no setting 'n_layers'"),
    ("hf:GPT2Config(n_layer=1, dtype='fp16')", "dtype='fp16'; allowed: 'fp32', 'bf16'"),
    ("hf:GPT2Config(n_layer=1, checkpoint=0)", "checkpoint=0; allowed: True (every layer) or N >= 1"),
    ("tinynet:make(seq=8, checkpoint=True)", "a module of your own checkpoints its blocks in its forward"),
])
def test_a_model_that_cannot_be_used_gets_one_paragraph(user_models, tmp_path, capsys, spec, says):
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    cfg = one_ring(tmp_path, f'{{name: "{spec}"}}')
    code, err, seconds = cli_run(["run", str(cfg), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and says in err and "Traceback" not in err and "model" in err, err
    with pytest.raises(ConfigError):
        load_config(cfg)


def test_activation_checkpointing_runs_each_checkpointed_layers_forward_again_in_the_backward():
    """checkpoint=True recomputes every layer in the backward pass, checkpoint=2 every second: FLOPs
    counted exactly (the forward is unchanged). torch's non-reentrant checkpoint stops recomputing
    once the backward has what it saved, so a layer's last matrix product (its output, which nothing
    of its own backward reads) is not run again: each recompute is the layer's forward less that."""
    pytest.importorskip("transformers")
    from simsparse.models.costs import FIELDS, count

    size = ("hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2, "
            "vocab_size=100, seq=16")

    def flops(layers, more=""):
        src = sources.resolve(f"hf:LlamaConfig(num_hidden_layers={layers}, {size}{more})")
        _, rows = count(src.build, src.batch, src.loss, 2)
        return [sum(r[FIELDS.index(f)] for r in rows) for f in ("fwd_flops", "bwd_flops")]

    (f0, _), (f2, b2), (f4, b4) = flops(0), flops(2), flops(4)
    (cf2, cb2), (cf4, cb4) = flops(2, ", checkpoint=True"), flops(4, ", checkpoint=2")
    assert (cf2, cf4) == (f2, f4)
    layer = (f2 - f0) // 2   # one decoder layer's forward
    down = 2 * 2 * 16 * 128 * 64   # its last product, down_proj: 2 samples x 16 tokens, 128 -> 64
    assert cb2 - b2 == 2 * (layer - down) and cb4 - b4 == 2 * (layer - down)
    assert canonical("hf:LlamaConfig(checkpoint=True, seq=16)") == "hf:LlamaConfig(checkpoint=True, seq=16)"


def test_a_table_missing_a_column_is_refused_with_the_column(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tensors": [{"size": 10, "fwd_flops": 1, "fwd_bytes": 1, "fwd_ops": 1,
                                            "bwd_flops": 1, "bwd_ops": 1}]}))
    cfg = one_ring(tmp_path, f'{{name: "{bad}", batch_size: 2}}')
    code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "tensors[0] lacks bwd_bytes" in err and str(bad) in err, err


def test_model_profile_times_the_module_here_and_run_uses_those_times(user_models, tmp_path, capsys):
    """model profile --device cpu: forward and every tensor's ready interval measured (the hooks
    calibrate uses), written into a copy of the base profile; a run at that batch takes them as
    they are, and a run at another batch is refused with the batch to set."""
    import yaml

    out = tmp_path / "cpu.yaml"
    code, err, _ = cli_run(["model", "profile", "tinynet:make(seq=16)", "--device", "cpu", "--batch-size", "2",
                            "--reps", "2", "--base", "p100", "-o", str(out)], capsys)
    assert code == 0, err
    times = yaml.safe_load(out.read_text())["models"]["tinynet:make(seq=16)"]
    assert times["batch_size"] == 2 and times["settings"]["device"].startswith("cpu")
    assert len(times["t_bwd"]) == len(times["t_fwd"]) == len(model_table("tinynet:make(seq=16)")["tensors"])
    model = '{name: "tinynet:make(seq=16)", batch_size: %d}'
    cfg = one_ring(tmp_path, model % 2, f"compute: {out}\niterations: 1\nwarmup: 0\ncheck: false\n")
    cfg.write_text(cfg.read_text().replace("compute: a100\n", ""))
    code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / "r"), "--no-plot"], capsys)
    assert code == 0, err
    import pandas as pd
    row = pd.read_csv(tmp_path / "r" / "results.csv").iloc[0]
    assert row["t_backward_s"] == pytest.approx(sum(times["t_bwd"]), rel=1e-9)
    assert row["t_forward_s"] == pytest.approx(sum(times["t_fwd"]), rel=1e-9)
    cfg.write_text(cfg.read_text().replace("batch_size: 2", "batch_size: 4"))
    code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / "r4")], capsys)
    assert code == 2 and "measured at batch 2" in err and "set batch_size 2" in err, err


@requires_mpi
@pytest.mark.mpi
def test_model_profile_with_ranks_times_the_module_on_every_rank_at_once(user_models, tmp_path, capsys):
    """--ranks 2: the ranks that will share this host time the module together under mpiexec (each with
    its share of the cores, as measure's ranks run); the profile says so. Alone, ResNet-20's layers here
    ran 1.5x faster than calibrate times them with both ranks, and a user's GPT-2 at P = 2 was predicted
    22 % low; with --ranks 2, 4 % (see docs/models.md)."""
    import yaml

    out = tmp_path / "cpu2.yaml"
    code, err, _ = cli_run(["model", "profile", "tinynet:make(seq=16)", "--device", "cpu", "--batch-size", "2",
                            "--reps", "2", "--ranks", "2", "--base", "p100", "-o", str(out)], capsys)
    assert code == 0, err
    times = yaml.safe_load(out.read_text())["models"]["tinynet:make(seq=16)"]
    assert times["settings"]["ranks"] == 2 and times["batch_size"] == 2
    assert len(times["t_bwd"]) == len(model_table("tinynet:make(seq=16)")["tensors"]) and sum(times["t_bwd"]) > 0


def test_validate_keeps_the_measured_times_of_a_model_the_calibration_did_not_time():
    from simsparse.experiments.analysis.validate import _with_models

    calibrated = {"name": "local", "models": {"resnet20_cifar10": {"t_fwd": [1.0]}}}
    named = {"name": "mine", "models": {"resnet20_cifar10": {"t_fwd": [2.0]}, "hf:GPT2Config": {"t_fwd": [3.0]}}}
    got = _with_models(calibrated, named)
    assert got["models"] == {"resnet20_cifar10": {"t_fwd": [1.0]}, "hf:GPT2Config": {"t_fwd": [3.0]}}
    assert _with_models(calibrated, None) is calibrated and calibrated["models"] == {"resnet20_cifar10": {"t_fwd": [1.0]}}


def test_a_per_layer_csv_round_trips_and_a_missing_column_is_named(tmp_path, capsys):
    """model export writes a model's per-tensor times on a device as name, elements, forward_s,
    backward_s; a config naming that CSV runs the same iteration as the packaged model; a CSV
    without backward_s is refused with the file and the column."""
    import pandas as pd

    table = tmp_path / "r20.csv"
    code, err, _ = cli_run(["model", "export", "resnet20_cifar10", "--compute", "p100", "--batch-size", "32",
                            "-o", str(table)], capsys)
    assert code == 0, err
    assert list(pd.read_csv(table).columns) == ["name", "elements", "forward_s", "backward_s"]
    times = {}
    for model in (str(table), "resnet20_cifar10"):
        cfg = one_ring(tmp_path, f'{{name: "{model}", batch_size: 32}}', "iterations: 1\nwarmup: 0\ncheck: false\n")
        cfg.write_text(cfg.read_text().replace("compute: a100", "compute: p100"))
        code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / model.replace("/", "_")), "--no-plot"], capsys)
        assert code == 0, err
        times[model] = pd.read_csv(tmp_path / model.replace("/", "_") / "results.csv").iloc[0]["t_iter_s"]
    assert times[str(table)] == pytest.approx(times["resnet20_cifar10"], rel=1e-12)
    bad = tmp_path / "bad.csv"
    bad.write_text("name,elements,forward_s\nw,10,0.1\n")
    code, err, _ = cli_run(["run", str(one_ring(tmp_path, f'{{name: "{bad}", batch_size: 2}}')),
                            "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "no column backward_s" in err and str(bad) in err, err


def test_an_astrasim_workload_round_trips_through_a_per_layer_csv(tmp_path, capsys):
    """model export --format astrasim writes ASTRA-sim 1.0's data-parallel text (cycles, bytes);
    model import --format astrasim reads it back into the per-layer CSV: the same elements, and
    times within a cycle."""
    import pandas as pd

    work, back = tmp_path / "r20.txt", tmp_path / "r20.csv"
    assert main(["model", "export", "resnet20_cifar10", "--compute", "p100", "--batch-size", "32", "--format",
                 "astrasim", "-o", str(work)]) == 0
    lines = work.read_text().splitlines()
    assert lines[0] == "DATA" and int(lines[1]) == len(lines) - 2 and " ALLREDUCE " in lines[2]
    assert main(["model", "import", str(work), "--format", "astrasim", "-o", str(back)]) == 0
    direct = tmp_path / "direct.csv"
    assert main(["model", "export", "resnet20_cifar10", "--compute", "p100", "--batch-size", "32",
                 "-o", str(direct)]) == 0
    a, b = pd.read_csv(back), pd.read_csv(direct)
    assert list(a["elements"]) == list(b["elements"])
    assert (abs(a["forward_s"] - b["forward_s"]) <= 1e-9).all() and (abs(a["backward_s"] - b["backward_s"]) <= 1e-9).all()
    work.write_text("MODEL\n1\n")
    code, err, _ = cli_run(["model", "import", str(work), "--format", "astrasim", "-o", str(back)], capsys)
    assert code == 2 and "first line must be DATA" in err


def test_a_simai_workload_round_trips_and_other_parallelism_is_refused(tmp_path, capsys):
    """model export --format simai writes SimAI's header (data parallelism: every other group 1, all_gpus
    the ranks) over ASTRA-sim's layer lines; import reads it back as the per-layer CSV. A file with
    tensor parallelism is refused, naming the key: its communication is not simulated."""
    import pandas as pd

    work, back, direct = tmp_path / "r20.txt", tmp_path / "r20.csv", tmp_path / "direct.csv"
    code, err, _ = cli_run(["model", "export", "resnet20_cifar10", "--compute", "p100", "--format", "simai",
                            "-o", str(work)], capsys)
    assert code == 2 and "give --gpus" in err
    assert main(["model", "export", "resnet20_cifar10", "--compute", "p100", "--batch-size", "32", "--format",
                 "simai", "--gpus", "16", "-o", str(work)]) == 0
    head = work.read_text().splitlines()[0].split()
    assert head[0] == "HYBRID_TRANSFORMER_FWD_IN_BCKWD" and head[head.index("all_gpus:") + 1] == "16"
    assert main(["model", "import", str(work), "--format", "simai", "-o", str(back)]) == 0
    assert main(["model", "export", "resnet20_cifar10", "--compute", "p100", "--batch-size", "32",
                 "-o", str(direct)]) == 0
    a, b = pd.read_csv(back), pd.read_csv(direct)
    assert list(a["elements"]) == list(b["elements"]) and (abs(a["backward_s"] - b["backward_s"]) <= 1e-9).all()
    # as AICB lays a file out: tabs, a dependency of -1, a few fields of 1 cycle
    mine = tmp_path / "aicb.txt"
    mine.write_text("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 1 ep: 1 pp: 1 vpp: 8 ga: 1 "
                    "all_gpus: 8 checkpoints: 0 checkpoint_initiates: 0\n2\n"
                    "embedding_layer\t-1\t5000\tNONE\t0\t1\tNONE\t0\t7000\tALLREDUCE\t4000\t1\n"
                    "transformer_layer\t-1\t9000\tNONE\t0\t3000\tNONE\t0\t6000\tALLREDUCE\t8000\t1\n")
    assert main(["model", "import", str(mine), "--format", "simai", "-o", str(back)]) == 0
    rows = pd.read_csv(back)
    assert list(rows["elements"]) == [1000, 2000] and list(rows["backward_s"]) == pytest.approx([7001e-9, 9000e-9])
    mine.write_text(mine.read_text().replace("model_parallel_NPU_group: 1", "model_parallel_NPU_group: 8"))
    code, err, _ = cli_run(["model", "import", str(mine), "--format", "simai", "-o", str(back)], capsys)
    assert code == 2 and "model_parallel_NPU_group: 8; allowed: 1" in err and "tensor parallelism" in err, err


@pytest.mark.slow
def test_bf16_counts_autocasts_work_on_meta_as_autocast_does_on_the_cpu():
    """dtype='bf16': mixed precision. The FLOPs stay; the matrix ops read and write half the bytes
    (fp32 weights and gradients aside); the count on meta, where autocast does nothing, is within
    20 % of the same model counted on real CPU tensors under torch.autocast (whose op lists differ
    a little from CUDA's), per pass; the roofline runs it at the BF16 peak, and a device without
    one refuses it, naming the key."""
    pytest.importorskip("transformers")
    from simsparse.compute.devices import load_profile
    from simsparse.compute.models import model_profile
    from simsparse.models.costs import FIELDS, CostMode, count, fused_dropout

    spec = "hf:GPT2Config(n_layer=2, n_embd=128, n_head=2, seq=64{})"
    fp32, bf16 = model_table(spec.format("")), model_table(spec.format(", dtype='bf16'"))
    assert bf16["dtype"] == "bf16" and fp32["dtype"] == "fp32"
    assert bf16["fwd_gflops"] == fp32["fwd_gflops"] and bf16["bwd_gflops"] == fp32["bwd_gflops"]
    for pas in ("fwd", "bwd"):
        assert 0.4 < bf16[f"{pas}_mm_mbytes"] / fp32[f"{pas}_mm_mbytes"] < 0.65

    src = sources.resolve(canonical(spec.format(", dtype='bf16'")))
    torch.manual_seed(0)
    model = src.build()
    model.train()
    mode = CostMode(model)
    with fused_dropout(), mode:
        value = src.loss(model, src.batch(2, None, "cpu"))   # (the source's loss: under CPU autocast)
        mode.phase = "bwd"
        value.backward()
    mode.close()
    real = [sum(r[j] for r in mode.rows) for j in range(len(FIELDS))]
    meta = [sum(r[j] for r in rows) for j in range(len(FIELDS)) for rows in [count(src.build, src.batch, src.loss,
                                                                                     2, amp=True)[1]]]
    for f in ("fwd_bytes", "fwd_mm_bytes", "bwd_bytes", "bwd_mm_bytes"):
        j = FIELDS.index(f)
        assert meta[j] == pytest.approx(real[j], rel=0.2), f

    h100 = load_profile("h100")   # GPT-2's width: the matrix ops dominate, and run at 14.8x the FP32 peak
    wide = "hf:GPT2Config(n_layer=2, seq=1024{})"
    slow, fast = (model_profile(wide.format(d), 8, h100) for d in ("", ", dtype='bf16'"))
    assert fast.t_forward + fast.t_backward < 0.6 * (slow.t_forward + slow.t_backward)
    assert "bf16 peak 9.89e+14" in fast.source
    with pytest.raises(ValueError, match="no peak_bf16_flops"):
        model_profile(spec.format(", dtype='bf16'"), 8, load_profile("v100"))


@pytest.mark.parametrize("imported", [False, True])
def test_a_bf16_model_on_a_device_without_a_bf16_peak_is_refused_at_load(tmp_path, capsys, imported):
    """The spec, or the table model import wrote from it (the precision is the table's)."""
    pytest.importorskip("transformers")
    model = "hf:GPT2Config(n_layer=1, n_embd=64, n_head=2, seq=32, dtype='bf16')"
    if imported:
        out = tmp_path / "gpt2_bf16.json"
        assert cli_run(["model", "import", model, "-o", str(out)], capsys)[0] == 0
        model = str(out)
    cfg = one_ring(tmp_path, f'{{name: "{model}"}}')
    cfg.write_text(cfg.read_text().replace("compute: a100", "compute: v100"))
    code, err, _ = cli_run(["run", str(cfg), "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "no peak_bf16_flops" in err and "dtype='fp32'" in err and "Traceback" not in err, err
