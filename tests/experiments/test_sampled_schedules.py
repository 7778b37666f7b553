"""Sampled gradients in training iterations (evaluation: sampled under a
schedule): each bucket of the plan is drawn as a vector of its own, with
the floor of its own k (simsparse.sampling.SampledModel)."""
import dataclasses

import numpy as np
import pytest

from simsparse.compute.kernels import concat
from simsparse.compute.sampled import Sampled, SampledPart
from simsparse.experiments.run.runner import simulate_point
from simsparse.sampling import SampledModel, sampled_gradient
from simsparse.workload import Workload

from tests.experiments.test_sampled import _close
from tests.helpers import schedule_point


@pytest.mark.parametrize("schedule,algorithm,drift", [("topk_sgd", "topka", 1.0), ("mgs_sgd", "oktopk", 1.0),
                                                      ("lags_sgd", "gaussiank", 1.0), ("mgs_sgd", "gtopk", 1.0),
                                                      ("mgs_sgd", "topkdsa", 0.3), ("topk_sgd", "oktopk", 0.3)])
@pytest.mark.slow
def test_training_iterations_match_full_runs_in_distribution(schedule, algorithm, drift):
    """Times and bytes of sampled training iterations against full-value
    ones over seeds (ResNet-20's 59 tensors in one bucket, in buckets of at
    least 8,192 elements, or one bucket each); the last with error feedback
    per bucket and drifting gradients (each bucket's paths; Ok-Topk's reused
    thresholds then reach below the floors: run again, widened)."""
    full, samp, widened = [], [], []
    params = {"error_feedback": drift < 1, **({"tau": 2, "tau_prime": 2} if algorithm == "oktopk" else {})}
    for seed in range(6):
        p = schedule_point(schedule, algorithm, P=4, params=params, density=0.02)
        p = dataclasses.replace(p, workload={**p.workload, "seed": seed, "drift": drift})
        f, s = simulate_point(p).row, simulate_point(dataclasses.replace(p, evaluation="sampled")).row
        assert f["values"] == "full" and s["values"] == "sampled" and s["correct"] is None
        full.append((f["time_s"], f["bytes_total"]))
        samp.append((s["time_s"], s["bytes_total"]))
        widened.append(s["sampled_widen"] != "")
    full, samp = np.array(full), np.array(samp)
    assert _close(full[:, 0], samp[:, 0]) and _close(full[:, 1], samp[:, 1]), (full, samp)
    assert np.allclose(full.mean(0), samp.mean(0), rtol=0.03)
    assert all(widened) if (algorithm, drift) == ("oktopk", 0.3) else not any(widened)


def _model():
    sizes = (3000, 40, 9000, 500, 6000)
    return Workload(n=sum(sizes), density=0.01, layers=sizes, layer_spread=2.0), sizes


def test_each_bucket_carries_about_margin_times_its_own_k():
    """A bucket of small-scale tensors still carries its own top-k (a floor
    set for the whole vector would leave it too few entries)."""
    w, sizes = _model()
    buckets = [(3, 5), (2, 3), (0, 2)]   # backward order: tensors 3-4, then 2, then 0-1
    offs = np.concatenate([[0], np.cumsum(sizes)])
    for rank in range(3):
        m = SampledModel(w, rank, 0, buckets, lambda k: 4.0)
        whole = m[offs[2]:offs[3]]
        assert type(whole) is Sampled and len(whole) == sizes[2]
        parts = [m[offs[i]:offs[i + 1]] for i in (3, 4)]
        assert all(type(p) is SampledPart for p in parts)
        b = concat.numpy(parts)
        assert len(b) == sizes[3] + sizes[4]
        for v, n in ((whole, sizes[2]), (b, sizes[3] + sizes[4])):
            k = round(0.01 * n)
            assert 2 * k < len(v.values) < 8 * k and len(v.values) <= n
            assert np.all(np.diff(v.indices) > 0) and v.indices.max() < n
            assert len(v.topk(k).indices) == k
        small = concat.numpy([m[offs[0]:offs[1]], m[offs[1]:offs[2]]])
        assert len(small) == sizes[0] + sizes[1]


def test_a_bucket_is_drawn_like_the_same_layers_alone():
    """A span's draw is the distribution of those layers' entries: the
    count above a magnitude over many draws matches the full gradient's
    entries in that span."""
    w, sizes = _model()
    a, b = sizes[0] + sizes[1], sum(sizes[:3])
    spans = [sampled_gradient(w, r, t, 4.0, (2, 3)) for r in range(4) for t in range(30)]
    thr = 1.2 * max(s.floor for s in spans)
    full = [np.count_nonzero(np.abs(w.grad(r, t)[a:b]) >= thr) for r in range(4) for t in range(30)]
    assert _close(full, [s.count_above(thr) for s in spans])


def test_a_concat_that_is_not_one_bucket_of_the_plan_is_refused():
    w, sizes = _model()
    offs = np.concatenate([[0], np.cumsum(sizes)])
    m = SampledModel(w, 0, 0, [(3, 5), (0, 3)], lambda k: 4.0)
    parts = [m[offs[i]:offs[i + 1]] for i in (0, 1)]   # two of the bucket's three tensors
    with pytest.raises(ValueError, match="not one bucket of the plan"):
        concat.numpy(parts)
