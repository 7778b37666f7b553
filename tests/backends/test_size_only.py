"""Size-only runs (``exact`` and ``fast`` on collectives whose times and bytes
do not depend on values) give exactly the times and bytes of runs with
values (``events``, the reference, carries them)."""
import dataclasses

import numpy as np
import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.compute.devices import load_profile
from simsparse.compute.kernels import get_kernel, phantom
from simsparse.experiments.run.resolve import values_of
from simsparse.experiments.run.runner import simulate_point

from tests.helpers import make_point, net, schedule_point

COLUMNS = ("time_s", "bytes_sent_max", "bytes_total", "msgs_total", "sim_events")


def both(point):
    full = simulate_point(dataclasses.replace(point, evaluation="events")).row
    sizes = simulate_point(dataclasses.replace(point, evaluation="exact")).row
    assert full["values"] == "full" and sizes["values"] == "sizes"
    assert full["correct"] is True and sizes["correct"] is None   # size-only runs are not checked
    for col in COLUMNS:   # (events counted alike where the events or the rounds timed both)
        if col != "sim_events" or sizes["evaluator"] in ("events", "rounds"):
            assert full[col] == sizes[col], col
    return full, sizes


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner", "dense_allgather"])
@pytest.mark.parametrize("P", [2, 3, 6, 8])
@pytest.mark.parametrize("preset", ["aries_alphabeta", "ib_edr_fattree", "piz_daint_aries"])
def test_dense_collectives(algorithm, P, preset):
    p = make_point(algorithm, P, n=10007, compute=load_profile("p100").model_dump(), iterations=2, warmup=1)
    both(dataclasses.replace(p, network=net(preset)))


@pytest.mark.parametrize("schedule", ["whole", "wfbp", "mg_wfbp", "dense_ovlp"])
def test_dense_schedules(schedule):
    full, sizes = both(schedule_point(schedule, "ring", P=3))
    for col in ("t_forward_s", "t_backward_s", "t_sparsify_s", "t_comm_nonoverlap_s"):
        assert full[col] == sizes[col]


def test_only_value_free_algorithms_are_size_only():
    free = {name for name, cls in ALGORITHMS.items() if cls.value_free}
    assert free == {"ring", "recursive_doubling", "rabenseifner", "dense_allgather"}
    p = make_point("topka", 4, evaluation="fast")
    assert values_of(p) == "full" and simulate_point(p).row["values"] == "full"


def test_phantoms_stay_phantoms_and_cost_no_memory():
    a = phantom(1 << 30, np.float32)          # 4 GiB logical
    assert a.nbytes == 4 << 30 and len(a[10:20]) == 10 and not a.flags.writeable
    for name, args in [("copy", (a,)), ("add", (a, a)), ("concat", ([a[:5], a[:7]],)), ("zeros", (9, a)),
                       ("add_into", (a[:3], a[:3])), ("copy_into", (a[:3], a[:3]))]:
        out = get_kernel(name).numpy(*args)
        assert type(out).__name__ == "Phantom" and out.strides == (0,)
