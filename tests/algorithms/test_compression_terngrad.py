"""TernGrad (Wen et al. NIPS'17): ternary values, size on the wire, unbiasedness, clipping, numpy == torch."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.compression.terngrad import wire_bytes
from simsparse.compute.kernels import get_kernel

from tests.helpers import requires_torch

Q, DQ = get_kernel("terngrad_quantize"), get_kernel("terngrad_dequantize")


def segments(rng, n):
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, rng.integers(0, 5)), replace=False)) if n > 1 else []
    return tuple(int(s) for s in np.diff(np.concatenate([[0], cuts, [n]])))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2000), st.integers(0, 10**6))
def test_values_are_ternary_per_segment(n, seed):
    rng = np.random.default_rng(seed)
    sizes = segments(rng, n)
    x = (rng.standard_normal(n) * np.repeat(10.0 ** rng.uniform(-3, 1, len(sizes)), sizes)).astype(np.float32)
    t = Q.numpy(x, sizes, seed)
    assert t.nbytes == wire_bytes(n, len(sizes)) == -(-n // 4) + 4 * len(sizes)
    y = DQ.numpy(t, sizes, x)
    starts = np.cumsum((0,) + sizes[:-1])
    for a, s, scale in zip(starts, sizes, t.scales):
        seg, out = x[a:a + s], y[a:a + s]
        assert scale == np.abs(seg).max()  # s_t = ||g||_inf of the layer
        assert set(np.unique(out)) <= {-scale, 0.0, scale}
        assert np.all(out * seg >= 0)  # the sign is kept or the entry dropped
        assert np.all(np.abs(out - seg) <= scale)


def test_unbiased_and_variance():
    x = np.random.default_rng(0).standard_normal(300).astype(np.float32)
    ys = np.array([DQ.numpy(Q.numpy(x, (100, 200), s), (100, 200), x) for s in range(4000)], dtype=np.float64)
    scale = np.repeat([np.abs(x[:100]).max(), np.abs(x[100:]).max()], [100, 200])
    se = np.sqrt(np.abs(x) * (scale - np.abs(x)) / len(ys)) + 1e-9  # Bernoulli(|x|/s) times s
    z = (ys.mean(axis=0) - x) / se
    assert np.abs(z).max() < 5 and abs(z.mean()) < 0.3
    assert ys.var(axis=0).sum() == pytest.approx(np.sum(np.abs(x) * (scale - np.abs(x))), rel=0.03)


def test_clipping_limits_the_scale():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    x[7] = 50.0  # an outlier
    plain, clipped = Q.numpy(x, (1000,), 3), Q.numpy(x, (1000,), 3, clip=2.5)
    assert plain.scales[0] == 50.0
    assert clipped.scales[0] == pytest.approx(2.5 * np.std(x, dtype=np.float64), rel=1e-6)


@requires_torch
@pytest.mark.parametrize("clip", [None, 2.5])
def test_torch_is_bit_identical(clip):
    import torch

    x = np.random.default_rng(5).standard_normal(1001).astype(np.float32)
    sizes = (1, 500, 500)
    a, b = Q.numpy(x, sizes, 99, clip), Q.torch_fn(torch.from_numpy(x), sizes, 99, clip)
    np.testing.assert_array_equal(a.codes, b.codes.numpy())
    np.testing.assert_array_equal(a.scales, b.scales.numpy())
    np.testing.assert_array_equal(DQ.numpy(a, sizes, x), DQ.torch_fn(b, sizes, torch.from_numpy(x)).numpy())
