"""Concurrency inside a rank: spawned programs, tag scopes, comm streams,
the device FIFO and the training requests, in the simulator."""
import numpy as np
import pytest

from simsparse.algorithms.dense import ring_allreduce
from simsparse.backends.events.sim import Simulator, TrainingModel
from simsparse.compute.devices import DeviceProfile, ParametricDevice
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.ops import Dense

A, BW = 1e-6, 1e9
# only "zeros" costs time on this device: 1 us per element
SLEEPY = ParametricDevice(DeviceProfile(name="sleepy", mem_bandwidth_Bps=1e30,
                                        kernels={"zeros": {"per_elem_s": 1e-6, "launch_s": 0.0}}))


def sim(**kw):
    kw.setdefault("device", SLEEPY)
    return Simulator(AlphaBetaNetwork(A, BW), **kw)


def test_two_collectives_in_flight_never_exchange_messages():
    """Two ring allreduces with the same tags run at once on every rank; each
    gets its own sum: their messages never match each other's."""
    P, n = 4, 64
    data = [[np.full(n, 10.0 * r + c, np.float32) for c in range(2)] for r in range(P)]

    def program(ctx):
        mine = data[ctx.rank]
        t1 = ctx.spawn(lambda c: ring_allreduce(c, mine[0].copy()), lane="a")
        t2 = ctx.spawn(lambda c: ring_allreduce(c, mine[1].copy()), lane="b")
        a, b = yield ctx.waitall([t1, t2])
        return a, b

    st = sim().run([program] * P)
    for a, b in st.results:
        np.testing.assert_allclose(a, sum(10.0 * r for r in range(P)))
        np.testing.assert_allclose(b, sum(10.0 * r + 1 for r in range(P)))


def test_same_tag_in_main_and_task_do_not_match():
    """A message sent by a spawned program is not received by the peer's main
    program on the same tag (different tag scopes)."""
    def program(ctx):
        if ctx.rank == 0:
            t = ctx.spawn(lambda c: _send(c, 1, 1.0))
            yield ctx.waitall([ctx.isend(1, Dense(np.full(1, 2.0, np.float32)))])
            yield ctx.waitall([t])
            return None
        (main,) = yield ctx.waitall([ctx.irecv(0)])
        t = ctx.spawn(lambda c: _recv(c, 0))
        (sub,) = yield ctx.waitall([t])
        return float(main.values[0]), float(sub.values[0])

    assert sim().run([program] * 2).results[1] == (2.0, 1.0)


def _send(ctx, dst, v):
    yield ctx.waitall([ctx.isend(dst, Dense(np.full(1, v, np.float32)))])


def _recv(ctx, src):
    (got,) = yield ctx.waitall([ctx.irecv(src)])
    return got


def test_stream_serialises_communication_but_not_compute():
    """Tasks on one stream: the second one's messages leave only after the
    first task finished; its compute ran meanwhile (device not held back)."""
    m = 4000  # bytes per message: A + m/BW = 5 us

    def task(ctx, compute_elems):
        yield ctx.compute("zeros", compute_elems, np.zeros(1, np.float32))
        if ctx.rank == 0:
            yield ctx.waitall([ctx.isend(1, Dense(np.zeros(m // 4, np.float32)))])
        else:
            yield ctx.waitall([ctx.irecv(0)])
        return ctx.now()

    def program(ctx):
        t1 = ctx.spawn(lambda c: task(c, 2), stream="comm")   # 2 us compute, then 5 us message
        t2 = ctx.spawn(lambda c: task(c, 1), stream="comm")   # 1 us compute (after t1's on the device)
        return (yield ctx.waitall([t1, t2]))

    st = sim().run([program] * 2)
    msg = A + m / BW
    e1, e2 = st.results[1]
    assert e1 == pytest.approx(2e-6 + msg)
    assert e2 == pytest.approx(e1 + msg)  # held back behind t1, although its compute ended at 3 us


def test_without_a_stream_tasks_communicate_concurrently():
    m = 4000

    def task(ctx):
        if ctx.rank == 0:
            yield ctx.waitall([ctx.isend(1, Dense(np.zeros(m // 4, np.float32)))])
        else:
            yield ctx.waitall([ctx.irecv(0)])
        return ctx.now()

    def program(ctx):
        ts = [ctx.spawn(task) for _ in range(2)]
        return (yield ctx.waitall(ts))

    st = sim().run([program] * 2)
    msg = A + m / BW
    # the alpha-beta ports serialise the two messages but no stream holds the second back
    assert sorted(st.results[1]) == pytest.approx([msg, 2 * msg])


def test_device_serialises_kernels_in_issue_order():
    """Two programs compute at once: the second kernel starts when the first ends."""
    def sleeper(ctx, elems):
        yield ctx.compute("zeros", elems, np.zeros(1, np.float32))
        return ctx.now()

    def program(ctx):
        ts = [ctx.spawn(lambda c, e=e: sleeper(c, e)) for e in (3, 2)]
        return (yield ctx.waitall(ts))

    (ends,) = sim(trace=True).run([program]).results
    assert ends == pytest.approx([3e-6, 5e-6])


def test_joining_is_required():
    def program(ctx):
        ctx.spawn(lambda c: _sleep_then_now(c, 5))
        return None
        yield

    with pytest.raises(RuntimeError, match="not joined"):
        sim().run([program])


def test_forward_and_grad_ready_charge_the_model_times():
    """Backward runs tensor by tensor in reverse registration order when the
    program asks; a tensor asked for later is ready at once."""
    model = TrainingModel(t_forward=1.0, t_backward=(0.1, 0.2, 0.4), sizes=(2, 3, 4))
    grads = [np.arange(9, dtype=np.float32)]
    seen = []

    def program(ctx):
        yield ctx.forward()
        seen.append(ctx.now())
        g2 = yield ctx.grad_ready(2)
        seen.append(ctx.now())
        g0 = yield ctx.grad_ready(0)   # runs the backward of tensors 1 and 0
        seen.append(ctx.now())
        g1 = yield ctx.grad_ready(1)   # already computed
        seen.append(ctx.now())
        return g0.tolist(), g1.tolist(), g2.tolist()

    st = sim().run([program], model, grads)
    assert seen == pytest.approx([1.0, 1.4, 1.7, 1.7])
    assert st.results[0] == ([0, 1], [2, 3, 4], [5, 6, 7, 8])
    assert st.busy[0]["forward"] == pytest.approx(1.0) and st.busy[0]["backward"] == pytest.approx(0.7)


def test_compute_issued_between_gradients_delays_the_backward():
    """OMGS Eq. 6: the backward of the next tensor starts after the
    sparsification issued after the previous one."""
    model = TrainingModel(t_forward=0.0, t_backward=(1e-6, 1e-6), sizes=(1, 1))

    def program(ctx):
        yield ctx.grad_ready(1)
        t = ctx.spawn(lambda c: _sleep_then_now(c, 5))   # 5 us on the device
        yield ctx.grad_ready(0)
        after_bwd = ctx.now()
        end = (yield ctx.waitall([t]))[0]
        return after_bwd, end

    st = sim().run([program], model, [np.zeros(2, np.float32)])
    after_bwd, end = st.results[0]
    assert end == pytest.approx(6e-6)
    assert after_bwd == pytest.approx(7e-6)


def _sleep_then_now(ctx, elems):
    yield ctx.compute("zeros", elems, np.zeros(1, np.float32))
    return ctx.now()


def test_a_deadlock_is_reported():
    def program(ctx):
        yield ctx.waitall([ctx.irecv(1 - ctx.rank)])

    with pytest.raises(RuntimeError, match="deadlock"):
        sim().run([program] * 2)
