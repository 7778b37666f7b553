"""The split and reduce's sums in rotation order: the compiled loops against
the numpy paths and against the definition, on random selections."""
import contextlib
from types import SimpleNamespace


import numpy as np
import pytest

from simsparse import jit
from simsparse.algorithms import rotation_sums as rs
from simsparse.compute.sparse_kernels import coo_split
from simsparse.ops import COO


def _requests(P: int, seed: int, dtype=np.float32):
    """Every rank's request of Ok-Topk's split and reduce: a random sparse
    selection of n = 7 P cut at P regions (some empty), and a region of
    random values to add into; regions overlap across sources so that
    the order of additions shows in the floats."""
    rng = np.random.default_rng(seed)
    n = 7 * P
    cut = np.sort(rng.choice(np.arange(1, n), P - 1, replace=False)) if P > 1 else np.zeros(0, dtype=np.int64)
    bounds = [0, *cut.tolist(), n]
    reqs = []
    for _ in range(P):
        idx = np.sort(rng.choice(n, int(rng.integers(0, 3 * P + 1)), replace=False)).astype(np.int32)
        vals = (rng.standard_normal(len(idx)) * 10.0 ** rng.integers(-3, 4, len(idx))).astype(dtype)
        parts = coo_split.numpy(COO(idx, vals, n), bounds)
        acc = rng.standard_normal(bounds[len(reqs) + 1] - bounds[len(reqs)]).astype(dtype)
        reqs.append(SimpleNamespace(blocks=parts, reduce=SimpleNamespace(acc=acc)))
    return reqs, bounds


def _copy(reqs):
    return [SimpleNamespace(blocks=q.blocks, reduce=SimpleNamespace(acc=q.reduce.acc.copy())) for q in reqs]


@pytest.mark.parametrize("list_from", [0, 10**9])
@pytest.mark.parametrize("P", [1, 2, 3, 8, 13])
def test_the_compiled_reduction_adds_as_numpy_and_as_received(monkeypatch, P, list_from):
    """Bit for bit: the compiled loops (entries read where they lie, or
    copied side by side first), the numpy path and a plain loop that adds
    each block in the order its region's owner receives it."""
    monkeypatch.setattr(rs, "LIST_FROM", list_from)
    monkeypatch.setattr(rs, "LIST_MIN_TOTAL", 0)
    if rs._REDUCE_FLAT is None:
        pytest.skip("numba is not installed")
    reqs, bounds = _requests(P, seed=P)
    C = np.stack([q.blocks.counts() for q in reqs]).astype(np.int32)
    want = _copy(reqs)
    for r, q in enumerate(want):   # region r receives source (r - i) mod P at step i
        for i in range(P):
            part = reqs[(r - i) % P].blocks[r]
            for x, v in zip(part.indices.tolist(), part.values):
                q.reduce.acc[x - bounds[r]] += v
    got = {"1": rs.reduce_in_rotation(_copy(reqs), rs.transposed(C))}
    with jit.python():
        got["0"] = rs.reduce_in_rotation(_copy(reqs), rs.transposed(C))
    for r in range(P):
        np.testing.assert_array_equal(got["1"][r], want[r].reduce.acc)
        np.testing.assert_array_equal(got["0"][r], want[r].reduce.acc)


@pytest.mark.parametrize("flag", ["0", "1"])
@pytest.mark.parametrize("P", [1, 2, 5, 16, 130])
def test_the_step_sums_are_what_each_receiver_gets(P, flag):
    """Entries and bytes per receiver and bucket of steps, compiled and numpy,
    equal the definition (source (r - i) mod P at step i)."""
    with (contextlib.nullcontext() if flag == "1" else jit.python()):
        _step_sums(P)


def _step_sums(P):
    rng = np.random.default_rng(P)
    C = rng.integers(0, 50, (P, P)).astype(np.int32)
    unit = rng.choice([8, 12], P).astype(np.int64)
    starts = sorted({0, *rng.integers(0, P, 3).tolist()})
    nnz, nb = rs.step_sums(C, unit, starts)
    ends = [*starts[1:], P]
    for r in range(P):
        for j, (a, b) in enumerate(zip(starts, ends)):
            src = [(r - i) % P for i in range(a, b)]
            assert nnz[r, j] == sum(int(C[s, r]) for s in src)
            assert nb[r, j] == sum(int(C[s, r] * unit[s]) for s in src)
    assert nnz.dtype == nb.dtype == np.int64
