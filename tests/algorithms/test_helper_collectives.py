"""Helper collectives (allgather(v) by recursive doubling and ring, binomial
bcast, alltoall, host allreduce), yielded as requests, give every rank every
block, with the textbook byte counts."""
import numpy as np
import pytest

from simsparse.algorithms.collectives import Allgather, AllreduceHost, Alltoall, Bcast
from simsparse.backends.events.sim import Simulator
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.ops import COO, Dense


def run(P, prog, alpha=1e-6, bw=1e9):
    sim = Simulator(AlphaBetaNetwork(alpha, bw))
    return sim.run([lambda ctx: prog(ctx) for _ in range(P)])


def block_of(r):
    m = r % 4 + 1  # variable sizes: this is an allgatherv
    return COO(np.arange(m, dtype=np.int32) + 10 * r, np.full(m, r, np.float32), 1000)


@pytest.mark.parametrize("algo", ["rd", "ring"])
@pytest.mark.parametrize("P", list(range(1, 18)) + [32, 33])
def test_allgatherv_delivers_all_blocks_in_rank_order(algo, P):
    def prog(ctx):
        blocks = yield Allgather(block_of(ctx.rank), algo)
        return blocks

    st = run(P, prog)
    for res in st.results:
        assert len(res) == P
        for q, b in enumerate(res):
            np.testing.assert_array_equal(b.indices, block_of(q).indices)
            np.testing.assert_array_equal(b.values, block_of(q).values)


@pytest.mark.parametrize("P", [2, 4, 8, 16])
def test_allgather_bytes_and_time_at_powers_of_two(P):
    m = 256  # bytes per block
    alpha, bw = 1e-6, 1e9

    def prog(ctx):
        return (yield Allgather(Dense(np.zeros(m // 4, np.float32)), "rd"))

    st = run(P, prog, alpha, bw)
    assert all(b == (P - 1) * m for b in st.bytes_sent)
    assert st.time_s == pytest.approx(np.log2(P) * alpha + (P - 1) * m / bw, rel=1e-9)


@pytest.mark.parametrize("P", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("root", [0, 2])
def test_binomial_bcast(P, root):
    root = root % P

    def prog(ctx):
        data = Dense(np.arange(7, dtype=np.float32)) if ctx.rank == root else None
        out = yield Bcast(data, root)
        return out

    st = run(P, prog)
    for res in st.results:
        np.testing.assert_array_equal(res.values, np.arange(7))
    assert sum(st.msgs_sent) == P - 1


@pytest.mark.parametrize("P", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("bucket_size", [None, 1, 4])
@pytest.mark.parametrize("rotation", [True, False])
def test_alltoall(P, bucket_size, rotation):
    def prog(ctx):
        blocks = [Dense(np.array([100 * ctx.rank + j], np.float32)) for j in range(P)]
        got = yield Alltoall(blocks, rotation=rotation, bucket_size=bucket_size)
        return [float(g.values[0]) for g in got]

    st = run(P, prog)
    for r, res in enumerate(st.results):
        assert res == [100 * s + r for s in range(P)]


@pytest.mark.parametrize("P", [1, 2, 3, 6, 8])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_allreduce_host(P, op):
    def prog(ctx):
        out = yield AllreduceHost(np.array([ctx.rank, 10 - ctx.rank]), op)
        return out.tolist()

    st = run(P, prog)
    ranks = np.arange(P)
    expect = [int(ranks.sum()), int((10 - ranks).sum())] if op == "sum" else [P - 1, 10]
    assert all(res == expect for res in st.results)
