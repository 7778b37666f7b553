"""Kernels dispatch on their vector's type (``Kernel.on``): a sampled
gradient's kernels are registered beside its type, and algorithms state
what they need of one in a ``Sampling``."""
import dataclasses
import inspect
import math

import numpy as np
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.algorithms.base import Sampling
from simsparse.compression.gaussian import mean_std
from simsparse.compute.kernels import Kernel, get_kernel
from simsparse.compute.sampled import Sampled, SampledPart
from simsparse.sampling import sampled_gradient
from simsparse.workload import Workload


def _kernel():
    def plain(x, y=None, scale: float = 1.0):
        return "plain"

    return Kernel("probe", plain, work=lambda out, *a, **kw: None), plain


def test_a_kernel_without_types_of_its_own_keeps_its_plain_function():
    k, plain = _kernel()
    assert k.numpy is plain and k.torch_fn is plain
    kth = get_kernel("kth_abs")
    assert not kth.by_type and not hasattr(kth.numpy, "__wrapped__")


def test_a_kernel_dispatches_on_its_first_vector_a_lists_first_element_or_its_second():
    k, plain = _kernel()

    class Vec:
        pass

    @k.on(Vec)
    def _vec(x, y=None, scale=1.0):
        return "vec"

    v = Vec()
    assert k.numpy(v) == k.numpy([v, 1]) == k.numpy((v,)) == k.numpy(np.zeros(2), v) == "vec"
    assert k.numpy(np.zeros(2)) == k.numpy([]) == k.numpy([np.zeros(2), v]) == k.numpy(1, 2, scale=3) == "plain"
    assert k.numpy(v, scale=2.0) == "vec" and k.torch_fn is plain
    assert inspect.signature(k.numpy) == inspect.signature(plain)   # (what the memo binds arguments by)


def test_the_sampled_kernels_are_registered_beside_their_types():
    for name in ("add", "topk", "count_above", "threshold_select", "gather_at", "zero_at", "mean_std"):
        assert Sampled in get_kernel(name).by_type, name
    assert SampledPart in get_kernel("concat").by_type
    g = sampled_gradient(Workload(n=20000, density=0.01), 0, 0, 4.0)
    assert mean_std.numpy(g) == g.moments
    top = get_kernel("topk").numpy(g, 200)
    assert np.array_equal(top.indices, g.topk(200).indices)
    assert get_kernel("count_above").numpy(g, g.floor) == g.count_above(g.floor)


def test_an_algorithm_states_its_sampling_needs_in_one_object():
    """None for one that reads every value; an exact top-k draws k plus
    eight standard deviations; Ok-Topk its own margin, and learns its floors
    under error feedback with reused thresholds."""
    assert ALGORITHMS["deft"].sampling is None and ALGORITHMS["ring"].sampling is None
    assert Sampling().margin_for(2000) == 4.0 and Sampling(margin=2.0).margin_for(10) == 2.0
    assert ALGORITHMS["topka"].sampling.margin_for(2000) == 1 + 8 / math.sqrt(2000)
    assert ALGORITHMS["gaussiank"].sampling == Sampling(result="dense")
    assert ALGORITHMS["dsar_split_allgather"].sampling.result == "dense_per_rank"
    ok = ALGORITHMS["oktopk"]
    assert ok.sampling.margin_for(2000) == 4 / 3 + 8 / math.sqrt(2000) and ok.sampling.result == "dense"
    assert ok.sampling.floors_learnt(ok.Params(error_feedback=True))
    assert not ok.sampling.floors_learnt(ok.Params(error_feedback=True, threshold_reuse=False))
    assert not ALGORITHMS["topka"].sampling.floors_learnt(ALGORITHMS["topka"].Params(error_feedback=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ok.sampling.margin = 4.0
