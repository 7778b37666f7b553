"""FFT sparsification (Wang et al. HPDC'20): range-based N-bit floats against a direct
enumeration of the format, bit packing, the bitmap payload, numpy == torch, the benefit model."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from simsparse.compression import fft, rangequant as rq
from simsparse.compute.kernels import get_kernel

from tests.helpers import requires_torch

SPARSIFY, TUNE, PACK, UNPACK = (get_kernel(k) for k in ("fft_sparsify", "rq_tune", "fft_pack", "fft_unpack_sum"))


def representable(bits, m, B):
    """Every magnitude of the format, by code: 0, then eps = value(B), value(B+1), ..."""
    pats = np.arange(B, B + rq.max_code(bits), dtype=np.int64) << (23 - m)
    return np.concatenate([[0.0], pats.astype(np.int32).view(np.float32).astype(np.float64)])


def nearest_code(x, vals):
    """Index of the nearest representable magnitude (ties to the larger), by search."""
    a = np.abs(x.astype(np.float32).astype(np.float64))
    hi = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo = hi - 1
    return np.where(a - vals[lo] < vals[hi] - a, lo, hi)


formats = st.integers(2, 12).flatmap(
    lambda bits: st.tuples(st.just(bits), st.integers(0, min(23, bits - 1)),
                           st.floats(1e-6, 1e6, allow_nan=False)))


@settings(max_examples=60, deadline=None)
@given(formats, st.integers(0, 10**6))
def test_range_quantizer_is_nearest_representable_number(fmt, seed):
    bits, m, R = fmt
    assume(m in rq.mantissas(bits))
    B = rq.tune_base(R, m, bits)
    top = rq.top_value(B, m, bits)
    # the paper's eps loop ends where the largest number just reaches R
    assert top >= R * (1 - 1e-7) and (B == 1 << m or rq.top_value(B - 1, m, bits) < R)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(500) * R / 3 * np.exp(rng.uniform(-5, 0, 500))).astype(np.float32)
    x[:3] = [0.0, R, -2 * R]
    vals = representable(bits, m, B)
    codes = rq.encode(x, bits, m, B)
    assert codes.min() >= 0 and codes.max() < 1 << bits
    want = nearest_code(x, vals)
    np.testing.assert_array_equal(codes & rq.max_code(bits), want)
    y = rq.decode(codes, bits, m, B)
    np.testing.assert_array_equal(np.abs(y), vals[want].astype(np.float32))
    assert np.all(np.sign(y) * np.sign(x) >= 0)
    inside = np.abs(x) <= top
    eps = vals[1]
    bound = np.maximum(2.0 ** -(m + 1) * np.abs(x.astype(np.float64)), eps / 2) * (1 + 1e-6)
    assert np.all(np.abs(y - x)[inside] <= bound[inside])
    assert np.all(np.abs(y[~inside]) == np.float32(top))  # saturation


@settings(max_examples=20, deadline=None)
@given(st.integers(3, 12), st.integers(0, 10**6))
def test_tuning_picks_the_mantissa_with_least_error(bits, seed):
    v = np.random.default_rng(seed).standard_normal(300).astype(np.float32) * 0.01
    m, B = TUNE.numpy(v, bits)
    R = float(np.abs(v).max())
    assert B == rq.tune_base(R, m, bits)
    err = {mm: np.sum((rq.decode(rq.encode(v, bits, mm, rq.tune_base(R, mm, bits)), bits, mm,
                                 rq.tune_base(R, mm, bits)) - v.astype(np.float64)) ** 2) for mm in rq.mantissas(bits)}
    assert err[m] <= min(err.values()) * (1 + 1e-8)
    assert rq.top_value(B, m, bits) >= R  # no value of the tuning data saturates


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(0, 300), st.integers(0, 10**6))
def test_bit_packing_roundtrip_and_size(bits, count, seed):
    codes = np.random.default_rng(seed).integers(0, 1 << bits, count)
    packed = rq.pack_bits(codes, bits)
    assert packed.dtype == np.uint8 and len(packed) == rq.packed_bytes(count, bits) == math.ceil(count * bits / 8)
    np.testing.assert_array_equal(rq.unpack_bits(packed, count, bits), codes)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.floats(0, 0.99), st.integers(2, 16), st.integers(0, 10**6))
def test_payload_size_and_kept_frequencies(n, theta, bits, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    K = fft.keep_count(n, theta)
    spec = SPARSIFY.numpy(x, K, fp16=False)
    L = fft.fft_len(n)  # the transform length: n zero-padded to the next 5-smooth length
    assert n <= L <= max(n, 1) * 1.25 and all(L % p for p in (7, 11, 13)) or L == n
    F = L // 2 + 1
    assert spec.n == F and spec.nnz == K == max(1, min(F, round((1 - theta) * F)))
    mag = np.abs(np.fft.rfft(x.astype(np.float64), n=L, norm="ortho"))
    assume(K == F or np.sort(mag)[::-1][K - 1] > np.sort(mag)[::-1][K] * (1 + 1e-12))  # no tie at the cut
    assert set(spec.indices.tolist()) == set(np.argsort(-mag)[:K].tolist())  # the K largest magnitudes
    m, B = TUNE.numpy(spec.values, bits)
    p = PACK.numpy(spec, n, bits, m, B)
    assert p.nbytes == fft.wire_bytes(n, theta, bits) == math.ceil(F / 8) + math.ceil(2 * K * bits / 8) + 8
    bitmap = np.unpackbits(p.bitmap, count=F, bitorder="little")
    np.testing.assert_array_equal(np.flatnonzero(bitmap), spec.indices)


def test_decompression_sums_the_round_trips():
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(777).astype(np.float32) * s for s in (1, 0.01, 30)]
    pays, refs = [], []
    for x in xs:
        spec = SPARSIFY.numpy(x, fft.keep_count(777, 0.8))
        m, B = TUNE.numpy(spec.values, 9)
        pays.append(PACK.numpy(spec, 777, 9, m, B))
        refs.append(fft.roundtrip(x, 0.8, 9, m, B))
    out = UNPACK.numpy(pays, 777, xs[0])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, sum(refs), rtol=1e-5, atol=1e-6 * np.abs(sum(refs)).max())


def relerr(y, x):
    return np.linalg.norm(y - x) / np.linalg.norm(x)


def test_fidelity():
    n = 4096
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)

    def rt(x, theta, bits, fp16):
        spec = SPARSIFY.numpy(x, fft.keep_count(n, theta), fp16=fp16)
        fmt = TUNE.numpy(spec.values, bits)
        return UNPACK.numpy([PACK.numpy(spec, n, bits, *fmt)], n, x)

    assert relerr(rt(x, 0.0, 16, False), x) < 2e-3        # everything kept, 16 bits: near lossless
    assert relerr(rt(x, 0.0, 16, True), x) < 3e-3         # + float16 rounding (2^-11)
    assert relerr(rt(x, 0.0, 6, False), x) > relerr(rt(x, 0.0, 10, False), x)  # fewer bits, more error
    # white noise spreads its energy over all frequencies: dropping 85 % loses ~sqrt of the dropped energy
    assert 0.6 < relerr(rt(x, 0.85, 16, False), x) < 0.85
    t = np.arange(n)
    smooth = (np.sin(2 * np.pi * 5 * t / n) + 0.3 * np.cos(2 * np.pi * 40 * t / n)).astype(np.float32)
    assert relerr(rt(smooth, 0.99, 10, False), smooth) < 0.01  # a smooth signal survives 99 % sparsity


@requires_torch
@pytest.mark.parametrize("n,theta,bits", [(1000, 0.85, 10), (999, 0.5, 7), (64, 0.0, 16)])
def test_torch_matches_numpy(n, theta, bits):
    import torch

    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    xt = torch.from_numpy(x)
    K = fft.keep_count(n, theta)
    a, b = SPARSIFY.numpy(x, K), SPARSIFY.torch_fn(xt, K)
    np.testing.assert_array_equal(a.indices, b.indices.numpy())
    np.testing.assert_allclose(a.values, b.values.numpy(), rtol=1e-12, atol=1e-12)
    fmt = TUNE.numpy(a.values, bits)
    assert TUNE.torch_fn(b.values, bits) == fmt
    pa, pb = PACK.numpy(a, n, bits, *fmt), PACK.torch_fn(b, n, bits, *fmt)
    for u, v in zip(pa.arrays(), pb.arrays()):
        np.testing.assert_array_equal(u, v.numpy())
    np.testing.assert_allclose(UNPACK.numpy([pa, pa], n, x), UNPACK.torch_fn([pb, pb], n, xt).numpy(),
                               rtol=1e-6, atol=1e-7)
    codes = rq.encode(a.values.view(np.float64), bits, *fmt)
    np.testing.assert_array_equal(codes, rq._encode_torch(torch.from_numpy(a.values.view(np.float64)), bits, *fmt))
    np.testing.assert_array_equal(rq.decode(codes, bits, *fmt), rq._decode_torch(torch.from_numpy(codes), bits, *fmt))
    for nb in (1, 3, 10, 16):
        c = np.random.default_rng(nb).integers(0, 1 << nb, 77)
        np.testing.assert_array_equal(rq.pack_bits(c, nb), rq.pack_bits_torch(torch.from_numpy(c), nb).numpy())
        np.testing.assert_array_equal(rq.unpack_bits_torch(torch.from_numpy(rq.pack_bits(c, nb)), 77, nb).numpy(), c)


thr = st.floats(1e7, 1e12)


@settings(max_examples=60, deadline=None)
@given(thr, thr, thr, thr, thr, st.floats(1.01, 4.0), st.floats(1.01, 1000))
def test_benefit_model_is_monotone(conv, fftt, pack, topk, net, faster, ratio):
    t = fft.Throughputs(conv, fftt, pack, topk, net)
    r = fft.min_compression_ratio(t)
    assert r > 1
    # a faster network needs a higher ratio; faster compression primitives a lower one
    assert fft.min_compression_ratio(fft.Throughputs(conv, fftt, pack, topk, net * faster)) >= r
    for field in ("conv", "fft", "pack", "topk"):
        quicker = fft.Throughputs(**{**t.__dict__, field: getattr(t, field) * faster})
        assert fft.min_compression_ratio(quicker) <= r
    # compression pays exactly above the minimal ratio, and pays more the higher the ratio
    if math.isfinite(r) and abs(ratio / r - 1) > 1e-9:
        assert (fft.compression_saving_s(1e8, ratio, t) > 0) == (ratio > r)
    assert fft.compression_saving_s(1e8, ratio * faster, t) > fft.compression_saving_s(1e8, ratio, t)


def test_benefit_model_ethernet_vs_infiniband():
    gpu = dict(conv=1.0e11, fft=1.0e11, pack=3.4e10, topk=5.0e10)  # P100-class; packing 34 GB/s (section 3.2)
    eth = fft.min_compression_ratio(fft.Throughputs(**gpu, net=10e9 / 8))
    ib = fft.min_compression_ratio(fft.Throughputs(**gpu, net=56e9 / 8))
    assert 1 < eth < 1.5 < ib  # Fig. 10's shape: a small ratio pays on 10GbE, FDR InfiniBand needs more


def test_float16_overflow_is_an_error():
    x = np.ones(100, np.float32)
    x[3] = 1e5
    with pytest.raises(ValueError, match="fp16: false"):
        SPARSIFY.numpy(x, 10, fp16=True)
    assert SPARSIFY.numpy(x, 10, fp16=False).nnz == 10

