"""QSGD: size on the wire, error bound, unbiasedness, numpy == torch bit for bit."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.compression.qsgd import levels, wire_bytes
from simsparse.compression.rng import uniform_np
from simsparse.compute.kernels import get_kernel

from tests.helpers import requires_torch

Q, DQ = get_kernel("qsgd_quantize"), get_kernel("qsgd_dequantize")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([2, 4, 8]), st.sampled_from([1, 7, 64, 512, 1024]), st.integers(0, 10**6))
def test_size_and_error_bound(n, bits, bucket, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    q = Q.numpy(x, bits, bucket, seed)
    assert q.nbytes == wire_bytes(n, bits, bucket)
    y = DQ.numpy(q, x)
    nb = -(-n // bucket)
    scale = np.repeat(q.scales, bucket)[:n]
    assert np.all(np.abs(y - x) <= scale / levels(bits) * (1 + 1e-5) + 1e-12)
    assert np.all(np.sign(y) * np.sign(x) >= 0)
    assert len(q.scales) == nb


def test_unbiased():
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    mean = np.mean([DQ.numpy(Q.numpy(x, 2, 64, s), x) for s in range(3000)], axis=0)
    assert np.max(np.abs(mean - x)) < 0.12  # 2 bits: s = 1 level, so the variance is large
    assert abs(float(np.mean(mean - x))) < 0.01


def test_uniforms_look_uniform():
    u = uniform_np(123, 200000)
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005
    hist, _ = np.histogram(u, bins=10, range=(0, 1))
    assert hist.min() > 0.97 * 20000


@requires_torch
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_torch_is_bit_identical(bits):
    import torch

    x = np.random.default_rng(bits).standard_normal(1000).astype(np.float32)
    a = Q.numpy(x, bits, 128, 77)
    b = Q.torch_fn(torch.from_numpy(x), bits, 128, 77)
    np.testing.assert_array_equal(a.codes, b.codes.numpy())
    np.testing.assert_array_equal(a.scales, b.scales.numpy())
    np.testing.assert_array_equal(DQ.numpy(a, x), DQ.torch_fn(b, torch.from_numpy(x)).numpy())
