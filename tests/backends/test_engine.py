"""The lean engine and SimPy (the reference; ``evaluation: events`` and
``events_simpy``) give identical times and bytes on a grid of algorithms,
network models and schedules."""
import dataclasses

import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.compute.devices import load_profile
from simsparse.engine import HeapEngine, SimPyEngine
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, net, schedule_point

NETWORKS = ["aries_alphabeta", "ib_edr_fattree", "piz_daint_aries", "ethernet_1g", "comet_fdr_4gpu"]
COLUMNS = ("time_s", "time_min_s", "time_max_s", "bytes_sent_max", "bytes_total", "msgs_total", "correct")


def same_on_both(point):
    rows = [simulate_point(dataclasses.replace(point, evaluation=e)).row for e in ("events_simpy", "events")]
    for col in COLUMNS:
        assert rows[0][col] == rows[1][col], col
    return rows


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm(algorithm):
    P = 8
    p = make_point(algorithm, P, n=4000, density=0.02, iterations=2, warmup=1,
                   compute=load_profile("p100").model_dump())
    same_on_both(dataclasses.replace(p, network=net("piz_daint_aries")))


@pytest.mark.parametrize("preset", NETWORKS)
@pytest.mark.parametrize("algorithm", ["ring", "oktopk", "rabenseifner"])
def test_every_network_model(preset, algorithm):
    p = make_point(algorithm, 8, n=20000, density=0.01, iterations=1)
    same_on_both(dataclasses.replace(p, network=net(preset)))


@pytest.mark.slow
@pytest.mark.parametrize("schedule,algorithm", [("wfbp", "ring"), ("dense_ovlp", "rabenseifner"),
                                                ("omgs_sgd", "topka"), ("lags_sgd", "oktopk")])
def test_schedules(schedule, algorithm):
    rows = same_on_both(schedule_point(schedule, algorithm, P=4, network=net("ethernet_1g"), data_scale=0.1))
    for col in ("t_backward_s", "t_sparsify_s", "t_comm_nonoverlap_s"):
        assert rows[0][col] == rows[1][col]


def test_engines_order_calls_alike():
    """Same time: lower priority first, then first scheduled first."""
    for eng in (HeapEngine(), SimPyEngine()):
        seen = []
        eng.at(1.0, seen.append, "late", priority=2)
        eng.at(1.0, seen.append, "a")
        eng.at(0.5, lambda _, eng=eng, seen=seen: eng.at(0.5, seen.append, "c"))
        eng.at(1.0, seen.append, "b")
        eng.run()
        assert seen == ["a", "b", "c", "late"] and eng.now == 1.0
