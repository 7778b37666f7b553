"""The compiled route choice of a wave on the Dragonfly
(simsparse.network.dragonfly_wave) against the model's own ``select`` and
``route``, given the same draws: every link of every message, and the
route table's latency to the last bit."""
import numpy as np
import pytest

from simsparse.network import dragonfly_wave as dw
from simsparse.network.spec import DragonflySpec

LAT = dict(injection_latency_s=1e-7, rank1_latency_s=2e-7, rank2_latency_s=2e-7, rank3_latency_s=5e-7)
MACHINES = [   # (groups, chassis, routers per chassis, nodes per router, P)
    (14, 6, 16, 4, 1024),   # Piz Daint's size, ranks placed at random
    (3, 3, 4, 2, 60),       # every router busy: minimal, detour and Valiant paths inside and between groups
    (1, 3, 4, 1, 12),       # one group: only the routing inside it
]


def _reference(net, es, ed, order, u, load):
    """Each message's links by the model's own rule, in ``order``."""
    rt, m, drawn = net._routes, net._m, dw.Drawn(u)
    rows = [None] * len(es)
    for i in order.tolist():
        drawn.i = i
        r = net.route_id(int(es[i]), int(ed[i]), m.select(int(es[i]), int(ed[i]), load, drawn))
        rows[i] = r
        for x in rt.watch[r]:
            load[x] += 1
    return rows


@pytest.mark.parametrize("routing", ["ugal", "valiant", "minimal"])
@pytest.mark.parametrize("shape", MACHINES)
def test_the_compiled_choice_routes_every_message_as_the_model_does(routing, shape):
    g, C, S, p, P = shape
    spec = DragonflySpec(groups=g, chassis_per_group=C, routers_per_chassis=S, nodes_per_router=p, routing=routing,
                         placement="random", **LAT)
    net = spec.build()
    m, eps, _, rt, _ = net.machine(P)
    net._routes, net._m, net._n_ep = rt, m, m.n_endpoints
    rng = np.random.default_rng(P)
    n = 4000
    src = rng.integers(0, P, n)
    dst = (src + 1 + rng.integers(0, P - 1, n)) % P
    es, ed = np.array(eps)[src], np.array(eps)[dst]
    order, u = rng.permutation(n), rng.random(n)
    nl = m.topo.n_links
    # flows the event path has in flight on some links: the rule must see them too
    load = (rng.integers(0, 3, nl + 1) * (rng.random(nl + 1) < 0.4)).astype(np.int64)
    watched = rt.watched if rt.watched is not None else np.zeros(nl, dtype=bool)
    L, lat = dw.wave_routes(m.fabric, watched, es, ed, order, u, load.copy(), nl)
    rows = _reference(net, es, ed, order, u, load.tolist())
    assert [tuple(x for x in row if x != nl) for row in L.tolist()] == [rt.links[r] for r in rows]
    assert lat.tolist() == rt.lat[rows].tolist()
    if routing != "minimal":   # the rule did choose detours (else the test would show little)
        assert len({len(rt.links[r]) for r in rows}) > 2
    if dw._CHOOSE is not dw._choose:   # the pure twin of the compiled pass
        L2, lat2 = dw._choose(es, ed, order, u, load.copy(), *_args(m.fabric, watched, nl))
        assert np.array_equal(L, L2) and np.array_equal(lat, lat2)


def _args(fab, watched, dummy):
    t = dw.tables(fab)
    return t.shape, t.rr, t.gw, t.land, t.glid, t.up, t.down, t.inv, t.lat, watched, dummy
