"""The simulator's MPI and timing semantics on small hand-written programs."""
import numpy as np
import pytest

from simsparse.backends.events.sim import Simulator
from simsparse.compute.devices import DeviceProfile, ParametricDevice
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.ops import Dense

A, BW = 1e-6, 1e9


def vec(nbytes, fill=0.0):
    return Dense(np.full(nbytes // 4, fill, np.float32))


# a device on which only "zeros" costs time: 1 us per element (used to sleep)
SLEEPY = ParametricDevice(DeviceProfile(name="sleepy", mem_bandwidth_Bps=1e30,
                                        kernels={"zeros": {"per_elem_s": 1e-6, "launch_s": 0.0}}))


def sim(**kw):
    kw.setdefault("device", SLEEPY)
    return Simulator(AlphaBetaNetwork(A, BW), **kw)


def _late_receive(m, **kw):
    """Rank 0 sends m bytes; rank 1 posts its receive 1 s later."""
    def sender(ctx):
        yield ctx.waitall([ctx.isend(1, vec(m))])

    def receiver(ctx):
        yield from _sleep(ctx, 1.0)
        yield ctx.waitall([ctx.irecv(0)])

    return sim(**kw).run([sender, receiver])


def test_eager_message_moves_before_the_receive_is_posted():
    m = 1000
    st = _late_receive(m, eager_threshold_B=m)
    assert st.finish_s[0] == pytest.approx(A + m / BW)  # sender done long before
    assert st.finish_s[1] == pytest.approx(1.0)


def test_rendezvous_waits_for_the_receive_and_pays_the_handshake():
    m = 1000
    st = _late_receive(m, eager_threshold_B=m - 1, rendezvous_rtt_s=5e-6)
    assert st.finish_s[0] == pytest.approx(1.0 + 5e-6 + A + m / BW)
    assert st.finish_s[1] == st.finish_s[0]


@pytest.mark.parametrize("window, moves_early", [(None, False), (999, False), (1000, True), (10**9, True)])
def test_a_message_within_the_unexpected_window_moves_before_its_receive(window, moves_early):
    """Past the eager threshold, a transport that buffers at the receiver (TCP's
    receive window) moves the message when it is sent; the start-up is still paid."""
    m = 1000
    st = _late_receive(m, eager_threshold_B=100, rendezvous_rtt_s=5e-6, unexpected_window_B=window)
    if moves_early:
        assert st.finish_s[0] == pytest.approx(5e-6 + A + m / BW)
        assert st.finish_s[1] == pytest.approx(1.0)
    else:
        assert st.finish_s[0] == pytest.approx(1.0 + 5e-6 + A + m / BW)


def test_messages_on_one_channel_do_not_overtake():
    def sender(ctx):
        hs = [ctx.isend(1, vec(4000 if i == 0 else 4, float(i))) for i in range(3)]
        yield ctx.waitall(hs)

    def receiver(ctx):
        got = yield ctx.waitall([ctx.irecv(0) for _ in range(3)])
        return [float(g.values[0]) for g in got]

    st = sim(eager_threshold_B=100).run([sender, receiver])  # first is rendezvous, later eager
    assert st.results[1] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("early", [0, 1, 2, 3])
def test_receives_posted_before_the_sends_match_in_posting_order(early):
    """``early`` receives wait before any send (one alone, or a queue), the
    rest are posted after the sends: every receive gets its send in order."""
    def receiver(ctx):
        hs = [ctx.irecv(1) for _ in range(early)]
        yield from _sleep(ctx, 1.0)
        hs += [ctx.irecv(1) for _ in range(3 - early)]
        got = yield ctx.waitall(hs)
        return [float(g.values[0]) for g in got]

    def sender(ctx):
        yield from _sleep(ctx, 0.5)
        yield ctx.waitall([ctx.isend(0, vec(4000 if i == 1 else 4, float(i))) for i in range(3)])

    st = sim(eager_threshold_B=100).run([receiver, sender])
    assert st.results[0] == [0.0, 1.0, 2.0]


def test_tags_separate_channels():
    def sender(ctx):
        yield ctx.waitall([ctx.isend(1, vec(4, 1.0), tag=1), ctx.isend(1, vec(4, 2.0), tag=2)])

    def receiver(ctx):
        b, a = yield ctx.waitall([ctx.irecv(0, tag=2), ctx.irecv(0, tag=1)])
        return float(a.values[0]), float(b.values[0])

    assert sim().run([sender, receiver]).results[1] == (1.0, 2.0)


def test_incast_serialises_at_the_receiver_port():
    P, m = 8, 8000

    def prog(ctx):
        if ctx.rank == 0:
            yield ctx.waitall([ctx.irecv(s) for s in range(1, P)])
        else:
            yield ctx.waitall([ctx.isend(0, vec(m))])

    st = sim().run([prog] * P)
    assert st.time_s == pytest.approx((P - 1) * (A + m / BW))


def test_full_duplex_ports():
    m = 8000

    def prog(ctx):
        other = 1 - ctx.rank
        yield ctx.waitall([ctx.irecv(other), ctx.isend(other, vec(m))])

    assert sim().run([prog, prog]).time_s == pytest.approx(A + m / BW)


def test_waitany_returns_the_first_arrival():
    def prog(ctx):
        if ctx.rank == 0:
            hs = [ctx.irecv(1), ctx.irecv(2)]
            i, got = yield ctx.waitany(hs)
            return i, ctx.now()
        if ctx.rank == 1:
            yield from _sleep(ctx, 1.0)
        yield ctx.waitall([ctx.isend(0, vec(40))])

    st = sim().run([prog] * 3)
    assert st.results[0] == (1, pytest.approx(A + 40 / BW))


def test_compute_advances_the_clock_by_the_device_model():
    prof = DeviceProfile(name="t", launch_s=1e-5, mem_bandwidth_Bps=1e9)

    def prog(ctx):
        x = np.zeros(1000, np.float32)
        yield ctx.compute("add", x, x)  # 12 kB moved
        return ctx.now()

    st = sim(device=ParametricDevice(prof)).run([prog])
    assert st.results[0] == pytest.approx(1e-5 + 12000 / 1e9)


def test_send_buffers_may_be_reused_after_posting():
    def prog(ctx):
        if ctx.rank == 0:
            buf = np.ones(4, np.float32)
            h = ctx.isend(1, Dense(buf))
            buf[:] = 7  # MPI would forbid this before completion; the simulator copied anyway
            yield ctx.waitall([h])
        else:
            (got,) = yield ctx.waitall([ctx.irecv(0)])
            return got.values.tolist()

    assert sim().run([prog, prog]).results[1] == [1, 1, 1, 1]


def test_self_messages_and_bad_peers_are_errors():
    def prog(ctx):
        ctx.isend(ctx.rank, vec(4))
        yield ctx.waitall([])

    with pytest.raises(ValueError, match="invalid peer"):
        sim().run([prog, prog])


def test_read_only_gradients_catch_in_place_writes():
    from simsparse.workload import Workload

    g = Workload(n=10).grad(0)
    with pytest.raises(ValueError):
        g[0] = 1


def _sleep(ctx, seconds):
    """Burn simulated time: on SLEEPY, zeros(n) costs n microseconds."""
    yield ctx.compute("zeros", int(round(seconds * 1e6)), like=np.zeros(1, np.float32))


def test_a_busy_receiver_does_not_block_the_senders_other_messages():
    """Backfilling: 0->1 must wait for 1's port (busy with 2->1), but 0->3,
    posted after it, moves at once instead of queueing behind it."""
    big, small = 100000, 40

    def prog(ctx):
        r = ctx.rank
        if r == 2:
            yield ctx.waitall([ctx.isend(1, vec(big))])
        elif r == 0:
            yield from _sleep(ctx, 1e-6)
            h1, h3 = ctx.isend(1, vec(small)), ctx.isend(3, vec(small))
            yield ctx.waitall([h3])
            t3 = ctx.now()
            yield ctx.waitall([h1])
            return t3, ctx.now()
        elif r == 1:
            yield ctx.waitall([ctx.irecv(2), ctx.irecv(0)])
        else:
            yield ctx.waitall([ctx.irecv(0)])

    t3, t1 = sim().run([prog] * 4).results[0]
    assert t3 == pytest.approx(1e-6 + A + small / BW)
    assert t1 == pytest.approx(A + big / BW + A + small / BW)


def test_memo_kernels_run_once_but_charge_every_rank(monkeypatch):
    """All ranks decompress-and-sum the same gathered blocks: computed once,
    identical results, each rank's clock charged by the device model."""
    from simsparse.algorithms.collectives import Allgather
    from simsparse.compute import kernels

    import functools

    calls = {"n": 0}
    real = kernels.KERNELS["scatter_add"].numpy

    @functools.wraps(real)
    def counting(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(kernels.KERNELS["scatter_add"], "numpy", counting)
    P = 4
    prof = DeviceProfile(name="t", launch_s=1e-6, mem_bandwidth_Bps=1e9)
    from simsparse.ops import COO

    def prog(ctx):
        x = np.arange(8, dtype=np.float32) * (ctx.rank + 1)  # a different, writable input per rank
        blk = COO(np.array([ctx.rank], np.int32), np.array([1.0], np.float32), 8)
        blocks = yield Allgather(blk)
        out = yield ctx.compute("scatter_add", blocks, 8, like=x)
        return out, ctx.now()

    st = Simulator(AlphaBetaNetwork(A, BW), device=ParametricDevice(prof)).run([prog] * P)
    assert calls["n"] == 1
    outs = [r[0] for r in st.results]
    np.testing.assert_array_equal(outs[0], [1, 1, 1, 1, 0, 0, 0, 0])
    assert all(o is outs[0] for o in outs) and not outs[0].flags.writeable
    assert len({r[1] for r in st.results}) == 1 and st.results[0][1] > 2 * A  # charged, after the allgather


def test_memo_keys_of_many_blocks_are_one_digest_of_their_contents():
    """A tuple of P read-only blocks (a bulk allgather's result) is keyed by
    one digest: equal contents give equal keys, one changed value another."""
    from simsparse.backends.events.memo import _DIGEST_PARTS, _memo_key

    def blocks(change=None):
        out = []
        for i in range(_DIGEST_PARTS + 4):
            a = np.arange(5, dtype=np.float32) + i
            if i == change:
                a[2] += 1
            a.setflags(write=False)
            out.append(a)
        return tuple(out)

    digests: dict = {}
    k1, k2, k3 = (_memo_key(("coo_concat", b), digests) for b in (blocks(), blocks(), blocks(change=7)))
    assert k1 == k2 and hash(k1) == hash(k2) and k1 != k3
    inner = k1[1][1]   # ("l", (name, blocks))
    assert inner[0] == "d" and isinstance(inner[1], bytes) and len(inner[1]) == 16   # not P keys hashed per lookup
    few = tuple(blocks()[:3])
    assert _memo_key(few, digests)[0] == "l"   # a short tuple keeps its parts
