"""The real backend against the simulator, every test file's points in one ``mpiexec`` launch per P.

Several test files check that the real backend (mpi4py + torch on the CPU)
sends the simulator's bytes, computes its results and writes its trace. A
launch's ranks each import torch and the simulator first: ``mpiexec -n 4`` of
those imports alone takes 4.7 s and 9.4 CPU-seconds on two cores, which every
test paid again. So a file registers its points at import (:func:`register`),
and the first test that asks for a point of some P measures every registered
point of that P in one launch, traced and with every rank's results dumped;
the others, in either xdist worker, read what it wrote, or its failure, which
they report without launching again (a lock on a file in the session's base
temporary folder, the pattern pytest-xdist documents for session data). Each
test then checks its own points (:func:`measured`,
:func:`check_against_simulator`).
"""
from __future__ import annotations

import fcntl
import json
from pathlib import Path

import numpy as np

#: the P of the files that check every algorithm at once
P = 4
#: test file's key -> (its points, the results' relative and absolute tolerances, whether it reads the speed probe)
_REGISTERED: dict[str, tuple[list, float, float, bool]] = {}
#: P -> what its launch wrote, read once per worker (its rows hold every point's trace)
_READ: dict[int, tuple[dict, Path]] = {}


def register(key: str, points: list, rtol: float = 1e-5, atol: float = 1e-5, probe: bool = False) -> list:
    """Add ``points`` to the launches of their P, under ``key``; ``probe``: the launch times the host's speed
    before each point (``compute.speed_probe``; it took half the 60 points' launch at P = 4)."""
    _REGISTERED[key] = (points, rtol, atol, probe)
    return points


def _launch(P: int, tmp_path_factory, worker_id) -> tuple[dict, Path]:
    """Every registered point of ``P``: its measured row and trace (by its measured id), and the folder of the
    dumped results; measured once per session, by whichever worker asks first."""
    from simsparse.experiments.run.measure import measure_points

    if P in _READ:
        return _READ[P]

    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent   # (the workers' shared folder of this session)
    out = root / f"real_batch_{P}"
    done, failed = out / "rows.json", out / "failed.txt"
    with open(root / f"real_batch_{P}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists() and not failed.exists():
            points = list({p.point_id("mpi"): p for ps, _, _, _ in _REGISTERED.values() for p in ps
                           if p.P == P}.values())
            probe = any(pr and any(p.P == P for p in ps) for ps, _, _, pr in _REGISTERED.values())
            out.mkdir(exist_ok=True)
            try:   # each point takes about a second: a launch that stops for two minutes has hung
                got = measure_points(points, device="cpu", trace=True, speed_probe=probe, dump_results=str(out),
                                     timeout_s=120)
            except BaseException as e:   # the other tests report this launch's failure rather than launch again
                failed.write_text(f"{type(e).__name__}: {e}")
                raise
            done.write_text(json.dumps({p.point_id("mpi"): {"row": m.row, "trace": m.trace}
                                        for p, m in zip(points, got)}))
    if failed.exists():
        raise AssertionError(f"the batched real-backend launch at P = {P} failed: {failed.read_text()}")
    _READ[P] = json.loads(done.read_text()), out
    return _READ[P]


def measured(point, tmp_path_factory, worker_id) -> tuple[dict, list]:
    """A registered point's measured row and trace."""
    got = _launch(point.P, tmp_path_factory, worker_id)[0][point.point_id("mpi")]
    return got["row"], got["trace"]


def check_against_simulator(key: str, tmp_path_factory, worker_id) -> None:
    """``key``'s points measured (one launch for every file) and simulated: both correct, the same bytes
    and messages, and every rank's result the same within the registered tolerances."""
    from simsparse.experiments.config.point import to_dense
    from simsparse.experiments.run.runner import simulate_point

    points, rtol, atol, _ = _REGISTERED[key]
    for point in points:
        rows, out = _launch(point.P, tmp_path_factory, worker_id)
        row, s = rows[point.point_id("mpi")]["row"], simulate_point(point, keep_results=True)
        label = (point.algorithm, point.params, point.workload["density"])
        assert row["backend"] == "mpi" and row["time_s"] > 0, label
        assert row["correct"] is True and s.row["correct"] is True, label
        for col in ("bytes_total", "bytes_sent_max", "msgs_total"):
            assert row[col] == s.row[col], (label, col)
        dumped = np.load(out / f"{point.point_id('mpi')}.npz")
        n = point.workload["n"]
        for r in range(point.P):
            np.testing.assert_allclose(dumped[f"arr_{r}"], to_dense(s.results[r], n), rtol=rtol, atol=atol,
                                       err_msg=str(label))
