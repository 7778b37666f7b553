"""Ties at the k-th magnitude: torch.topk and numpy pick different entries
among equal magnitudes, and both are a top-k. Every reference built on a
rank's local top-k accepts the rank's own (valid) choice, so the real
backend is not reported wrong on inputs with ties (seen at n = 10M)."""
import numpy as np
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.algorithms.base import Setup, topk_choice

P, N, K = 2, 40, 4


def _inputs():
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-1, 1, N).astype(np.float32) for _ in range(P)]
    for x in xs:  # three large entries, then two tied at the 4th magnitude
        x[[3, 11, 20]] = [5.0, -6.0, 7.0]
        x[[8, 30]] = [2.0, -2.0]
    return xs


def _other_choice(x):
    """A valid top-K that numpy's kernel does not pick."""
    base = set(topk_choice(x, K).tolist())
    tied = {8, 30}
    alt = sorted((base - tied) | (tied - (base & tied)))
    assert len(alt) == K and set(alt) != base
    return np.array(alt)


@pytest.mark.parametrize("name", ["topka", "topkdsa", "ssar_recursive_double", "ssar_split_allgather",
                                  "dsar_split_allgather", "gtopk"])
def test_sum_of_local_topk_references_accept_each_ranks_choice_among_ties(name):
    cls = ALGORITHMS[name]
    xs = _inputs()
    setup = Setup(rank=0, P=P, n=N, density=K / N)
    assert setup.k == K
    states = [{"selected": _other_choice(x), "cut_range": None} for x in xs]
    ref = cls.reference(xs, setup, cls.Params(), states)
    expect = np.zeros(N)
    for x, st in zip(xs, states):
        expect[st["selected"]] += x[st["selected"]]
    if name == "gtopk":  # the top-k of the sum of the two choices
        keep = topk_choice(expect, K)
        expect = np.where(np.isin(np.arange(N), keep), expect, 0.0)
    np.testing.assert_allclose(ref, expect, rtol=1e-6)


def test_cltk_reference_uses_the_leaders_choice():
    cls = ALGORITHMS["cltk"]
    xs = _inputs()
    setup = Setup(rank=0, P=P, n=N, density=K / N)
    alt = _other_choice(xs[1])
    states = [{"leader": 1, "selected": alt}] * P
    ref = cls.reference(xs, setup, cls.Params(), states)
    expect = np.zeros(N)
    expect[alt] = xs[0][alt] + xs[1][alt]
    np.testing.assert_allclose(ref, expect, rtol=1e-6)


def test_an_invalid_choice_is_not_accepted():
    x = _inputs()[0]
    wrong = np.array([0, 1, 2, 3])
    assert set(topk_choice(x, K, wrong).tolist()) != set(wrong.tolist())
