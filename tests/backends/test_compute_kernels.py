"""Kernels: numpy implementations against plain numpy, torch against numpy."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.compute.devices import IdealDevice, ParametricDevice, load_profile
from simsparse.compute.kernels import KERNELS, Work, get_kernel
from simsparse.ops import COO

from tests.helpers import requires_torch


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 300), st.floats(0.001, 1.0), st.integers(0, 2**31 - 1))
def test_topk_selects_the_largest_magnitudes(n, frac, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    k = max(1, int(frac * n))
    sel = get_kernel("topk").numpy(x, k)
    assert sel.nnz == k and sel.n == n
    assert np.all(np.diff(sel.indices) > 0)
    np.testing.assert_array_equal(sel.values, x[sel.indices])
    rest = np.delete(np.abs(x), sel.indices)
    if rest.size:
        assert np.abs(sel.values).min() >= rest.max()


def test_scatter_add_sums_sparse_parts():
    like = np.zeros(1, np.float32)
    a = COO(np.array([0, 3], np.int32), np.array([1, 2], np.float32), 5)
    b = COO(np.array([3, 4], np.int32), np.array([10, 20], np.float32), 5)
    out = get_kernel("scatter_add").numpy([a, b], 5, like=like)
    np.testing.assert_array_equal(out, [1, 0, 0, 12, 20])


def test_in_place_kernels_write_through_views():
    buf = np.arange(6, dtype=np.float32)
    get_kernel("add_into").numpy(buf[2:4], np.ones(2, np.float32))
    get_kernel("copy_into").numpy(buf[4:], np.zeros(2, np.float32))
    np.testing.assert_array_equal(buf, [0, 1, 3, 4, 0, 0])


def test_device_models():
    assert IdealDevice().cost("topk", Work(1e6, 4e6)) == 0
    p100 = ParametricDevice(load_profile("p100"))
    # memory-bound default: launch + bytes / bandwidth
    assert p100.cost("add", Work(1e6, 12e6)) == pytest.approx(5e-6 + 12e6 / 7.32e11)
    # top-k override: s * d * log2 d, 2M floats ~ 25.6 ms (the cited measurement)
    assert p100.cost("topk", Work(2e6, 8e6)) == pytest.approx(25.6e-3, rel=0.01)


@requires_torch
@pytest.mark.parametrize("name", ["add", "copy", "concat", "zeros", "topk", "scatter_add", "add_into", "copy_into"])
def test_torch_kernels_match_numpy(name):
    import torch

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(257).astype(np.float32), rng.standard_normal(257).astype(np.float32)
    T = torch.from_numpy
    coo = COO(np.array([1, 7, 9], np.int32), np.array([1.0, -2.0, 3.0], np.float32), 257)
    tcoo = coo.map(T)
    cases = {
        "add": ((x, y), (T(x), T(y))),
        "copy": ((x,), (T(x),)),
        "concat": (([x, y],), ([T(x), T(y)],)),
        "zeros": ((5, x), (5, T(x))),
        "topk": ((x, 20), (T(x), 20)),
        "scatter_add": (([coo, coo], 257, x), ([tcoo, tcoo], 257, T(x))),
        "add_into": ((x.copy(), y), (T(x.copy()), T(y))),
        "copy_into": ((x.copy(), y), (T(x.copy()), T(y))),
    }
    k = KERNELS[name]
    a, b = cases[name]
    ref, got = k.numpy(*a), k.torch_fn(*b)
    if isinstance(ref, COO):
        np.testing.assert_array_equal(ref.indices, got.indices.numpy())
        np.testing.assert_allclose(ref.values, got.values.numpy())
    else:
        np.testing.assert_allclose(ref, got.numpy(), rtol=1e-6)


def test_concat_of_adjacent_read_only_views_is_their_view_and_a_copy_otherwise():
    """A schedule's bucket of one flat gradient's tensors needs no second copy (the work charged is the same)."""
    from simsparse.compute.kernels import KERNELS

    cat = KERNELS["concat"].numpy
    g = np.arange(12, dtype=np.float32)
    g.setflags(write=False)
    parts = [g[0:3], g[3:8], g[8:12]]
    v = cat(parts)
    np.testing.assert_array_equal(v, np.concatenate(parts))
    assert np.shares_memory(v, g) and not v.flags.writeable
    assert KERNELS["concat"].work(v, parts) == KERNELS["concat"].work(np.concatenate(parts), parts)
    for other in ([g[3:8], g[0:3]], [g[0:3], g[4:8]], [g[0:3], g[3:8].astype(np.float64)]):  # order, gap, dtype
        out = cat(other)
        np.testing.assert_array_equal(out, np.concatenate(other))
        assert not np.shares_memory(out, g)
    w = np.arange(12, dtype=np.float32)                                  # writeable: a copy
    assert not np.shares_memory(cat([w[0:3], w[3:12]]), w)
