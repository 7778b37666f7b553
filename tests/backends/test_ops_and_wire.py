"""Payload sizes, copying and the real backend's wire format."""
import numpy as np
from hypothesis import given, settings, strategies as st

from simsparse.backends.real.wire import pack, unpack
from simsparse.ops import COO, Bundle, Dense


def test_sizes_are_exact():
    d = Dense(np.zeros(10, np.float32))
    c = COO(np.arange(3, dtype=np.int32), np.ones(3, np.float32), 100)
    assert d.nbytes == 40
    assert c.nbytes == 24 and c.nnz == 3
    assert Bundle((d, c, Bundle((d,)))).nbytes == 104


def test_map_copies_every_array_and_keeps_metadata():
    c = COO(np.arange(3, dtype=np.int32), np.ones(3, np.float32), 100)
    b = Bundle((c, Dense(np.zeros(2))))
    m = b.map(np.copy)
    assert m.parts[0].n == 100
    m.parts[0].values[0] = 5
    assert c.values[0] == 1


payloads = st.recursive(
    st.one_of(
        st.integers(0, 50).map(lambda m: Dense(np.random.default_rng(m).standard_normal(m).astype(np.float32))),
        st.integers(0, 50).map(lambda m: COO(np.arange(m, dtype=np.int32), np.ones(m, np.float64), 1000)),
    ),
    lambda kids: st.lists(kids, max_size=4).map(lambda xs: Bundle(tuple(xs))),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(payloads)
def test_wire_roundtrip(p):
    first, data = pack(p, np.asarray)
    q = unpack(first, np.asarray, data)
    assert q.nbytes == p.nbytes
    assert type(q) is type(p)
    for a, b in zip(p.arrays(), q.arrays()):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_wire_large_dense_travels_as_prefix_plus_uncopied_array():
    from simsparse.backends.real.wire import SPLIT_MIN, split_size
    a = np.arange(SPLIT_MIN // 4 + 3, dtype=np.float32)
    first, data = pack(Dense(a), np.asarray)
    assert np.shares_memory(data, a) and split_size(first) == a.nbytes  # no copy, size announced
    np.testing.assert_array_equal(unpack(first, np.asarray, data).values, a)
    first, data = pack(Dense(a), np.asarray, split=False)  # one message
    assert data is None and split_size(first) is None
    np.testing.assert_array_equal(unpack(first, np.asarray).values, a)
