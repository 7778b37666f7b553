"""TCP flows whose acknowledgements wait in a full switch port (network/ack_queue.py)."""
import numpy as np
import pytest

from simsparse.calibration.network import fit_ack_queue
from simsparse.network.ack_queue import derated
from simsparse.network.spec import EthernetSpec
from tests.network.test_flow_model import drive, star


def tree(P=4, e=1.0):
    """Leaves of 2 hosts on a 2:1 uplink of the hosts' rate (1 byte/s)."""
    return EthernetSpec(topology="leafspine", link_bw_Bps=1.0, nodes=P, hosts_per_leaf=2, oversubscription=2,
                        switch_ports=8, routing="dmodk", ack_queue_efficiency=e)


def test_a_queued_port_keeps_its_share_for_the_flows_acked_through_a_full_port():
    # links 0 and 1 are ports fed by host links 2, 3 and 4, 5; link 6 pads the routes
    L = np.array([[2, 0, 6], [3, 0, 6], [4, 1, 6], [5, 1, 6]])
    rev = np.array([[1, 6, 6], [1, 6, 6], [-1, 6, 6], [-1, 6, 6]])   # flows 2, 3: acked through an idle link
    cap = np.array([1.0, 1.0, 9.0, 9.0, 9.0, 9.0, np.inf])
    port = np.array([True, True, False, False, False, False, False])
    got = derated(L, np.full(4, 0.5), cap, port, rev, 0.8)
    assert got[:2] == pytest.approx([0.8, 1.0])
    assert derated(L, np.full(4, 0.5), cap, np.zeros(7, bool), rev, 0.8) is None   # host links do not drop
    assert derated(L, np.full(4, 0.25), cap, port, rev, 0.8) is None               # not full: no queue
    one_input = np.array([[2, 0, 6], [2, 0, 6], [4, 1, 6], [5, 1, 6]])               # flows 0, 1 from one host
    assert derated(one_input, np.full(4, 0.5), cap, port, rev, 0.8) is None


@pytest.mark.parametrize("e", [1.0, 0.8])
def test_crossing_a_tree_both_ways_runs_at_the_efficiency(e):
    # every uplink carries two flows each way: each flow gets e / 2 of the uplink
    ends, net = drive(tree(e=e), 4, [(0.0, 0, 2, 10.0), (0.0, 1, 3, 10.0), (0.0, 2, 0, 10.0), (0.0, 3, 1, 10.0)])
    assert ends == pytest.approx([20.0 / e] * 4, rel=1e-9)
    assert ("arrays" in net.capabilities(4)) == (e == 1.0)


def test_one_way_crossing_keeps_the_uplink_rate():
    # acknowledgements return through the other leaf's idle uplink
    ends, _ = drive(tree(e=0.5), 4, [(0.0, 0, 2, 10.0), (0.0, 1, 3, 10.0)])
    assert ends == pytest.approx([20.0, 20.0], rel=1e-9)


def test_a_star_incast_is_not_slowed():
    ends, _ = drive(star(ack_queue_efficiency=0.5), 4, [(0.0, s, 0, 3.0) for s in (1, 2, 3)])
    assert ends == pytest.approx([9.0] * 3, rel=1e-9)


def test_only_the_late_acked_share_of_a_port_is_lost():
    # ports to 1 and to 0 are full with two flows each; 0 -> 1 is acked through the port to 0 and
    # 1 -> 0 through the port to 1, the other two through idle ports: each port keeps 1 - 0.5 / 2
    flows = [(0.0, 0, 1, 3.0), (0.0, 2, 1, 3.0), (0.0, 1, 0, 3.0), (0.0, 3, 0, 3.0)]
    ends, _ = drive(star(ack_queue_efficiency=0.5), 4, flows)
    assert ends == pytest.approx([8.0] * 4, rel=1e-9)


def test_the_efficiency_is_fitted_back_from_the_crossing_pattern():
    from simsparse.calibration import patterns
    from simsparse.ops import Dense

    def crossing_s(spec, m):
        a = np.zeros(m // 4, np.float32)
        _, finish = patterns.simulate(spec, None, 4, lambda c: patterns.crossing(c, lambda: Dense(a), 4))
        return max(finish) / 4

    sizes = (1 << 18, 1 << 21)
    p2p = {"crossing": [(m, crossing_s(tree(e=0.85), m)) for m in sizes]}
    assert fit_ack_queue(p2p, tree().model_dump(), 4) == pytest.approx(0.85, abs=1e-3)
    on_star = {"crossing": [(m, 1.2 * crossing_s(star(), m)) for m in sizes]}
    assert fit_ack_queue(on_star, star().model_dump(), 4) is None   # its crossing shares no port


def test_reverse_routes_first_needed_in_a_solve_may_grow_the_route_table():
    # 120 flows one way on a 16-host tree: their 120 reverse routes are first built while solving
    flows = [(0.0, r, q, 5.0) for r in range(16) for q in range(r + 1, 16)]
    ends, net = drive(tree(P=16, e=0.8), 16, flows)
    assert net._routes.n == 240 and all(np.isfinite(ends)) and min(ends) > 0
