"""Sparse streams (SparCML section 5.1): sums and splits against dense numpy,
the dense switch at nnz (idx + val) >= size * val, torch against numpy."""
import numpy as np
from hypothesis import given, settings, strategies as st

from simsparse.algorithms.streams import DenseRange, goes_dense
from simsparse.backends.real import wire
from simsparse.compute.kernels import get_kernel
from simsparse.ops import COO, Bundle

from tests.helpers import requires_torch

ADD, SPLIT, DENSE, RESP = (get_kernel(k) for k in ("stream_add", "stream_split", "stream_dense", "stream_resparsify"))


def rand_stream(rng, n, lo, hi, nnz, dense, pool=None):
    """A stream over [lo, hi): ``nnz`` random coordinates (from ``pool`` if given)."""
    cand = np.arange(lo, hi) if pool is None else pool
    idx = np.sort(rng.choice(cand, size=min(nnz, len(cand)), replace=False)).astype(np.int32)
    val = rng.standard_normal(len(idx)).astype(np.float32)
    if dense:
        out = np.zeros(hi - lo, np.float32)
        out[idx - lo] = val
        return DenseRange(out, lo, n)
    return COO(idx, val, n)


def to_np(s, n):
    out = np.zeros(n)
    if isinstance(s, DenseRange):
        out[s.offset:s.offset + len(s.values)] = s.values
    else:
        out[s.indices] = s.values
    return out


def streams(draw_ints, seed, disjoint):
    n, lo, span, na, nb, kinds = draw_ints
    rng = np.random.default_rng(seed)
    lo = min(lo, n - 1)
    hi = min(n, lo + span)
    if disjoint:
        cut = lo + (hi - lo) // 2
        a = rand_stream(rng, n, lo, hi, na, kinds & 1, pool=np.arange(lo, cut))
        b = rand_stream(rng, n, lo, hi, nb, kinds & 2, pool=np.arange(cut, hi))
    else:
        a = rand_stream(rng, n, lo, hi, na, kinds & 1)
        b = rand_stream(rng, n, lo, hi, nb, kinds & 2)
    return n, lo, hi, a, b


ints = st.tuples(st.integers(1, 300), st.integers(0, 300), st.integers(1, 300), st.integers(0, 300),
                 st.integers(0, 300), st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(ints, st.integers(0, 10**6), st.booleans(), st.booleans())
def test_stream_add_is_the_sum_and_switches_to_dense(params, seed, disjoint, inplace):
    n, lo, hi, a, b = streams(params, seed, disjoint)
    expect = to_np(a, n) + to_np(b, n)
    out = ADD.numpy(a, b, lo, hi, disjoint=disjoint, inplace=inplace)
    np.testing.assert_allclose(to_np(out, n), expect, rtol=1e-6, atol=1e-6)
    if isinstance(a, COO) and isinstance(b, COO):
        assert isinstance(out, DenseRange) == goes_dense(a.nnz + b.nnz, hi - lo)
    else:
        assert isinstance(out, DenseRange)
    if isinstance(out, COO):
        assert np.all(np.diff(out.indices) > 0) and out.indices.dtype == np.int32
    else:
        assert out.offset == lo and len(out) == hi - lo


def test_switch_matches_the_sparcml_code():
    # c_common.h: dense when (n1 + n2) * (4 + 4) >= dim * 4, i.e. at dim / 2 items
    n = 100
    a = COO(np.arange(0, 25, dtype=np.int32), np.ones(25, np.float32), n)
    b = COO(np.arange(25, 49, dtype=np.int32), np.ones(24, np.float32), n)
    assert isinstance(ADD.numpy(a, b, 0, n), COO)
    b = COO(np.arange(25, 50, dtype=np.int32), np.ones(25, np.float32), n)
    assert isinstance(ADD.numpy(a, b, 0, n), DenseRange)
    # the union bound, not the union: identical index sets still switch
    assert isinstance(ADD.numpy(a, COO(a.indices, a.values, n), 0, 50), DenseRange)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 400), st.integers(0, 400), st.integers(1, 9), st.booleans(), st.integers(0, 10**6))
def test_split_by_ranges(n, nnz, parts, dense, seed):
    rng = np.random.default_rng(seed)
    s = rand_stream(rng, n, 0, n, nnz, dense)
    bounds = [i * (n // parts) for i in range(parts)] + [n]
    pieces = SPLIT.numpy(s, bounds)
    assert len(pieces) == parts
    total = np.zeros(n)
    for p, a, b in zip(pieces, bounds, bounds[1:]):
        d = to_np(p, n)
        assert not d[:a].any() and not d[b:].any()
        total += d
        if isinstance(s, COO):
            cnt = int(np.count_nonzero((s.indices >= a) & (s.indices < b)))
            assert isinstance(p, DenseRange) == goes_dense(cnt, b - a)  # split_stream: cnt*8 >= size*4
        else:
            assert isinstance(p, DenseRange) and (b == a or np.shares_memory(p.values, s.values))
    np.testing.assert_array_equal(total, to_np(s, n))


def test_dense_copy_and_resparsify():
    n = 10
    s = DenseRange(np.array([0, 1e-9, -2, 0, 3], np.float32), 5, n)
    d = DENSE.numpy(s, 5, 10)
    assert not np.shares_memory(d.values, s.values)
    c = RESP.numpy(s, 0.0)
    np.testing.assert_array_equal(c.indices, [6, 7, 9])
    np.testing.assert_array_equal(RESP.numpy(s, 1e-8).indices, [7, 9])  # the SparCML code's cut
    sp = COO(np.array([2], np.int32), np.array([0.0], np.float32), n)
    assert RESP.numpy(sp, 1e-8) is sp  # sparse streams pass unchanged
    d2 = DENSE.numpy(sp, 0, 5)
    np.testing.assert_array_equal(d2.values, np.zeros(5))


def test_dense_range_travels_and_counts_its_values_only():
    s = DenseRange(np.arange(6, dtype=np.float32), 10, 100)
    assert s.nbytes == 24
    back = wire.unpack(*wire.pack(Bundle((s, s)), np.asarray)[:1], np.asarray)
    assert back[1].offset == 10 and back[1].n == 100
    np.testing.assert_array_equal(back[0].values, s.values)


@requires_torch
@settings(max_examples=40, deadline=None)
@given(ints, st.integers(0, 10**6), st.booleans(), st.booleans())
def test_torch_matches_numpy(params, seed, disjoint, inplace):
    import torch

    def t(s):
        return s.map(lambda v: torch.from_numpy(v.copy()))

    n, lo, hi, a, b = streams(params, seed, disjoint)
    ref = ADD.numpy(a, b, lo, hi, disjoint=disjoint)
    got = ADD.torch_fn(t(a), t(b), lo, hi, disjoint=disjoint, inplace=inplace)
    assert type(got) is type(ref)
    np.testing.assert_allclose(to_np(got.map(lambda v: v.numpy()), n), to_np(ref, n), rtol=1e-6, atol=1e-6)
    bounds = sorted({lo, hi, (lo + hi) // 2})
    for p_np, p_t in zip(SPLIT.numpy(ref, bounds), SPLIT.torch_fn(t(ref), bounds)):
        assert type(p_np) is type(p_t)
        np.testing.assert_array_equal(to_np(p_t.map(lambda v: v.numpy()), n), to_np(p_np, n))
    for s in (a, ref):
        np.testing.assert_array_equal(to_np(DENSE.torch_fn(t(s), lo, hi).map(lambda v: v.numpy()), n),
                                      to_np(DENSE.numpy(s, lo, hi), n))
        r_np, r_t = RESP.numpy(s, 0.5), RESP.torch_fn(t(s), 0.5)
        assert type(r_np) is type(r_t)
        np.testing.assert_array_equal(to_np(r_t.map(lambda v: v.numpy()), n), to_np(r_np, n))
        if isinstance(r_t, COO):
            assert r_t.indices.dtype == torch.int32


def test_work_follows_the_representation():
    n, size = 1000, 1000
    sp = COO(np.arange(0, 100, 2, dtype=np.int32), np.ones(50, np.float32), n)
    dn = DenseRange(np.ones(size, np.float32), 0, n)
    w = {}
    for label, a, b, kw in [("sparse", sp, COO(sp.indices + 1, sp.values, n), {}),
                            ("inplace", dn, sp, {"inplace": True}), ("copy", dn, sp, {}),
                            ("dense", dn, DenseRange(np.ones(size, np.float32), 0, n), {})]:
        out = ADD.numpy(DenseRange(a.values.copy(), 0, n) if label != "sparse" else a, b, 0, size, **kw)
        w[label] = ADD.work(out, a, b, 0, size, **kw)
    assert w["sparse"].elems == 100 and w["inplace"].elems == 50      # union merge; scatter into the buffer
    assert w["copy"].elems == size + 50 and w["dense"].elems == size  # a fresh dense result touches the range
    assert w["inplace"].bytes < w["copy"].bytes < w["dense"].bytes + 1
    parts = SPLIT.numpy(sp, [0, 50, 1000])
    assert SPLIT.work(parts, sp, [0, 50, 1000]).elems == 50
    assert RESP.work(RESP.numpy(dn, 0.0), dn, 0.0).bytes == 4 * size + 8 * size
    assert DENSE.work(DENSE.numpy(sp, 0, size), sp, 0, size).elems == size
