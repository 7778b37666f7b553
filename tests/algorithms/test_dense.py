"""Dense allreduce: correct for any P, and equal to the alpha-beta closed forms."""
import math

import pytest

from tests.helpers import ALPHA, BW, simulate

W = 4  # float32
BETA = 1.0 / BW
PS = [1, 2, 3, 4, 5, 8, 16, 64]


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner"])
def test_result_equals_dense_sum(algorithm, P):
    row, results = simulate(algorithm, P, n=64 * P + 3)  # n not a multiple of P either
    assert row["correct"] is True
    assert len(results) == P


@pytest.mark.parametrize("P", [2, 4, 8, 16, 64])
def test_closed_forms_at_powers_of_two(P):
    n = 512 * P
    lg = math.log2(P)
    expect = {
        "ring": (2 * (P - 1) * ALPHA + 2 * (P - 1) / P * n * W * BETA, 2 * (P - 1) / P * n * W),
        "rabenseifner": (2 * lg * ALPHA + 2 * (P - 1) / P * n * W * BETA, 2 * (P - 1) / P * n * W),
        "recursive_doubling": (lg * (ALPHA + n * W * BETA), lg * n * W),
    }
    for name, (t, per_rank) in expect.items():
        row, _ = simulate(name, P, n=n)
        assert row["time_s"] == pytest.approx(t, rel=1e-9), name
        assert row["bytes_sent_max"] == per_rank, name
        assert row["bytes_total"] == P * per_rank, name


@pytest.mark.parametrize("P", [3, 5, 6, 7, 12])
def test_bytes_at_other_P_match_the_folded_schedules(P):
    pof2 = 1 << (P.bit_length() - 1)
    rem = P - pof2
    n = 64 * P * pof2
    # ring works for any P
    row, _ = simulate("ring", P, n=n)
    assert row["bytes_total"] == 2 * (P - 1) * n * W
    assert row["time_s"] == pytest.approx(2 * (P - 1) * (ALPHA + n / P * W * BETA), rel=1e-9)
    # MPICH folding: rem vectors in, pof2-rank algorithm, rem vectors out
    row, _ = simulate("recursive_doubling", P, n=n)
    assert row["bytes_total"] == (2 * rem + pof2 * math.log2(pof2)) * n * W
    row, _ = simulate("rabenseifner", P, n=n)
    assert row["bytes_total"] == (2 * rem + 2 * (pof2 - 1)) * n * W


def test_eager_threshold_does_not_change_dense_closed_forms():
    # the rendezvous path starts when both sides are posted: same time here
    a, _ = simulate("rabenseifner", 8, n=4096, eager=0)
    b, _ = simulate("rabenseifner", 8, n=4096, eager=1 << 30)
    assert a["time_s"] == pytest.approx(b["time_s"], rel=1e-12)
