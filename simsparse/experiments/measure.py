"""Run experiment points on the real backend by launching ``mpiexec``."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .metrics import PointOutcome
from .point import Point


class MeasureError(Exception):
    """The real backend could not run (missing extra, mpiexec failure).
    ``done`` holds the outcomes of the points that finished before it failed."""

    def __init__(self, msg: str, done: list | None = None):
        super().__init__(msg)
        self.done = done or []


def find_mpiexec() -> str:
    """mpiexec of this virtual environment (the ``mpich`` wheel), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise MeasureError("simsparse measure needs mpiexec; install the real-backend extra: pip install -e '.[mpi]' "
                       "(its mpich wheel provides mpiexec inside the virtual environment).")


def check_prerequisites() -> str:
    missing = [m for m in ("mpi4py", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        raise MeasureError(f"simsparse measure needs {' and '.join(missing)}; install the real-backend extra: "
                           "pip install -e '.[mpi]'.")
    return find_mpiexec()


def measure_points(points: list[Point], device: str = "auto", trace: bool = False, timeout_s: float = 900,
                   dump_results: str | None = None) -> list[PointOutcome]:
    """Measure points that share P in one ``mpiexec`` launch (start-up is
    paid once). On failure, raises with the outcomes finished so far."""
    if not points:
        return []
    P = points[0].P
    if any(p.P != P for p in points):
        raise ValueError("measure_points: all points must have the same P")
    mpiexec = check_prerequisites()
    if any(p.schedule for p in points):
        from .plan import with_plan

        points = [with_plan(p) for p in points]  # the real run executes the simulator's merge plan
    with tempfile.TemporaryDirectory(prefix="simsparse-") as td:
        pfile, ofile = os.path.join(td, "points.json"), os.path.join(td, "out.json")
        with open(pfile, "w") as f:
            json.dump([p.to_dict() for p in points], f)
        cmd = [mpiexec, "-n", str(P), sys.executable, "-m", "simsparse.experiments.worker", pfile, ofile,
               "--device", device]
        if trace:
            cmd.append("--trace")
        if dump_results:
            os.makedirs(dump_results, exist_ok=True)
            cmd += ["--dump-results", dump_results]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s * len(points), env=env)
            failure = None if proc.returncode == 0 else \
                f"mpiexec failed (exit {proc.returncode}) at P={P}:\n" + \
                "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        except subprocess.TimeoutExpired:
            failure = f"mpiexec timed out after {timeout_s * len(points):.0f} s at P={P}"
        done = []
        if os.path.exists(ofile):
            with open(ofile) as f:
                done = [PointOutcome(o["row"], o["trace"]) for o in json.load(f)]
    if failure or len(done) != len(points):
        raise MeasureError(failure or "mpiexec ended without results", done)
    return done
