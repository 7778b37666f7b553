"""Dense allreduce on the flow-level fabrics: the alpha-beta closed forms on a
non-blocking fat tree with one rank per node, and slower (in the direction the
mechanism predicts) on an oversubscribed tree and on multi-GPU nodes."""
import math

import pytest

from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point

W = 4              # float32
BW = 1e9           # link bandwidth, bytes/s
ALPHA = 2e-6       # end-to-end latency


def simulate(algorithm, P, network, n):
    pt = Point(algorithm=algorithm, P=P, workload={"n": n, "density": 0.01, "dtype": "float32", "seed": 0},
               network=network, iterations=1, warmup=0, check=True, evaluation="events")
    row = simulate_point(pt).row
    assert row["correct"] is True
    return row["time_s"]


def fattree(**kw):
    return {"model": "fattree", "radix": 8, "link_bw_Bps": BW, "send_overhead_s": ALPHA / 2,
            "recv_overhead_s": ALPHA / 2, **kw}


def closed_forms(P, n, alpha=ALPHA, beta=1 / BW):
    lg = math.log2(P)
    return {"ring": 2 * (P - 1) * alpha + 2 * (P - 1) / P * n * W * beta,
            "rabenseifner": 2 * lg * alpha + 2 * (P - 1) / P * n * W * beta,
            "recursive_doubling": lg * (alpha + n * W * beta)}


@pytest.mark.parametrize("net,P", [(fattree(), 32), (fattree(radix=4, levels=3), 16)])
def test_alpha_beta_closed_forms_on_a_non_blocking_fat_tree(net, P):
    n = 256 * P
    for name, t in closed_forms(P, n).items():
        assert simulate(name, P, net, n) == pytest.approx(t, rel=1e-9), name


def test_ring_alpha_is_the_farthest_neighbours_latency():
    # with link latencies, every ring step waits for its slowest (cross-leaf) pair: alpha = o_s + 4 links + o_r
    P, n, lat = 16, 4096, 1e-7
    t = simulate("ring", P, fattree(link_latency_s=lat), n)
    assert t == pytest.approx(closed_forms(P, n, alpha=ALPHA + 4 * lat)["ring"], rel=1e-9)


def test_a_4_to_1_oversubscribed_tree_slows_the_far_exchanges():
    """Rabenseifner and recursive doubling exchange with partners 2^j away; from
    j = log2(hosts per leaf) on, all 4 hosts of a leaf cross its one uplink at
    once. The ring with linear placement sends one flow per leaf boundary, so
    it does not notice, until a random placement makes most ring flows cross."""
    P, n = 16, 4096 * 16
    full, over = fattree(), fattree(oversubscription=4)
    for name in ("rabenseifner", "recursive_doubling"):
        assert simulate(name, P, over, n) > 1.2 * simulate(name, P, full, n), name
    assert simulate("ring", P, over, n) == pytest.approx(simulate("ring", P, full, n), rel=1e-12)
    scattered = dict(placement="random", placement_seed=1)
    assert simulate("ring", P, fattree(oversubscription=4, **scattered), n) > \
        1.2 * simulate("ring", P, fattree(**scattered), n)


def test_multi_gpu_nodes_sharing_a_nic_slow_the_off_node_exchanges():
    """4 GPUs per node over PCIe 1.5x faster than the NIC (Comet: about 10 vs
    6.8 GB/s) against one GPU per node with the same NIC: Rabenseifner's and
    recursive doubling's first two steps stay in the node, but the later ones
    send all 4 GPUs' data through one NIC. (Rabenseifner breaks even when PCIe
    is 4x the NIC: the halving steps' bytes sum to the same.) The ring (linear)
    crosses a node boundary with one flow per node, so it keeps its time;
    round-robin placement puts all 4 GPUs' flows on the NIC."""
    P, n = 16, 4096 * 16
    single = fattree()
    shared = fattree(gpus_per_node=4, pcie_bw_Bps=1.5 * BW)
    for name in ("rabenseifner", "recursive_doubling"):
        assert simulate(name, P, shared, n) > 1.2 * simulate(name, P, single, n), name
    assert simulate("ring", P, shared, n) == pytest.approx(simulate("ring", P, single, n), rel=1e-12)
    assert simulate("ring", P, fattree(gpus_per_node=4, pcie_bw_Bps=1.5 * BW, placement="round_robin"), n) > \
        2 * simulate("ring", P, single, n)
