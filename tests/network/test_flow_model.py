"""The flow-level model: max-min fairness, exact single-flow times, event batching,
incast versus destination rotation."""
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsparse.engine import HeapEngine
from simsparse.backends.events.sim import Simulator
from simsparse.network.maxmin import maxmin_rates
from simsparse.network.spec import DragonflySpec, EthernetSpec, FatTreeSpec
from simsparse.ops import Dense


INF = np.inf


def pad(routes, n_links):
    """Routes as a flows x hops array padded with the dummy link ``n_links``."""
    H = max(len(r) for r in routes)
    return np.array([list(r) + [n_links] * (H - len(r)) for r in routes])


def rates(routes, caps):
    return maxmin_rates(pad(routes, len(caps)), np.append(np.asarray(caps, float), INF))


# -- max-min fairness ------------------------------------------------------------------

def test_shared_bottleneck():
    # three flows through one link of capacity 9; one of them also crosses a wide link
    assert rates([[0], [0], [0, 1]], [9.0, 100.0]) == pytest.approx([3, 3, 3], rel=1e-12)


def test_parking_lot():
    # a long flow over n links, one short flow on each link: everybody gets 1/2
    n = 4
    r = rates([list(range(n))] + [[i] for i in range(n)], [1.0] * n)
    assert r == pytest.approx([0.5] * (n + 1), rel=1e-12)


def test_two_bottleneck_levels():
    # Bertsekas-Gallager style: link 0 (cap 1) holds flows a, b; link 1 (cap 10) holds b, c, d
    # a and b are limited by link 0 (1/2 each); c and d share the rest of link 1: (10 - 1/2) / 2
    r = rates([[0], [0, 1], [1], [1]], [1.0, 10.0])
    assert r == pytest.approx([0.5, 0.5, 4.75, 4.75], rel=1e-12)


def test_wide_link_space_is_compacted_without_changing_rates():
    caps = np.ones(10_000)
    caps[[17, 4242]] = [2.0, 6.0]
    r = rates([[17, 4242], [17], [4242], [4242]], caps)
    assert r == pytest.approx([1.0, 1.0, 2.5, 2.5], rel=1e-12)


@st.composite
def instances(draw):
    L = draw(st.integers(1, 6))
    caps = draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 10.0]), min_size=L, max_size=L))
    routes = draw(st.lists(st.lists(st.integers(0, L - 1), min_size=1, max_size=L, unique=True),
                           min_size=1, max_size=12))
    return routes, caps


@settings(max_examples=150, deadline=None)
@given(instances(), st.sampled_from([1e9, 2.5e9, 1.0 / 3.0]))
def test_compiled_and_numpy_solvers_agree_to_the_last_bit(inst, unit):
    """numba's maxmin_rates and the pure numpy path: the same rates."""
    from simsparse.network.maxmin import _SOLVE, maxmin_rates_numpy

    routes, caps = inst
    R, cap = pad(routes, len(caps)), np.append(np.asarray(caps, float) * unit, INF)
    assert np.array_equal(maxmin_rates(R, cap), maxmin_rates_numpy(R, cap))
    assert _SOLVE is not None   # numba is a dependency: the compiled path is the one the simulator runs


def test_the_numpy_path_is_selectable_and_simulates_the_same():
    """Inside ``jit.python`` the numpy solver runs; a flow-level run with
    shared flows (Piz Daint's adaptive routing) gives the same row."""
    from simsparse import jit
    from simsparse.experiments.run.runner import simulate_point
    from tests.helpers import make_point, net

    p = dataclasses.replace(make_point("oktopk", 8, n=20000, density=0.01), network=net("piz_daint_aries"))
    with jit.python():
        a = simulate_point(p).row
    b = simulate_point(p).row
    assert (a["time_s"], a["bytes_total"]) == (b["time_s"], b["bytes_total"])


@pytest.mark.parametrize("algorithm,preset,P", [("oktopk", "piz_daint_aries", 16), ("oktopk", "piz_daint_aries", 13),
                                                 ("oktopk", "ethernet_1g", 12), ("oktopk", "ib_fdr_fattree", 16)])
def test_the_compiled_tick_solve_gives_the_numpy_rates_at_every_solve(monkeypatch, algorithm, preset, P):
    """Every solve of a run with shared flows, compiled and in numpy on the
    same state: the same rates to the last bit, with flows kept below the
    leavers' floor and links numbered mid-run among them."""
    import dataclasses

    from simsparse.experiments.run.runner import simulate_point
    from simsparse.network import maxmin
    from simsparse.network.flow_solve import FlowSolve
    from tests.helpers import make_point, net

    assert maxmin._SOLVE_SHARED is not None
    seen = {"solves": 0, "kept": 0, "numbered": 0}
    compiled = FlowSolve._solve_compiled

    def both(self, floor):
        slots = len(self._slot_cap)
        expect = FlowSolve._solve_numpy(self, floor)   # numbers any new link first: the compiled path then finds none
        numbered = len(self._slot_cap) > slots
        self._slot_cap = self._slot_cap[:slots]        # undo it, so the compiled path numbers them itself
        self._slot_port = self._slot_port[:slots]
        self._slot[self._slot >= slots] = -1
        got = compiled(self, floor)
        assert np.array_equal(got, expect)
        seen["solves"] += 1
        seen["numbered"] += numbered
        seen["kept"] += bool(floor > 0 and (self._rate < floor * (1 - maxmin.REL_TOL)).any())
        return got

    monkeypatch.setattr(FlowSolve, "_solve_compiled", both)
    p = dataclasses.replace(make_point(algorithm, P, n=40000, density=0.01), network=net(preset))
    simulate_point(p)
    assert seen["solves"] > 50 and seen["kept"] > 0 and seen["numbered"] > 0


@settings(max_examples=150, deadline=None)
@given(instances())
def test_maxmin_is_feasible_and_every_flow_has_a_bottleneck(inst):
    """The defining property: no link is overloaded, and every flow crosses a
    saturated link on which no other flow gets more (Bertsekas-Gallager 6.5)."""
    routes, caps = inst
    r = rates(routes, caps)
    load = np.zeros(len(caps))
    for f, route in enumerate(routes):
        load[route] += r[f]
    assert np.all(load <= np.asarray(caps) * (1 + 1e-9))
    for f, route in enumerate(routes):
        ok = False
        for link in route:
            others = [r[g] for g, rt in enumerate(routes) if link in rt]
            if load[link] >= caps[link] * (1 - 1e-9) and r[f] >= max(others) * (1 - 1e-9):
                ok = True
        assert ok, f"flow {f} (rate {r[f]}) has no bottleneck link"


# -- the event-driven model on its own ---------------------------------------------------

def star(P=4, bw=1.0, **kw):
    return EthernetSpec(topology="star", link_bw_Bps=bw, nodes=P, **kw)


def drive(spec, P, flows):
    """Start (time, src, dst, bytes) flows on the model directly; returns end times."""
    net = spec.build()
    env = HeapEngine()
    net.reset(env, P)
    ends = [None] * len(flows)

    def start(i, src, dst, nb):
        def done():
            ends[i] = env.now
        net.transfer(src, dst, nb, done)

    for i, (t, src, dst, nb) in enumerate(flows):
        env.at(t, lambda a: start(*a), (i, src, dst, nb))
    env.run()
    return ends, net


def test_rates_change_when_a_flow_joins_and_leaves():
    # A (2 bytes) alone at rate 1 until 0.5; then A and B share the receiver's link at 1/2;
    # B (1 byte) ends at 2.5; A has 0.5 left at rate 1 and ends at 3.0
    ends, _ = drive(star(), 4, [(0.0, 0, 2, 2.0), (0.5, 1, 2, 1.0)])
    assert ends == pytest.approx([3.0, 2.5], rel=1e-12)


def test_one_solve_per_timestamp():
    # 7 equal flows into one receiver all start at t = 0 and end together
    ends, net = drive(star(8), 8, [(0.0, s, 0, 10.0) for s in range(1, 8)])
    assert ends == pytest.approx([70.0] * 7, rel=1e-12)
    assert net.solves == 1 and net.ticks == 2   # one tick to start them, one to end them


def test_flows_alone_on_their_links_need_no_solve():
    ends, net = drive(star(8), 8, [(0.0, s, (s + 1) % 8, 5.0) for s in range(8)])
    assert ends == pytest.approx([5.0] * 8, rel=1e-12)
    assert net.solves == 0


def fluid_reference(machine, flows):
    """End times of (start, src, dst, bytes) flows by the textbook fluid model:
    at every start or end, solve max-min for all active flows from scratch."""
    cap = np.append(machine.topo.bw_arr, INF)
    routes = [machine.route(s, d) for _, s, d, _ in flows]
    todo = sorted(range(len(flows)), key=lambda i: flows[i][0])
    rem = {}
    ends = [None] * len(flows)
    t = 0.0
    while todo or rem:
        act = sorted(rem)
        rate = rates([routes[i] for i in act], cap[:-1]) if act else []
        t_end = min((t + rem[i] / r for i, r in zip(act, rate)), default=INF)
        t_next = min(t_end, flows[todo[0]][0] if todo else INF)
        for i, r in zip(act, rate):
            rem[i] -= r * (t_next - t)
            if rem[i] <= 1e-9 * flows[i][3]:
                del rem[i]
                ends[i] = t_next
        t = t_next
        while todo and flows[todo[0]][0] <= t:
            rem[todo[0]] = float(flows[todo[0]][3])
            todo.pop(0)
    return ends


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.7]), st.integers(0, 7), st.integers(1, 7),
                          st.sampled_from([1.0, 2.0, 3.0])), min_size=1, max_size=14))
def test_event_driven_model_matches_the_fluid_reference(raw):
    """Solo and shared flows, batching per timestamp and partial re-solves give
    the same end times as re-solving everything at every event."""
    spec = FatTreeSpec(radix=4, link_bw_Bps=1.0, oversubscription=2)   # 8 hosts, 4 leaves, thin uplinks
    flows = [(t, s, (s + k) % 8, nb) for t, s, k, nb in raw]
    ends, _ = drive(spec, 8, flows)
    m, _ = spec.machine(8)
    assert ends == pytest.approx(fluid_reference(m, flows), rel=1e-9)


def test_gap_and_overheads():
    # LogGP: o_s before injection, g between injections of one endpoint, o_r after arrival
    spec = star(4, send_overhead_s=0.25, recv_overhead_s=0.5, gap_s=3.0, link_latency_s=0.125)
    ends, _ = drive(spec, 4, [(0.0, 0, 1, 1.0), (0.0, 0, 2, 1.0), (0.0, 3, 2, 0)])
    lat = 2 * 0.125
    assert ends[0] == pytest.approx(0.25 + 1.0 + lat + 0.5)
    assert ends[1] == pytest.approx(0.25 + 3.0 + 1.0 + lat + 0.5)   # injected g after the first
    assert ends[2] == pytest.approx(0.25 + lat + 0.5)               # a zero-byte message pays latency only


# -- through the simulator -----------------------------------------------------------------

def run_programs(spec, P, program):
    """Run ``program(ctx)`` on every rank; returns the iteration stats."""
    sim = Simulator(spec.build(), None, **spec.protocol())
    return sim.run([program] * P)


def payload(nbytes):
    return Dense(np.zeros(nbytes // 4, dtype=np.float32))


def one_message(src, dst, nbytes):
    def program(ctx):
        if ctx.rank == src:
            yield ctx.waitall([ctx.isend(dst, payload(nbytes))])
        elif ctx.rank == dst:
            yield ctx.waitall([ctx.irecv(src)])
    return program


M = 1 << 20
SINGLE_FLOW = [
    # (spec, P, src, dst, bottleneck B/s, sum of link latencies)
    (FatTreeSpec(radix=4, link_bw_Bps=2e9, link_latency_s=1e-7, send_overhead_s=3e-7, recv_overhead_s=2e-7),
     8, 0, 7, 2e9, 4e-7),                                             # leaf -> spine -> leaf: 4 links
    (FatTreeSpec(radix=4, levels=3, link_bw_Bps=2e9, link_latency_s=1e-7, oversubscription=2), 16, 0, 15,
     2e9, 6e-7),                                  # 3 levels: 6 links; 2:1 is one full-rate uplink of two hosts
    (EthernetSpec(link_bw_Bps=1.25e8, send_overhead_s=1e-5, recv_overhead_s=1e-5, link_latency_s=5e-7), 4, 1, 3,
     1.25e8, 1e-6),
    (FatTreeSpec(radix=4, gpus_per_node=4, pcie_bw_Bps=1e10, link_bw_Bps=5e9, intra_latency_s=5e-8,
                 link_latency_s=1e-7), 8, 0, 5, 5e9, 4 * 5e-8 + 2e-7),     # GPU -> root -> NIC -> leaf -> ... -> GPU
    (FatTreeSpec(radix=4, gpus_per_node=4, pcie_bw_Bps=1e10, link_bw_Bps=5e9, intra_latency_s=5e-8), 8, 0, 3,
     1e10, 2 * 5e-8),                                                 # inside a node: PCIe only
    (FatTreeSpec(radix=4, gpus_per_node=4, intra="nvlink", nvlink_bw_Bps=5e10, intra_latency_s=5e-8,
                 link_bw_Bps=5e9), 8, 1, 2, 5e10, 5e-8),              # inside a node: one NVLink
]


@pytest.mark.parametrize("spec,P,src,dst,bw,lat", SINGLE_FLOW)
def test_single_flow_takes_latency_plus_bytes_over_bottleneck(spec, P, src, dst, bw, lat):
    stats = run_programs(spec, P, one_message(src, dst, M))
    expect = spec.send_overhead_s + M / bw + lat + spec.recv_overhead_s
    assert stats.finish_s[dst] == pytest.approx(expect, rel=1e-12)
    assert stats.finish_s[src] == pytest.approx(expect, rel=1e-12)   # a send completes on arrival


def test_single_flow_on_a_dragonfly_between_groups():
    spec = DragonflySpec(groups=3, chassis_per_group=2, routers_per_chassis=2, nodes_per_router=1,
                         global_links_per_router=1, injection_bw_Bps=8e9, rank1_bw_Bps=6e9, rank2_bw_Bps=1e9,
                         rank2_links=3, rank3_bw_Bps=4e9, injection_latency_s=1e-7, rank1_latency_s=2e-7,
                         rank2_latency_s=3e-7, rank3_latency_s=5e-7)
    net = spec.build()
    net.reset(HeapEngine(), 12)
    links = net._m.route(0, 11)
    kinds = [net._m.topo.lkind[x] for x in links]
    assert kinds[0] == "injection" and kinds[-1] == "injection" and kinds.count("rank3") == 1
    lat = sum(net._m.topo.lat[x] for x in links)
    bw = min(net._m.topo.bw[x] for x in links)
    stats = run_programs(spec, 12, one_message(0, 11, M))
    assert stats.time_s == pytest.approx(M / bw + lat, rel=1e-12)


# -- incast and destination rotation ----------------------------------------------------------

def test_incast_takes_P_minus_1_times_m_over_B():
    P, m, B = 8, 1 << 16, 1e9
    spec = EthernetSpec(link_bw_Bps=B, eager_threshold_B=0)

    def incast(ctx):
        if ctx.rank == 0:
            yield ctx.waitall([ctx.irecv(s) for s in range(1, P)])
        else:
            yield ctx.waitall([ctx.isend(0, payload(m))])

    assert run_programs(spec, P, incast).time_s == pytest.approx((P - 1) * m / B, rel=1e-12)


def exchange(P, m, rotate):
    """All-to-all of m bytes per pair in P-1 synchronised steps: rotated (step s:
    r -> r+s, a permutation) or naive (step j: everybody sends to rank j)."""
    def program(ctx):
        r = ctx.rank
        for s in range(1, P) if rotate else range(P):
            if rotate:
                hs = [ctx.irecv((r - s) % P), ctx.isend((r + s) % P, payload(m))]
            elif r == s:
                hs = [ctx.irecv(q) for q in range(P) if q != r]
            else:
                hs = [ctx.isend(s, payload(m))]
            yield ctx.waitall(hs)
    return program


def test_destination_rotation_takes_m_over_B_per_step():
    P, m, B = 8, 1 << 16, 1e9
    spec = EthernetSpec(link_bw_Bps=B)
    rotated = run_programs(spec, P, exchange(P, m, rotate=True)).time_s
    naive = run_programs(spec, P, exchange(P, m, rotate=False)).time_s
    assert rotated == pytest.approx((P - 1) * m / B, rel=1e-12)
    assert naive == pytest.approx(P * (P - 1) * m / B, rel=1e-12)   # every step is an incast


# -- shaped links (token buckets: the testbed's tbf) ------------------------------------------

def test_a_shaped_link_lets_its_burst_pass_after_an_idle_period():
    """A token bucket of b bytes on the wire (b x payload efficiency of
    payload) refilled at the link rate: a message on idle links sends its
    first b bytes at once; a second one right behind finds the bucket empty;
    after an idle period of b / rate it is full again."""
    spec = star(P=3, bw=1.0, shaper_burst_B=100)
    b = 100 * spec.payload_efficiency()
    assert drive(spec, 3, [(0.0, 0, 1, 300)])[0] == pytest.approx([300 - b])
    ends, _ = drive(spec, 3, [(0.0, 0, 1, 300), (300 - b, 0, 1, 300), (600 - b + b, 0, 1, 300)])
    assert ends == pytest.approx([300 - b, 600 - b, 900 - b])
    assert drive(spec, 3, [(0.0, 0, 1, 60)])[0] == pytest.approx([0.0], abs=1e-9)   # within the bucket: at once
    assert drive(star(P=3, bw=1.0), 3, [(0.0, 0, 1, 300)])[0] == pytest.approx([300.0])   # a wire: no head start


def test_the_next_iteration_finds_the_buckets_the_last_one_left():
    """Iterations of a point run back to back: a reset for the same P keeps
    every bucket's level (refilled up to the last run's end), a new P starts full."""
    spec = star(P=4, bw=1.0, shaper_burst_B=100)
    b = 100 * spec.payload_efficiency()
    net = spec.build()

    def one(P, nb=300):
        env = HeapEngine()
        net.reset(env, P)
        end = []
        env.at(0.0, lambda _: net.transfer(0, 1, nb, lambda: end.append(env.now)), None)
        env.run()
        return end[0]

    assert one(4) == pytest.approx(300 - b)    # full bucket: b bytes at once
    assert one(4) == pytest.approx(300.0)      # drained by the last iteration: at the rate
    assert one(4, 50) == pytest.approx(50.0)   # still empty (the last run ended as its bucket drained)
    assert one(3) == pytest.approx(300 - b)    # another P: a fresh network


def test_a_pause_between_iterations_refills_the_buckets():
    """The real backend's common start idles the network before every run (``start_pause_s``): a reset
    with ``idle_s`` refills each bucket by idle x rate, up to its depth; the simulator passes the
    profile's pause."""
    spec = star(P=4, bw=1.0, shaper_burst_B=100)
    b = 100 * spec.payload_efficiency()
    net = spec.build()

    def one(idle, nb=300):
        env = HeapEngine()
        net.reset(env, 4, idle_s=idle)
        end = []
        env.at(0.0, lambda _: net.transfer(0, 1, nb, lambda: end.append(env.now)), None)
        env.run()
        return end[0]

    assert one(0.0) == pytest.approx(300 - b)
    assert one(40.0) == pytest.approx(260.0)          # 40 bytes back in the bucket
    assert one(1000.0) == pytest.approx(300 - b)      # full again (no deeper than b)

    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice

    calls, reset = [], net.reset

    def recorded(env, P, idle_s=0.0):
        calls.append(idle_s)
        reset(env, P, idle_s)

    def idle(ctx):
        yield ctx.delay(0.0)

    net.reset = recorded
    for pause in (None, 0.002):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e9, start_pause_s=pause))
        Simulator(net, dev).run([idle] * 4)
    assert calls == [0.0, 0.002]


def test_shaped_links_are_not_evaluated_in_bulk():
    net = star(P=4, shaper_burst_B=9000).build()
    net.reset(HeapEngine(), 4)
    assert net.capabilities(4) == frozenset()
    plain = star(P=4).build()
    plain.reset(HeapEngine(), 4)
    assert "arrays" in plain.capabilities(4)
