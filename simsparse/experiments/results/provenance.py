"""What a results folder came from, written beside ``results.csv``:

* ``config.yaml``: the config file as the user wrote it;
* ``config.resolved.yaml``: every point fully resolved (network preset and
  device profile read, grid expanded), with its ``point_id``: what ran;
* ``provenance.json``: one entry per sweep that wrote the folder (a resumed
  sweep adds one): simsparse's version and git commit (``dirty`` when tracked
  files differ from it), Python and the versions of every dependency
  simsparse declares (extras included, where installed), the workload seeds,
  the host, the command, the executor and how many points it ran.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml

from ..config.schema import Experiment
from ..config.sources import REPO_ROOT
from ...files import atomic_write


def now() -> str:
    """The time as ISO 8601 UTC, to the second."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def git_commit(root: Path = REPO_ROOT) -> dict | None:
    """{commit, dirty} of the checkout simsparse runs from, or None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def dependency_versions() -> dict:
    """Installed versions of the distributions simsparse requires (with its extras)."""
    try:
        reqs = metadata.requires("simsparse") or []
    except metadata.PackageNotFoundError:
        reqs = []
    names = sorted({re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0] for r in reqs})
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def project_version() -> str:
    try:
        return metadata.version("simsparse")
    except metadata.PackageNotFoundError:
        return "unknown"


def host() -> dict:
    return {"name": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count()}


def record(exp: Experiment, command: list[str], executor: str, jobs: int, ran: int) -> dict:
    """The provenance entry of one sweep over ``exp``."""
    return {"started_at": now(), "simsparse": project_version(), "git": git_commit(),
            "python": sys.version.split()[0], "dependencies": dependency_versions(),
            "seeds": sorted({p.workload.get("seed", 0) for p in exp.points}), "host": host(),
            "command": command, "executor": executor, "jobs": jobs, "points": len(exp.points), "ran": ran}


def write(out_dir: Path, exp: Experiment, entry: dict, ident) -> list[Path]:
    """Write the config copies and append ``entry`` to ``provenance.json``."""
    out_dir = Path(out_dir)
    paths = [out_dir / "config.yaml", out_dir / "config.resolved.yaml", out_dir / "provenance.json"]
    text = Path(exp.path).read_text()
    atomic_write(paths[0], lambda tmp: Path(tmp).write_text(text))
    resolved = json.loads(json.dumps({"name": exp.name, "description": exp.description, "source": str(exp.path),
                                      "points": [{"point_id": ident(p), **p.to_dict()} for p in exp.points]},
                                     default=str))  # plain lists and mappings for YAML
    atomic_write(paths[1], lambda tmp: Path(tmp).write_text(yaml.safe_dump(resolved, sort_keys=False)))
    runs = []
    if paths[2].exists():
        try:
            runs = json.loads(paths[2].read_text()).get("runs", [])
        except (ValueError, AttributeError):
            runs = []  # unreadable: start the history again
    doc = {"config": paths[0].name, "resolved": paths[1].name, "runs": runs + [entry]}
    atomic_write(paths[2], lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=1, default=str) + "\n"))
    return paths
