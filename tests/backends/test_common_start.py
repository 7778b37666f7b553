"""The real backend's common start: every rank of a timed run begins at one
instant of a shared clock (simsparse.backends.real.start), run under mpiexec."""
import json
import subprocess
import sys

import pytest

from tests.helpers import requires_mpi

pytestmark = [requires_mpi, pytest.mark.mpi]

PROBE = r"""
import json, sys, time
from mpi4py import MPI
from simsparse.backends.real import start, wire
comm = MPI.COMM_WORLD
if sys.argv[1] == "measured":          # as across hosts: offsets from ping-pongs, not the shared kernel clock
    start._boot_id = lambda: f"host-{comm.Get_rank()}"
box = wire.Mailbox(comm, lambda a: a, lambda h: None)
cs = start.CommonStart(comm, box)
rows = []
for it in range(6):
    if comm.Get_rank() == it % comm.Get_size():
        time.sleep(0.004)              # one rank arrives late each time
    t = cs.wait()
    rows.append((t - cs.offset, time.perf_counter() - t))
out = comm.gather({"offset": cs.offset, "late": cs.late_s, "rows": rows}, root=0)
if comm.Get_rank() == 0:
    print(json.dumps(out))
"""


def run_probe(P, clock):
    from simsparse.experiments.run.measure import find_mpiexec

    proc = subprocess.run([find_mpiexec(), "-n", str(P), sys.executable, "-c", PROBE, clock],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("P", [2, 4])
def test_ranks_start_at_one_instant_of_the_shared_clock(P):
    out = run_probe(P, "shared")
    assert all(o["offset"] == 0.0 for o in out)
    for it in range(6):
        starts = {o["rows"][it][0] for o in out}
        assert len(starts) == 1                           # every rank computed the same start
        # and none returned before it (a rank may be late: then it says so)
        assert all(o["rows"][it][1] >= 0 for o in out)
    assert all(o["late"] >= 0 for o in out)


def test_offsets_are_measured_where_ranks_do_not_share_a_kernel():
    out = run_probe(3, "measured")
    assert out[0]["offset"] == 0.0
    # these ranks do share one clock, so a good estimate is close to 0
    assert all(abs(o["offset"]) < 2e-3 for o in out)
    for it in range(6):
        assert max(o["rows"][it][0] for o in out) - min(o["rows"][it][0] for o in out) < 1e-9


def test_measure_can_time_from_a_common_start(monkeypatch):
    from simsparse.experiments.run.measure import measure_points
    from tests.helpers import make_point

    from simsparse.experiments.run.runner import simulate_point

    point = make_point("topka", 3, n=600, density=0.05, seed=3, iterations=2, warmup=1)
    monkeypatch.setenv("SIMSPARSE_START", "common")
    (m,) = measure_points([point], device="cpu")
    assert m.row["correct"] is True and m.row["start_late_s"] >= 0 and m.row["time_s"] > 0
    s = simulate_point(point).row   # (the barrier start's rows: tests/backends/test_mpi.py)
    assert (s["bytes_total"], s["msgs_total"]) == (m.row["bytes_total"], m.row["msgs_total"])
