"""Ok-Topk's threshold machinery: the distributed radix select of the exact
global threshold, the drift correction, and its kernels (numpy vs torch)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.algorithms.oktopk_select import as_dtype, radix_select, rescale
from simsparse.backends.events.sim import Simulator
from simsparse.compute.kernels import get_kernel
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.ops import COO

from tests.helpers import requires_torch


def run_select(parts, k, dtype, bits):
    sim = Simulator(AlphaBetaNetwork(1e-6, 1e9))
    stats = sim.run([lambda ctx, v=v: radix_select(ctx, v, k, dtype, bits, tag=1) for v in parts])
    return stats.results


def values(rng, m, dtype, ties):
    if ties:  # few distinct magnitudes, zeros, both signs
        return (rng.integers(-3, 4, size=m) * 0.25).astype(dtype)
    return (rng.standard_normal(m) * 10.0 ** rng.integers(-3, 3)).astype(dtype)


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 7), m=st.integers(0, 60), k=st.integers(1, 100), bits=st.integers(1, 16),
       dtype=st.sampled_from(["float32", "float64"]), ties=st.booleans(), seed=st.integers(0, 10**6))
def test_radix_select_finds_the_exact_kth_largest_magnitude(P, m, k, bits, dtype, ties, seed):
    rng = np.random.default_rng(seed)
    parts = [values(rng, int(rng.integers(0, m + 1)), dtype, ties) for _ in range(P)]
    allv = np.abs(np.concatenate(parts))
    got = run_select(parts, k, dtype, bits)
    assert len(set(got)) == 1  # every rank agrees
    if len(allv) == 0:
        assert got[0] == 0.0
    else:
        want = float(np.sort(allv)[::-1][min(k, len(allv)) - 1])
        assert got[0] == want
        assert np.count_nonzero(allv >= got[0]) >= min(k, len(allv))


def test_rescale_follows_the_code_triggers():
    k = 300
    assert rescale(1.0, 100, k, 2 / 3, 4 / 3, 1.008, 1.01) == pytest.approx(1 / 1.008)  # too few: lower
    assert rescale(1.0, 500, k, 2 / 3, 4 / 3, 1.008, 1.01) == pytest.approx(1.01)       # too many: raise
    assert rescale(1.0, 300, k, 2 / 3, 4 / 3, 1.008, 1.01) == 1.0
    assert as_dtype(0.1, "float32") == float(np.float32(0.1))


@requires_torch
@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 300), lo=st.integers(0, 30), w=st.integers(1, 8), seed=st.integers(0, 10**6),
       dtype=st.sampled_from(["float32", "float64"]))
def test_histogram_kernel_torch_equals_numpy(m, lo, w, seed, dtype):
    import torch

    hi = min(lo + w, 31)
    lo = min(lo, hi - 1)
    v = np.random.default_rng(seed).standard_normal(m).astype(dtype)
    prefix = int(np.abs(v[:1]).view(np.int32 if dtype == "float32" else np.int64)[0]) if m else 0
    k = get_kernel("abs_bits_histogram")
    a = k.numpy(v, prefix, lo, hi)
    b = k.torch_fn(torch.from_numpy(v), prefix, lo, hi)
    np.testing.assert_array_equal(a, b)
    assert len(a) == 1 << (hi - lo)


@requires_torch
def test_region_scatter_add_torch_equals_numpy():
    import torch

    rng = np.random.default_rng(0)
    n, lo, hi = 1000, 200, 700
    parts = []
    for _ in range(4):
        idx = np.sort(rng.choice(np.arange(lo, hi), 60, replace=False)).astype(np.int32)
        parts.append(COO(idx, rng.standard_normal(60).astype(np.float32), n))
    k = get_kernel("scatter_add_region")
    a = k.numpy(np.zeros(hi - lo, np.float32), parts, lo)
    tparts = [COO(torch.from_numpy(p.indices), torch.from_numpy(p.values), n) for p in parts]
    b = k.torch_fn(torch.zeros(hi - lo), tparts, lo)
    np.testing.assert_allclose(a, b.numpy(), rtol=1e-6)
    want = np.zeros(n)
    for p in parts:
        want[p.indices] += p.values
    np.testing.assert_allclose(a, want[lo:hi], rtol=1e-6)
