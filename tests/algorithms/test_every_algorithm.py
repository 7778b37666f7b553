"""Every registered algorithm, whoever wrote it: documented, correct in the
simulator for awkward P, its bytes inside its paper's bounds, and identical in
bytes and results under mpiexec -n 4. A test id is the algorithm's name
(``pytest -k oktopk``); a new algorithm needs a row in ``PAPER_BYTES``."""
import math
import re

import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.compression import fft, qsgd, terngrad
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, requires_mpi
from tests import real_batch

NAMES = sorted(ALGORITHMS)


@pytest.mark.parametrize("name", NAMES)
def test_docstring_cites_a_source_and_a_cost(name):
    """The paper (venue and year, e.g. "PPoPP'22", or SparCML), where in it
    (section, algorithm, table or equation), and the cost in alpha and beta."""
    doc = ALGORITHMS[name].__doc__ or ""
    assert re.search(r"[A-Z]{2,}[A-Za-z]*[' ](19|20)?\d\d\b|SparCML", doc), f"{name}: names no paper"
    assert re.search(r"(sections?|Alg\.|Algorithm|Table|Eq\.) ?\d", doc), f"{name}: no section, algorithm or table"
    assert re.search(r"alpha|beta", doc), f"{name}: docstring states no cost in alpha and beta"


@pytest.mark.parametrize("P", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("name", NAMES)
def test_correct_in_the_simulator(name, P):
    point = make_point(name, P, n=3000, density=0.02, iterations=2, warmup=1, seed=11)
    problem = ALGORITHMS[name].check_setup(P, 3000, point.params_model())
    if problem:
        pytest.skip(problem)
    row = simulate_point(point).row
    assert row["correct"] is True, (name, P, row["max_rel_err"])
    # one rank talks to nobody; two or more must exchange bytes and take time
    assert (row["bytes_total"] == 0) == (P == 1) and (row["time_s"] > 0) == (P > 1), (name, P, row)
    assert row["bytes_sent_max"] <= row["bytes_total"] <= P * row["bytes_sent_max"]


W, PAIR = 4, 8   # bytes of a float32 value, of an (int32 index, float32 value) pair


def _rd(P, words):
    """Recursive doubling's total bytes for P a power of two: log2 P exchanges of the whole vector."""
    return P * math.log2(P) * words * W


def _oktopk_max(P, n, k):
    """Ok-Topk Eq. 3 / Table 1: at most 6k(P-1)/P words per rank, plus the
    latency-only messages of an iteration that has them all (sizes, boundaries,
    the radix select's histograms; tests/algorithms/test_oktopk.py has them exactly)."""
    bits, lg = ALGORITHMS["oktopk"].Params().select_bits, math.log2(P)
    histograms, hi = 0, 31              # the radix select's passes over the 31 magnitude bits, int32 bins
    while hi > 0:
        lo = max(0, hi - bits)
        histograms += lg * 4 * (1 << (hi - lo))
        hi = lo
    return 6 * k * (P - 1) / P * W + 4 * (P - 1) + lg * 8 * (P - 1) + histograms


def _allgather(P, m):
    """Every rank receives every other rank's m-byte payload once."""
    return P * (P - 1) * m


# name -> bytes(P, n, k) -> (lowest, highest) of (bytes_total, bytes_sent_max), for P a power of two;
# the source of each bound is in the comment (Ok-Topk = Li & Hoefler PPoPP'22, SparCML = Renggli et al. SC'19).
PAPER_BYTES = {
    # Thakur, Rabenseifner & Gropp, IJHPCA 2005: ring and reduce-scatter + allgather move 2(P-1)/P n words per rank
    "ring": lambda P, n, k: ((2 * (P - 1) * n * W,) * 2, (2 * (P - 1) / P * n * W,) * 2),
    "rabenseifner": lambda P, n, k: ((2 * (P - 1) * n * W,) * 2, (2 * (P - 1) / P * n * W,) * 2),
    # Thakur et al. 2005: recursive doubling sends the whole vector in each of log2 P rounds
    "recursive_doubling": lambda P, n, k: ((_rd(P, n),) * 2, (math.log2(P) * n * W,) * 2),
    # Wang et al. HPDC'20 (the FFT paper's baseline): an allgather of the dense vectors
    "dense_allgather": lambda P, n, k: ((_allgather(P, n * W),) * 2, ((P - 1) * n * W,) * 2),
    # Ok-Topk Table 1, TopkA: 2k(P-1) words received per rank
    "topka": lambda P, n, k: ((_allgather(P, k * PAIR),) * 2, ((P - 1) * k * PAIR,) * 2),
    # Shi et al. ICDCS'19 / Ok-Topk Table 1: a tree of P-1 merges, then a broadcast of k pairs; the root sends log2 P
    "gtopk": lambda P, n, k: ((2 * (P - 1) * k * PAIR,) * 2, (math.log2(P) * k * PAIR,) * 2),
    # Chen et al. (ScaleCom, NeurIPS'20): a bcast of the leader's k indices, an allreduce of k values (<= 2 KiB: rd)
    "cltk": lambda P, n, k: (((P - 1) * k * W + _rd(P, k),) * 2, (0, (P - 1) * k * W + math.log2(P) * k * W)),
    # Shi et al. (Gaussiank, 2019) Table 1: TopkA's exchange of the k_i selected pairs plus a count; the normal
    # fit keeps k_i within a factor 2 of k
    "gaussiank": lambda P, n, k: ((_allgather(P, 4 + k / 2 * PAIR), _allgather(P, 4 + 2 * k * PAIR)),
                                  (0, (P - 1) * (4 + 2 * k * PAIR))),
    # Ok-Topk: SparCML Lemma 5.1 below (2(P-1)/P k words for any sparse allreduce), Eq. 3 above
    "oktopk": lambda P, n, k: ((0, P * _oktopk_max(P, n, k)), (2 * (P - 1) / P * k * W, _oktopk_max(P, n, k))),
    # Yoon & Oh ICPP'23: an allreduce of ~k selected values (Rabenseifner, 2(P-1) k words), never TopkA's build-up
    "deft": lambda P, n, k: ((0.95 * 2 * (P - 1) * k * W, _allgather(P, k * PAIR)), (0, (P - 1) * k * PAIR)),
    # SparCML section 5.3: per rank between log2(P) k and (P-1) k pairs (identical / disjoint supports)
    "ssar_recursive_double": lambda P, n, k: ((P * math.log2(P) * k * PAIR, P * (P - 1) * k * PAIR),
                                              (0, (P - 1) * k * PAIR)),
    # SparCML section 5.3: per rank between 2(P-1)/P k and P k pairs on average; one rank sends at most its
    # split ((P-1)/P k) and the disjoint union of the others' ranges (P k)
    "ssar_split_allgather": lambda P, n, k: ((2 * (P - 1) * k * PAIR, P * P * k * PAIR),
                                             (0, ((P - 1) / P * k + P * k) * PAIR)),
    # SparCML section 5.3: the dense allgather of n/P blocks, plus at most k pairs of the sparse reduce-scatter
    "dsar_split_allgather": lambda P, n, k: ((_allgather(P, n // P * W), P * (k * PAIR + (P - 1) * (n // P) * W)),
                                             ((P - 1) * (n // P) * W, k * PAIR + (P - 1) * (n // P) * W)),
    # Ok-Topk Table 1, TopkDSA: between 4k(P-1)/P and 2k + n(P-1)/P words, plus counts and sizes (int32)
    "topkdsa": lambda P, n, k: ((P * 4 * k * (P - 1) / P * W, P * (W * (2 * k + n * (P - 1) / P) + 8 * (P - 1))),
                                (0, W * (2 * k + n * (P - 1) / P) + 8 * (P - 1))),
    # Wang et al. HPDC'20, Alistarh et al. NIPS'17, Wen et al. NIPS'17: an allgather of each rank's compressed vector
    "fft_allgather": lambda P, n, k: ((_allgather(P, fft.wire_bytes(n, 0.85, 10)),) * 2,
                                      ((P - 1) * fft.wire_bytes(n, 0.85, 10),) * 2),
    "qsgd_allgather": lambda P, n, k: ((_allgather(P, qsgd.wire_bytes(n, 4, 512)),) * 2,
                                       ((P - 1) * qsgd.wire_bytes(n, 4, 512),) * 2),
    "terngrad_allgather": lambda P, n, k: ((_allgather(P, terngrad.wire_bytes(n, 1)),) * 2,
                                           ((P - 1) * terngrad.wire_bytes(n, 1),) * 2),
}


def test_every_registered_algorithm_has_its_papers_bytes():
    """A new algorithm fails here until it states the bytes its paper promises."""
    assert set(PAPER_BYTES) == set(ALGORITHMS)


@pytest.mark.parametrize("P", [2, 8])
@pytest.mark.parametrize("name", NAMES)
def test_bytes_inside_its_papers_bounds(name, P):
    n, density = 3000, 0.02
    point = make_point(name, P, n=n, density=density, iterations=2, warmup=1, seed=11)
    row = simulate_point(point).row
    (lo_total, hi_total), (lo_max, hi_max) = PAPER_BYTES[name](P, n, round(n * density))
    assert row["correct"] is True
    assert lo_total <= row["bytes_total"] <= hi_total, (name, P, lo_total, row["bytes_total"], hi_total)
    assert lo_max <= row["bytes_sent_max"] <= hi_max, (name, P, lo_max, row["bytes_sent_max"], hi_max)


real_batch.register("every_algorithm", [make_point(name, real_batch.P, n=2048, density=0.02, iterations=2,
                                                       warmup=1, seed=5) for name in NAMES], rtol=1e-4)


@requires_mpi
@pytest.mark.mpi
def test_every_algorithm_same_bytes_and_results_under_mpiexec(tmp_path_factory, worker_id):
    real_batch.check_against_simulator("every_algorithm", tmp_path_factory, worker_id)
