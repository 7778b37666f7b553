"""Run experiment points on the real backend by launching ``mpiexec``.

**What a measured row describes.** A real run happens on this host, so the
simulator's machine description does not apply to it: points that differ
only in ``compute``, ``network`` or ``data_scale`` (simulator-only keys) are
the *same* real run (:func:`group_points`, one run per group), and the row
says ``network = host:<hostname>`` (or the name of the ``simsparse
calibrate`` profile of this host the config used), ``compute`` = the real
device (``cpu:cpu``), and has no ``net_*`` or ``data_scale`` columns
(:func:`relabel`). A training point's real run executes the simulator's merge
plan, so there the plan is part of what ran: its points group only when
their plans agree, and the row's ``plan_from`` names the simulated network
and compute the plan came from.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...backends.real.rank_env import rank_env
from ...registry import import_roots
from ..results.metrics import PointOutcome
from ..config.point import Point


#: start-up allowance of a launch (MPI, torch), on top of the first point's timeout
STARTUP_S = 60.0


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


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def measured_id(point: Point) -> str:
    """The id of a point's real run: the point without the simulator-only
    keys (``network``, ``compute``, ``data_scale``); with its merge plan for
    a training iteration (call :func:`~.plan.with_plan` first)."""
    d = point.to_dict()
    for key in ("network", "compute", "data_scale", "plan"):
        d.pop(key)
    if point.schedule is None:
        for key in ("schedule", "schedule_params", "batch_size"):
            d.pop(key)
    else:
        if point.plan is None:
            raise ValueError("measured_id: a training point needs its merge plan (experiments.run.plan.with_plan)")
        d["plan"] = list(point.plan)
    blob = json.dumps({"backend": "mpi", "run": "real", **d}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def group_points(points: list[Point]) -> dict[str, list[Point]]:
    """Points by real run (:func:`measured_id`), in config order. Training
    points must have their plans resolved."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(measured_id(p), []).append(p)
    return groups


def calibrated_name(point: Point) -> str | None:
    """The profile name when the point's network is a ``simsparse calibrate`` profile."""
    net = point.network
    if str(net.get("source", "")).startswith("simsparse calibrate"):
        return str(net.get("name") or "calibrated")
    return None


def host_label(members: list[Point]) -> str:
    for p in members:
        name = calibrated_name(p)
        if name:
            return name
    return f"host:{socket.gethostname()}"


def relabel(row: dict, members: list[Point], network: str | None = None) -> dict:
    """A measured row as what ran: this host (or the testbed ``network``
    names), not the simulated machine."""
    rep = members[0]
    out = {k: v for k, v in row.items() if not k.startswith("net_") and k != "data_scale"}
    out["point_id"] = measured_id(rep)
    out["network"] = network or host_label(members)
    if rep.schedule:
        sims = []
        for p in members:
            comp = p.compute.get("name", "custom") if p.compute else "ideal"
            sims.append(f"{p.network_spec().label()}/{comp}")
        out["plan_from"] = "; ".join(dict.fromkeys(sims))
    return out


def measure_points(points: list[Point], device: str = "auto", trace: bool = False, timeout_s: float = 900,
                   dump_results: str | None = None, members: dict | None = None, on_point=None,
                   testbed=None, speed_probe: bool = False) -> list[PointOutcome]:
    """Measure points that share P in one ``mpiexec`` launch (start-up is
    paid once). On failure, raises with the outcomes finished so far.

    With ``testbed`` (an entered :class:`simsparse.testbed.Testbed` of P
    hosts) rank i runs in host namespace i, MPI goes over TCP through the
    emulated links, ranks wait for the network without spinning, and rows
    name the testbed as their network.

    Rows and trace records are :func:`relabel`-led (``members[measured id]``:
    the config's points this run stands for; default: the point alone).
    ``on_point(point, outcome)`` is called as each point finishes. With ``speed_probe`` each row
    gains the host's speed just before the point (:mod:`simsparse.compute.speed_probe`)."""
    if not points:
        return []
    P = points[0].P
    if any(p.P != P for p in points):
        raise ValueError("measure_points: all points must have the same P")
    mpiexec = check_prerequisites()
    given = list(points)
    if any(p.schedule for p in points):
        from .plan import with_plan

        points = [with_plan(p) for p in points]  # the real run executes the simulator's merge plan
    with tempfile.TemporaryDirectory(prefix="simsparse-") as td:
        pfile, ofile = os.path.join(td, "points.json"), os.path.join(td, "out.json")
        with open(pfile, "w") as f:
            json.dump([p.to_dict() for p in points], f)
        cmd = [mpiexec, "-n", str(P), sys.executable, "-m", "simsparse.experiments.run.worker", pfile, ofile,
               "--device", device]
        if trace:
            cmd.append("--trace")
        if speed_probe:
            cmd.append("--speed-probe")
        if dump_results:
            os.makedirs(dump_results, exist_ok=True)
            cmd += ["--dump-results", dump_results]
        env = rank_env()
        roots = import_roots({n for p in points for n in (p.algorithm, p.schedule, (p.model or "").partition("(")[0])})
        if roots:  # the ranks are fresh interpreters: they import dotted-path plugins from where this one did
            env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
        if testbed is not None:
            cmd = cmd[:3] + testbed.wrap(cmd[3:])
            env.update(testbed.env)
        label = testbed.label if testbed is not None else None
        done: list[PointOutcome] = []

        def collect():  # rank 0 writes each point's result to a file of its own as the point ends
            while len(done) < len(points) and os.path.exists(point_file(ofile, len(done))):
                i = len(done)
                with open(point_file(ofile, i)) as f:
                    o = json.load(f)
                mid = measured_id(points[i])
                row = relabel(o["row"], (members or {}).get(mid) or [points[i]], label)
                tr = [{**t, "point_id": mid} for t in o["trace"]]
                done.append(PointOutcome(row, tr))
                if on_point is not None:
                    on_point(given[i], done[-1])

        failure = _launch(cmd, env, P, timeout_s, collect, lambda: len(done), len(points))
    if failure or len(done) != len(points):
        failure = failure or f"mpiexec at P={P} ended without results"
        kept = f"the {len(done)} points finished before it are kept" if done else "no point of this launch finished"
        head, _, detail = failure.partition("\n")
        raise MeasureError(f"{head}; {kept}, run the same command again to resume" + (f"; mpiexec said:\n{detail}"
                                                                                      if detail else ""), done)
    return done


def point_file(out: str, i: int) -> str:
    """Where rank 0 writes point ``i``'s result. One file per point, written once: the parent reads each
    as it appears, and never the points before it again. (One growing file of every point's trace, read
    back every half second, took the parent 0.3 s of CPU per read at 15 MB, beside the ranks on the same
    cores: docs/history/validation-journal.md, twentieth session.)"""
    return f"{out}.{i}"


def _launch(cmd, env, P: int, timeout_s: float, collect, n_done, n_points: int) -> str | None:
    """Run one mpiexec in its own session; why it failed, or None. A launch
    fails when a rank dies (mpiexec reports it and stops the others) or when
    no point finishes within ``timeout_s`` (plus :data:`STARTUP_S` for the first; a hung rank: the whole session,
    mpiexec and every rank, is stopped). Interrupts stop the session too."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, start_new_session=True)
        last, seen = time.monotonic(), 0
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    collect()
                if n_done() > seen:
                    last, seen = time.monotonic(), n_done()
                elif time.monotonic() - last > timeout_s + (STARTUP_S if seen == 0 else 0.0):
                    _stop(proc)
                    return (f"point {seen + 1} of {n_points} at P={P} did not finish within --timeout {timeout_s:g} s "
                            f"(a rank hung, or the point needs longer); stopped mpiexec and its ranks")
        finally:
            if proc.poll() is None:  # an interrupt or an error here: leave no rank behind
                _stop(proc)
        collect()
        if proc.returncode == 0:
            return None
        out.seek(0)
        err.seek(0)
        text = (err.read() + out.read()).strip()
        died = re.search(r"EXIT STRING: (.+)|EXIT CODE: (\d+)", text)
        pid = re.search(r"PID (\d+) RUNNING", text)
        failed = re.search(r"^rank \d+: point .*", text, re.M)  # the worker's own line (worker._abort)
        if failed:
            what = f"{failed.group(0)[:400]}"
        elif died:
            what = (f"a rank{f' (pid {pid.group(1)})' if pid else ''} died during point {n_done() + 1} of {n_points} "
                    f"({(died.group(1) or 'exit code ' + died.group(2)).strip()})")
        elif not text:   # no rank reported an error and mpiexec said nothing: a rank ended without a word
            what = (f"a rank most likely died during point {n_done() + 1} of {n_points} (mpiexec exit "
                    f"{proc.returncode} with no output: killed by a signal, e.g. the OOM killer; see dmesg)")
        else:
            what = f"mpiexec failed (exit {proc.returncode})"
        tail = "\n".join(line for line in text.splitlines()[-15:] if line.strip("= "))
        return f"{what} at P={P}\n{tail}"


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to mpiexec's whole session (it and every rank), SIGKILL after 5 s."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
