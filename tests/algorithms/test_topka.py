"""TopkA: the sum of every rank's exact top-k, 2k(P-1) words received."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.helpers import ALPHA, BW, simulate


@pytest.mark.parametrize("P", [1, 2, 3, 4, 5, 8, 16, 64])
@pytest.mark.parametrize("allgather", ["rd", "ring"])
def test_result_is_sum_of_local_topk(P, allgather):
    row, _ = simulate("topka", P, n=2000, density=0.02, params={"allgather": allgather})
    assert row["correct"] is True


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 20), st.integers(10, 500), st.floats(0.001, 0.5), st.integers(0, 1000))
def test_random_cases(P, n, density, seed):
    row, _ = simulate("topka", P, n=max(n, P), density=density, seed=seed)
    assert row["correct"] is True


@pytest.mark.parametrize("P", [2, 4, 8, 16, 32, 64])
def test_bytes_and_time_match_table_1(P):
    n, density = 10000, 0.01
    k = 100
    row, _ = simulate("topka", P, n=n, density=density)
    words = 2 * k * (P - 1)  # COO: value + index per element
    assert row["bytes_sent_max"] == words * 4
    assert row["bytes_total"] == P * words * 4
    assert row["time_s"] == pytest.approx(math.log2(P) * ALPHA + words * 4 / BW, rel=1e-9)


def test_density_one_equals_dense_sum():
    row, results = simulate("topka", 4, n=100, density=1.0)
    assert row["correct"] is True
    assert np.count_nonzero(results[0]) == 100
