"""The real backend's send and receive path as a cost (compute.message_path):
its formats are the wire's, the simulator charges it on the ranks' cores
before a message leaves and after it arrives, and the calibration fits it
from samples and keeps the transport's line beyond it."""
import numpy as np
import pytest

from simsparse.backends.real import wire
from simsparse.calibration.fit import fit_message_path
from simsparse.compute.message_path import MessagePath, PathCost, wire_format
from simsparse.ops import COO, Bundle, Dense, Quantized, Scalars

PREFIX_FORMAT = {b"DNS1": "dense", b"DNS2": "split", b"PKL1": "packed"}


@pytest.mark.parametrize("payload", [
    Dense(np.zeros(10, np.float32)), Dense(np.zeros(1 << 14, np.float32)), Dense(np.zeros(1 << 16, np.float64)),
    COO(np.arange(5, dtype=np.int32), np.ones(5, np.float32), 100), Scalars(np.array([1, 2], np.int64)),
    Bundle((COO(np.arange(3, dtype=np.int32), np.ones(3, np.float32), 10),)),
    Quantized(np.zeros(8, np.uint8), np.ones(1, np.float32), 4, 16, 16),
], ids=lambda p: f"{type(p).__name__}-{p.nbytes}")
def test_the_format_is_the_one_the_wire_gives(payload):
    buf, _ = wire.pack(payload, np.asarray)
    assert wire_format(payload, payload.nbytes) == PREFIX_FORMAT[bytes(buf[:4])]


def _exchange_time(m, payload, cores=2, reps=3, **prof):
    from simsparse.backends.events.sim import Simulator
    from simsparse.calibration import patterns
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import AlphaBetaSpec

    net = AlphaBetaSpec(alpha_s=3e-6, bandwidth_Bps=1e9).build()
    dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=cores, **prof))
    sim = Simulator(net, dev, eager_threshold_B=1 << 30, trace=True)
    st = sim.run([lambda ctx: patterns.exchange(ctx, lambda: payload, reps)] * 2)
    return max(st.finish_s) / reps, st.trace


COSTS = {"dense": {"send_s": 20e-6, "send_per_byte_s": 1e-10, "recv_s": 8e-6, "recv_per_byte_s": 0.0},
         "packed": {"send_s": 40e-6, "recv_s": 20e-6}}


def test_the_simulator_serialises_before_the_send_and_unpacks_after_the_arrival():
    """An exchange on a core per rank: send path, then the wire, then the
    receive path, one after the other; the send's trace starts when it is
    posted (after its serialisation, as the real backend records it); a
    format the profile lacks costs like dense; without shared cores nothing
    is charged."""
    m = 4000
    dense = Dense(np.zeros(m // 4, np.float32))
    wire_s = 3e-6 + m / 1e9
    base, _ = _exchange_time(m, dense)
    assert base == pytest.approx(wire_s, rel=1e-9)
    t, trace = _exchange_time(m, dense, message_path=COSTS)
    assert t == pytest.approx(20e-6 + 1e-10 * m + wire_s + 8e-6, rel=1e-9)
    first_send = min(r.start_s for r in trace if r.op == "send")
    assert first_send == pytest.approx(20e-6 + 1e-10 * m, rel=1e-9)
    coo = COO(np.arange(m // 8, dtype=np.int32), np.ones(m // 8, np.float32), 10 * m)
    assert _exchange_time(m, coo, message_path=COSTS)[0] == pytest.approx(40e-6 + wire_s + 20e-6, rel=1e-9)
    big = Dense(np.zeros(1 << 15, np.float32))    # 128 KiB would go out uncopied: no split measured, costs as dense
    assert _exchange_time(big.nbytes, big, message_path=COSTS)[0] == pytest.approx(
        20e-6 + 1e-10 * big.nbytes + 3e-6 + big.nbytes / 1e9 + 8e-6, rel=1e-9)
    dev_only = _exchange_time(m, dense, cores=None, message_path=COSTS)[0]
    assert dev_only == pytest.approx(wire_s, rel=1e-9)


def test_two_ranks_on_one_core_share_it_for_their_paths():
    """P = 2 on one core: both serialisations share it (processor sharing),
    so each send leaves after twice its path; likewise the receives."""
    m = 4000
    dense = Dense(np.zeros(m // 4, np.float32))
    t, _ = _exchange_time(m, dense, cores=1, message_path=COSTS)
    assert t == pytest.approx(2 * (20e-6 + 1e-10 * m) + 3e-6 + m / 1e9 + 2 * 8e-6, rel=1e-9)


def test_the_fit_recovers_each_formats_line_and_needs_both_sides():
    rng = np.random.default_rng(0)
    samples = []
    for m in (100, 1000, 10_000, 100_000, 1_000_000):
        for _ in range(9):
            noise = rng.uniform(0.97, 1.03)
            samples += [("send", "packed", m, (30e-6 + 2e-10 * m) * noise), ("recv", "packed", m, 12e-6 * noise),
                        ("send", "dense", m, 10e-6 * noise)]
    samples.append(("send", "packed", 1000, 5e-3))   # a one-off first message: the band's median ignores it
    costs, fits = fit_message_path(samples)
    assert set(costs) == {"packed"}                   # dense has no receive side
    c = PathCost(**costs["packed"])
    assert c.send_s == pytest.approx(30e-6, rel=0.05) and c.send_per_byte_s == pytest.approx(2e-10, rel=0.05)
    assert c.recv_s == pytest.approx(12e-6, rel=0.05) and c.recv_per_byte_s < 1e-13
    assert fits["packed"]["send"]["bands"] == 5 and fits["packed"]["send"]["residuals"]["median_rel"] < 0.05
    mp = MessagePath(costs)
    assert mp.send_s(Dense(None), 1000) == mp.send_s(COO(None, None, 0), 1000)   # only format measured


def test_the_transports_line_is_fitted_beyond_the_path_of_its_own_messages():
    """The ping-pong's half round trip holds one send and one receive path
    (timed around those messages): alpha is what is left, the small
    exchanges' CPU per request likewise, and the profile carries the path
    the algorithms' messages took."""
    from simsparse.calibration import build_profile
    from tests.backends.test_calibration import synthetic_raw

    raw = synthetic_raw(alpha=20e-6)
    sizes = [4 << i for i in range(0, 21)]
    raw["p2p"]["path"] = [(side, "dense" if m < 1 << 16 else "split", m, t) for m in sizes
                          for side, t in (("send", 9e-6), ("recv", 6e-6))]
    raw["p2p"]["exchange"] = [(4, 60e-6), (256, 60e-6), (1024, 60e-6)]
    raw["message_path"] = [(side, fmt, m, t) for m in (100, 10_000, 1_000_000) for fmt in ("dense", "packed")
                           for side, t in (("send", 30e-6), ("recv", 15e-6))]
    raw["shared_cores"] = 2
    prof = build_profile(raw, 2, "cpu", "test")
    assert prof["network"]["alpha_s"] == pytest.approx(5e-6, rel=0.02)
    assert prof["compute"]["message_cpu_s"] == pytest.approx((60e-6 - 15e-6) / 2, rel=1e-6)
    assert prof["compute"]["message_path"]["packed"]["send_s"] == pytest.approx(30e-6, rel=1e-6)
    assert set(prof["fits"]["message_path"]["patterns"]["costs"]) == {"dense", "split"}
    raw.pop("message_path")   # no in-situ path measured: the line holds the patterns' path, as before
    prof = build_profile(raw, 2, "cpu", "test")
    assert prof["network"]["alpha_s"] == pytest.approx(20e-6, rel=0.02) and "message_path" not in prof["compute"]


def test_a_ping_pong_pays_the_path_on_both_sides_and_its_progress_beside_the_wire():
    """Half a round trip: the send path, the wire, the receive path. Each
    request's progress CPU (``message_cpu_s``) starts when it is posted --
    a send's after its serialisation -- and runs beside the transfer."""
    from simsparse.backends.events.sim import Simulator
    from simsparse.calibration import patterns
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import AlphaBetaSpec

    m = 400
    net = AlphaBetaSpec(alpha_s=4e-6, bandwidth_Bps=1e9).build()
    dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=2, message_cpu_s=9e-6,
                                         message_path={"dense": {"send_s": 8e-6, "recv_s": 5e-6}}))
    a = np.zeros(m // 4, np.float32)
    st = Simulator(net, dev, eager_threshold_B=1 << 30).run(
        [lambda ctx: patterns.pingpong(ctx, lambda: Dense(a), 5)] * 2)
    assert st.results[0] == pytest.approx(8e-6 + 4e-6 + m / 1e9 + 5e-6, rel=1e-9)


def test_a_path_off_its_line_gets_factors_per_size_band():
    """An uncopied send costs 27 us at 120 KB, about 100 at 6 MB and 120 at
    24 MB here: no line through the bands holds within 15 %, so the bands it
    misses get factors, and the model meets every band's median; bad
    factors are refused."""
    import pydantic

    band_s = {120_000: 27e-6, 600_000: 40e-6, 6_000_000: 105e-6, 24_000_000: 125e-6}
    samples = [(side, "split", m, t if side == "send" else 8e-6) for m, t in band_s.items()
               for side in ("send", "recv") for _ in range(5)]
    costs, fits = fit_message_path(samples)
    assert costs["split"].get("send_scale") and not costs["split"].get("recv_scale")
    mp = MessagePath(costs)
    big = Dense(np.zeros(1, np.float32))
    slow = MessagePath(costs, scale=1.3)   # a host slower than at calibration (DeviceProfile.slowdown)
    for m, t in band_s.items():
        assert mp.send_s(big, m) == pytest.approx(t, rel=1e-6)
        assert slow.send_s(big, m) == pytest.approx(1.3 * t, rel=1e-6)
    assert fits["split"]["send"]["residuals"]["max_rel"] < 1e-6
    with pytest.raises(pydantic.ValidationError, match="increasing"):
        PathCost(send_s=1e-5, recv_s=1e-5, send_scale=[[1000, 1.0], [100, 2.0]])


def test_the_probe_for_a_testbed_times_serialisation_and_unpacking_and_no_mpi_call():
    """PathProbe(calls=False) records the wire's pack and unpack (what the path
    costs on any transport); the MPI calls around them are not wrapped, so a
    transport's own time stays in the network's fits. Closed, it restores both."""
    from simsparse.backends.real.mpi import MPIContext
    from simsparse.calibration.probes import PathProbe

    before = (wire.Mailbox.pack, wire.unpack, MPIContext.isend, wire.Mailbox._take, wire.Mailbox._complete)
    probe = PathProbe(calls=False)
    assert MPIContext.isend is before[2] and wire.Mailbox._take is before[3] and wire.Mailbox._complete is before[4]
    box = object.__new__(wire.Mailbox)
    box.uncopied = []
    payloads = [Dense(np.ones(100, np.float32)), COO(np.arange(4, dtype=np.int32), np.ones(4, np.float32), 50)]
    for active in (False, True):
        probe.active = active
        for p in payloads:
            h = wire.Message("send", 1, 0, p.nbytes, 0.0, None, None)
            box.pack(h, p, np.asarray, True)
            out = wire.unpack(h.buf, np.asarray, h.data)
            assert out.nbytes == p.nbytes
    assert [(s[0], s[1], s[2]) for s in probe.samples] == [
        ("send", "dense", 400), ("recv", "dense", 400), ("send", "packed", 32), ("recv", "packed", 32)]
    assert all(s[3] > 0 for s in probe.samples)
    probe.close()
    assert (wire.Mailbox.pack, wire.unpack) == before[:2]


def test_the_probe_for_this_host_wraps_the_mpi_calls_and_restores_them():
    """PathProbe() (the algorithms run on the profile's own transport) times isend and the receive's
    match, receive and unpacking in place, and leaves the serialisation's functions alone."""
    from simsparse.backends.real.mpi import MPIContext
    from simsparse.calibration.probes import PathProbe

    before = (MPIContext.isend, wire.Mailbox._take, wire.Mailbox._complete, wire.Mailbox.pack, wire.unpack)
    probe = PathProbe()
    assert MPIContext.isend is not before[0] and wire.Mailbox._take is not before[1]
    assert wire.Mailbox._complete is not before[2]
    assert wire.Mailbox.pack is before[3] and wire.unpack is before[4]
    probe.close()
    assert (MPIContext.isend, wire.Mailbox._take, wire.Mailbox._complete, wire.Mailbox.pack, wire.unpack) == before


def test_empty_messages_get_a_band_of_their_own_that_a_profile_accepts():
    """Eight ranks split a selection into parts, some empty (0 payload bytes): their band is size 1, not 0."""
    samples = [(side, "packed", m, t) for side in ("send", "recv") for m, t in
               ((0, 60e-6), (0, 60e-6), (100, 20e-6), (10_000, 21e-6), (1_000_000, 120e-6))]
    costs, _ = fit_message_path(samples)
    cost = PathCost.model_validate(costs["packed"])
    assert cost.send_scale[0][0] == 1 and cost.send_scale[0][1] > 1.15   # the empty band is off the line, kept
    assert MessagePath(costs).send_s(COO(np.zeros(0, np.int32), np.zeros(0, np.float32), 10), 0) > 0
