"""Builders and routing: fat-tree structure, d-mod-k and oversubscription,
dragonfly structure and routing (minimal, Valiant, UGAL), placement, nodes."""
import numpy as np
import pytest

from simsparse.backends.events.sim import Simulator
from simsparse.network.spec import DragonflySpec, FatTreeSpec
from simsparse.network.topology import place
from simsparse.ops import Dense

M = 1 << 20


def run(spec, P, pairs, m=M):
    """Every (src, dst) pair sends m bytes at t = 0; returns the finish time."""
    sends = {}
    for s, d in pairs:
        sends.setdefault(s, []).append(d)

    def program(ctx):
        r = ctx.rank
        hs = [ctx.isend(d, Dense(np.zeros(m // 4, np.float32))) for d in sends.get(r, [])]
        hs += [ctx.irecv(s) for s, d in pairs if d == r]
        if hs:
            yield ctx.waitall(hs)

    sim = Simulator(spec.build(), None, spec.eager_threshold_B)
    return sim.run([program] * P).time_s


# -- fat trees ------------------------------------------------------------------------------

@pytest.mark.parametrize("levels,P", [(2, 8), (3, 16)])
def test_k_ary_fat_tree_counts(levels, P):
    k = 4
    m, _ = FatTreeSpec(radix=k, levels=levels).machine(P)
    t = m.topo
    if levels == 2:                      # k leaves of k/2 hosts, k/2 spines
        assert t.count("switch") == k + k // 2
        assert t.n_links == 2 * (P + k * k // 2)
    else:                                # k pods of k/2 leaves + k/2 aggs, (k/2)^2 cores: k^3/4 hosts
        assert t.count("switch") == k * k + (k // 2) ** 2
        assert t.n_links == 2 * (P + 2 * k * (k // 2) ** 2)


@pytest.mark.parametrize("levels,P", [(2, 8), (3, 16)])
def test_dmodk_shift_permutations_are_contention_free(levels, P):
    spec = FatTreeSpec(radix=4, levels=levels, link_bw_Bps=1e9)
    for shift in range(1, P):
        assert run(spec, P, [(r, (r + shift) % P) for r in range(P)]) == pytest.approx(M / 1e9, rel=1e-12)


@pytest.mark.parametrize("routing", ["dmodk", "ecmp"])
def test_oversubscribed_2_to_1_bisection_permutation_at_half_rate(routing):
    P, B = 32, 1e9
    cross = [(r, (r + P // 2) % P) for r in range(P)]     # every flow crosses the bisection
    full = run(FatTreeSpec(radix=8, link_bw_Bps=B, routing=routing), P, cross)
    half = run(FatTreeSpec(radix=8, link_bw_Bps=B, routing=routing, oversubscription=2), P, cross)
    if routing == "dmodk":
        assert full == pytest.approx(M / B, rel=1e-12)
        assert half == pytest.approx(2 * M / B, rel=1e-12)
    else:   # hash collisions slow even the full tree (a known ECMP effect); 2:1 still costs at least 2x
        assert full > M / B and half >= 2 * M / B * (1 - 1e-12) and half >= full


def test_fractional_oversubscription_is_exact_in_bandwidth():
    m, _ = FatTreeSpec(radix=8, link_bw_Bps=1e9, oversubscription=3).machine(16)   # 4 hosts, 2 uplinks
    t = m.topo
    up = [t.bw[i] for i in range(t.n_links) if t.lkind[i] == "uplink" and t.label[t.src[i]] == "leaf0"]
    assert len(up) == 2 and sum(up) == pytest.approx(4 * 1e9 / 3)


def test_fat_tree_too_small_for_P_names_the_limit():
    with pytest.raises(ValueError, match="at most 4 leaves"):
        FatTreeSpec(radix=4).machine(10)
    with pytest.raises(ValueError, match="at most 4 pods"):
        FatTreeSpec(radix=4, levels=3).machine(20)


# -- dragonfly --------------------------------------------------------------------------------

def small_dragonfly(routing, **kw):
    # 9 groups of 4 routers x 2 nodes; 2 global links per router, so one link per group pair
    base = dict(groups=9, chassis_per_group=2, routers_per_chassis=2, nodes_per_router=2,
                global_links_per_router=2, injection_bw_Bps=1e10, rank1_bw_Bps=1e10, rank2_bw_Bps=1e10,
                rank2_links=1, rank3_bw_Bps=1e9, routing=routing)
    return DragonflySpec(**{**base, **kw})


def test_aries_group_structure():
    m, _ = DragonflySpec(groups=3).machine(8)
    t, f = m.topo, m.fabric
    kinds = {k: t.lkind.count(k) for k in set(t.lkind)}
    a = 6 * 16
    assert f.a == a and t.count("router") == 3 * a and m.n_endpoints == 3 * a * 4
    assert kinds["rank1"] == 3 * 6 * 16 * 15      # all-to-all inside each chassis
    assert kinds["rank2"] == 3 * 16 * 6 * 5       # all-to-all between same-slot routers of the 6 chassis
    assert f.m == a * 10 // 2                     # rank-3 links per group pair
    bw3 = [t.bw[i] for i in range(t.n_links) if t.lkind[i] == "rank3"]
    assert sum(bw3) == pytest.approx(3 * 2 * f.m * 4.7e9)   # every port used once per direction
    r2 = next(i for i in range(t.n_links) if t.lkind[i] == "rank2")
    assert t.bw[r2] == pytest.approx(3 * 5.25e9)  # 3 cables between two routers: one link


def test_minimal_routes_are_short_and_valiant_visits_an_intermediate_group():
    spec = small_dragonfly("valiant")
    m, _ = spec.machine(40)
    t = m.topo
    for a in range(0, 40, 3):
        for b in range(0, 40, 7):
            if a == b:
                continue
            kinds = [t.lkind[x] for x in m.route(a, b)]
            assert kinds.count("rank3") == (0 if a // 8 == b // 8 else 1)
            assert len(kinds) - 2 <= 5                        # <= 2 + 1 + 2 router hops
            if a // 8 != b // 8:
                inter = next(g for g in range(9) if g not in (a // 8, b // 8))
                kv = [t.lkind[x] for x in m.route(a, b, inter)]
                assert kv.count("rank3") == 2
                groups = {t.label[t.dst[x]].split(".")[0] for x in m.route(a, b, inter) if t.lkind[x] == "rank3"}
                assert f"g{inter}" in groups


def group_shift(P, per_group):
    return [(r, (r + per_group) % P) for r in range(P)]


def test_valiant_beats_minimal_under_adversarial_group_shift():
    P = 72   # every node sends to its counterpart in the next group: 8 flows per group pair
    t_min = run(small_dragonfly("minimal"), P, group_shift(P, 8))
    assert t_min == pytest.approx(8 * M / 1e9, rel=1e-9)   # all 8 on the pair's one global link
    for seed in range(3):
        assert run(small_dragonfly("valiant", routing_seed=seed), P, group_shift(P, 8)) < 0.8 * t_min
        assert run(small_dragonfly("ugal", routing_seed=seed), P, group_shift(P, 8)) < 0.8 * t_min


def test_minimal_is_as_good_or_better_under_uniform_random_traffic():
    P = 72
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(P)
        pairs = [(r, int(perm[r])) for r in range(P) if perm[r] != r]
        t_min = run(small_dragonfly("minimal"), P, pairs)
        t_val = run(small_dragonfly("valiant", routing_seed=seed), P, pairs)
        t_ugal = run(small_dragonfly("ugal", routing_seed=seed), P, pairs)
        assert t_min <= t_val * (1 + 1e-12)
        assert t_ugal <= t_val * (1 + 1e-12)


def test_dragonfly_larger_than_the_machine_is_rejected():
    with pytest.raises(ValueError, match="need 2 groups"):
        small_dragonfly("minimal", groups=1).machine(9)


# -- placement and nodes -------------------------------------------------------------------------

def test_placements():
    assert place(6, 8, 2, "linear").tolist() == [0, 1, 2, 3, 4, 5]
    assert place(6, 8, 2, "round_robin").tolist() == [0, 2, 4, 1, 3, 5]   # 3 nodes of 2 GPUs
    r = place(6, 100, 1, "random", seed=3)
    assert len(set(r.tolist())) == 6 and r.max() < 100 and r.tolist() == place(6, 100, 1, "random", 3).tolist()
    assert place(3, 8, 1, "list", endpoints=[7, 0, 3, 5]).tolist() == [7, 0, 3]
    with pytest.raises(ValueError, match="distinct"):
        place(3, 8, 1, "list", endpoints=[1, 1, 2])
    with pytest.raises(ValueError, match="do not fit"):
        place(9, 8, 1, "linear")


def test_intra_node_traffic_never_touches_a_nic_and_inter_node_traffic_does():
    for intra, kw in (("pcie", {}), ("nvlink", {"nvlink_bw_Bps": 1e11}), ("nvswitch", {"nvlink_bw_Bps": 1e11})):
        m, _ = FatTreeSpec(radix=4, gpus_per_node=4, intra=intra, **kw).machine(8)
        t = m.topo
        for a in range(4):
            for b in range(4):
                if a != b:
                    assert {t.lkind[x] for x in m.route(a, b)} <= {"pcie", "nvlink"}
                    assert "host" not in {t.lkind[x] for x in m.route(a, b)}
        assert [t.lkind[x] for x in m.route(1, 6)].count("host") == 2


def test_gpus_share_the_nodes_nic():
    # 4 GPUs of node 0 each send to the matching GPU of node 1: they share one NIC
    spec = FatTreeSpec(radix=4, gpus_per_node=4, pcie_bw_Bps=1e10, link_bw_Bps=1e9)
    assert run(spec, 8, [(g, 4 + g) for g in range(4)]) == pytest.approx(4 * M / 1e9, rel=1e-12)
    # with one NIC per GPU they do not
    spec = FatTreeSpec(radix=8, gpus_per_node=4, nics_per_node=4, pcie_bw_Bps=1e10, link_bw_Bps=1e9)
    assert run(spec, 8, [(g, 4 + g) for g in range(4)]) == pytest.approx(M / 1e9, rel=1e-12)
