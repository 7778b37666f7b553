"""Sparse kernels against dense numpy, and torch against numpy."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.compute.kernels import KERNELS, get_kernel
from simsparse.compute.sparse_kernels import COOParts
from simsparse.ops import COO

from tests.helpers import requires_torch


def K(name):
    return get_kernel(name).numpy


def rand_coo(rng, n, m):
    idx = np.sort(rng.choice(n, size=min(m, n), replace=False)).astype(np.int32)
    return COO(idx, rng.standard_normal(len(idx)).astype(np.float32), n)


def dense(c):
    out = np.zeros(c.n)
    out[c.indices] = c.values
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 6), st.integers(0, 10**6))
def test_coo_add_split_concat(n, parts, seed):
    rng = np.random.default_rng(seed)
    cs = [rand_coo(rng, n, rng.integers(0, n + 1)) for _ in range(parts)]
    s = K("coo_add")(cs)
    np.testing.assert_allclose(dense(s), sum(dense(c) for c in cs), rtol=1e-6, atol=1e-6)
    assert np.all(np.diff(s.indices) > 0)
    bounds = sorted({0, n, *rng.integers(0, n + 1, size=3).tolist()})
    pieces = K("coo_split")(s, bounds)
    assert len(pieces) == len(bounds) - 1
    for (lo, hi), p in zip(zip(bounds, bounds[1:]), pieces):
        assert np.all((p.indices >= lo) & (p.indices < hi))
    back = K("coo_concat")(pieces)
    np.testing.assert_array_equal(back.indices, s.indices)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(0, 10**6))
def test_thresholds_select_exactly_k(n, k, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    k = min(k, n)
    thr = K("kth_abs")(x, k)
    assert K("count_above")(x, thr) == k
    sel = K("threshold_select")(x, thr)
    np.testing.assert_array_equal(sel.indices, K("topk")(x, k).indices)
    c = K("sparsify")(np.where(np.abs(x) >= thr, x, 0))
    np.testing.assert_array_equal(c.indices, sel.indices)
    t = K("coo_topk")(c, max(1, k // 2))
    assert t.nnz == max(1, k // 2) and np.abs(t.values).min() >= np.abs(np.setdiff1d(c.values, t.values)).max(initial=0)
    np.testing.assert_array_equal(K("coo_threshold")(c, thr).indices, c.indices)


def test_residual_helpers():
    x = np.arange(6, dtype=np.float32)
    idx = np.array([1, 4], np.int32)
    np.testing.assert_array_equal(K("zero_at")(x, idx), [0, 0, 2, 3, 0, 5])
    np.testing.assert_array_equal(K("gather_at")(x, idx), [1, 4])
    np.testing.assert_array_equal(K("intersect")(np.array([2, 3, 5], np.int32), idx), [])
    np.testing.assert_array_equal(K("intersect")(np.array([1, 3, 4], np.int32), idx), [1, 4])
    np.testing.assert_array_equal(K("sparsify")(np.array([0, 2, 0], np.float32), offset=10, n=20).indices, [11])


@requires_torch
@pytest.mark.parametrize("name", ["kth_abs", "count_above", "threshold_select", "coo_add", "coo_split", "coo_concat",
                                  "coo_topk", "coo_threshold", "sparsify", "gather_at", "zero_at", "intersect"])
def test_torch_matches_numpy(name):
    import torch

    rng = np.random.default_rng(3)
    x = rng.standard_normal(300).astype(np.float32)
    a, b = rand_coo(rng, 300, 40), rand_coo(rng, 300, 60)
    T = torch.from_numpy
    args = {
        "kth_abs": (x, 17), "count_above": (x, 1.0), "threshold_select": (x, 1.5), "coo_add": ([a, b],),
        "coo_split": (a, [0, 100, 250, 300]), "coo_concat": (K("coo_split")(a, [0, 100, 300]),),
        "coo_topk": (b, 7), "coo_threshold": (b, 0.8), "sparsify": (np.where(x > 1, x, 0), 5, 400),
        "gather_at": (x, a.indices), "zero_at": (x, a.indices), "intersect": (a.indices, b.indices),
    }[name]

    def conv(v):
        if isinstance(v, np.ndarray):
            return T(v.copy())
        if isinstance(v, COO):
            return v.map(lambda z: T(z.copy()))
        if isinstance(v, (list, COOParts)) and len(v) and isinstance(v[0], COO):
            return [conv(q) for q in v]
        return v

    ref = KERNELS[name].numpy(*args)
    got = KERNELS[name].torch_fn(*[conv(v) for v in args])

    def flat(v):
        if isinstance(v, COO):
            return [np.asarray(v.indices), np.asarray(v.values)]
        if isinstance(v, (list, COOParts)):
            return [z for q in v for z in flat(q)]
        return [np.asarray(v)]

    for r, g in zip(flat(ref), flat(got if not hasattr(got, "numpy") else got.numpy())):
        np.testing.assert_allclose(np.asarray(r, dtype=np.float64), np.asarray(g, dtype=np.float64), rtol=1e-5)


def test_intersect_compiled_merge_agrees_with_the_binary_search():
    """The compiled merge and the numpy path (inside ``jit.python``) give the
    same sorted intersection, on random sorted unique indices of both widths."""
    from simsparse.compute import sparse_kernels as sk

    if sk._LOCATE is None:
        pytest.skip("numba disabled")
    rng = np.random.default_rng(11)
    for trial in range(200):
        n = int(rng.integers(1, 5000))
        a = np.unique(rng.integers(0, n, int(rng.integers(0, 300)))).astype(np.int32)
        b = np.unique(rng.integers(0, n, int(rng.integers(0, 300)))).astype(np.int64 if trial % 3 == 0 else np.int32)
        want = np.intersect1d(a, b).astype(np.int32)
        got = K("intersect")(a, b)
        compiled, sk._LOCATE = sk._LOCATE, None
        try:
            pure = K("intersect")(a, b)
        finally:
            sk._LOCATE = compiled
        assert got.dtype == a.dtype and pure.dtype == a.dtype
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(pure, want)


def test_the_compiled_merge_adds_two_sparse_vectors_as_the_sort_does(monkeypatch):
    """coo_add of two vectors of ascending indices, merged in one compiled
    pass and by numpy's unique and bincount: the same indices and dtypes
    and the same values to the bit (signed zeros included), shared indices,
    empty parts and both index and value widths."""
    from simsparse.compute import sparse_kernels as sk

    if sk._merge_add is None:
        pytest.skip("numba disabled")
    rng = np.random.default_rng(5)
    for trial in range(120):
        n = int(rng.integers(1, 4000))
        dt, it = (np.float32, np.float64)[trial % 2], (np.int32, np.int64)[trial // 2 % 2]
        parts = []
        for _ in range(2):
            idx = np.sort(rng.choice(n, size=int(rng.integers(0, min(n, 300) + 1)), replace=False)).astype(it)
            v = rng.standard_normal(len(idx)).astype(dt)
            v[::5] = -0.0
            parts.append(COO(idx, v, n))
        got = K("coo_add")(parts)
        monkeypatch.setattr(sk, "_merge_add", None)
        want = K("coo_add")(parts)
        monkeypatch.undo()
        assert got.indices.dtype == want.indices.dtype and got.values.dtype == want.values.dtype
        np.testing.assert_array_equal(got.indices, want.indices)
        assert got.values.tobytes() == want.values.tobytes()


def test_the_merged_cuts_are_binary_searches():
    """coo_split's merge pass (compiled and Python) gives ``np.searchsorted``'s
    positions, on sorted random indices and bounds with repeats, bounds
    beyond the last index and an empty selection."""
    from simsparse.compute import sparse_kernels as sk

    rng = np.random.default_rng(4)
    for n_idx, n_b in ((0, 70), (1, 70), (500, 65), (3000, 300)):
        a = np.sort(rng.choice(10_000, n_idx, replace=False)).astype(np.int32)
        b = np.sort(rng.integers(0, 10_500, n_b))
        b[5:9] = b[5]
        want = np.searchsorted(a, b)
        for f in filter(None, (sk._cuts, sk._cuts_compiled)):
            np.testing.assert_array_equal(f(a, b, np.empty(len(b), dtype=np.int64)), want)
        parts = sk.coo_split.numpy(COO(a, np.ones(len(a), np.float32), 10_500), b)
        np.testing.assert_array_equal(np.asarray(parts.cuts), want)


def test_the_compiled_count_compares_as_numpy():
    """count_above's compiled pass counts what ``np.abs(x) >= thr`` counts:
    float32 and float64 vectors, thresholds a Python float (compared in
    x's dtype), a numpy float64 (compared in float64), an int, at and
    between the vector's own magnitudes, with NaN and signed zeros."""
    from simsparse.compute import sparse_kernels as sk

    rng = np.random.default_rng(9)
    for dt in (np.float32, np.float64):
        x = rng.standard_normal(10_000).astype(dt)
        x[:3] = [np.nan, -0.0, 0.0]
        mags = np.abs(x[3:])
        for thr in (0.1, np.float64(0.1), 1, float(mags[17]), np.float64(mags[17]) * (1 + 1e-12), 0.0, -1.0,
                    float("nan")):
            assert sk.count_above.numpy(x, thr) == int(np.count_nonzero(np.abs(x) >= thr)), (dt, thr)
