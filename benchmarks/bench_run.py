"""What ``simsparse run`` itself takes on whole configs: wall time and the
peak memory of its process tree, with the defaults (several points one per
core where the grid is long) beside ``--jobs 1`` (one after another).

    python benchmarks/bench_run.py                      # every config, twice each way
    python benchmarks/bench_run.py --config quickstart --repeats 3

Configs:

* ``quickstart``: ``configs/quickstart.yaml`` (72 points);
* ``llama``: ``configs/llama_7b_fattree.yaml`` (4 points, up to P = 256);
* ``bert_paper_daint``: ``configs/papers/oktopk_bert.yaml`` (7 schemes) at
  P = 256 on the flow-level ``piz_daint_aries`` (as ``bench_scale.py``'s row).

Each run is ``simsparse run CONFIG --out TMP --no-plot [--jobs 1]`` in a
fresh process. The two ways alternate (default first, then ``--jobs 1``
twice, then the default), since on this VM the second of two back-to-back
runs tends to be the slower. Memory is the largest sum, over the run's
process tree (the command, its forkserver and workers), of each process's
proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``: shared pages
split among their users), sampled every 0.2 s; ``/usr/bin/time`` would give
the largest single process. The rows and the load average before and after
are printed: measure with nothing else running.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"quickstart": "configs/quickstart.yaml", "llama": "configs/llama_7b_fattree.yaml",
           "bert_paper_daint": "configs/papers/oktopk_bert.yaml"}


def config_file(name: str, folder: Path) -> Path:
    if name != "bert_paper_daint":
        return ROOT / CONFIGS[name]
    cfg = yaml.safe_load((ROOT / CONFIGS[name]).read_text())
    cfg.update(network="piz_daint_aries", P=256)
    path = folder / "bert_paper_daint.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                parent[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def _pss_kB(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed_run(cfg: Path, jobs: str | None) -> tuple[float, float]:
    """(wall seconds, peak tree PSS in GB) of one ``simsparse run``."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "simsparse.cli", "run", str(cfg), "--out", out, "--no-plot"]
        cmd += ["--jobs", jobs] if jobs else []
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, sum(_pss_kB(p) for p in _tree(proc.pid)))
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        err = proc.stderr.read()
        if proc.returncode != 0:
            raise SystemExit(f"{cfg}: simsparse run exited {proc.returncode}:\n{err[-2000:]}")
    return wall, peak / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--repeats", type=int, default=2, help="runs each way (default 2)")
    a = ap.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'config':<18} {'jobs':<8} {'wall s (each)':<28} {'median s':>9} {'peak GB':>8}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        for name in a.config:
            cfg = config_file(name, Path(d))
            got = {"default": [], "1": []}
            order = (["default", "1", "1", "default"] * a.repeats)[:2 * a.repeats]
            for way in order:
                got[way].append(timed_run(cfg, None if way == "default" else way))
            for way, runs in got.items():
                walls = [w for w, _ in runs]
                print(f"{name:<18} {way:<8} {' '.join(f'{w:.1f}' for w in walls):<28} "
                      f"{statistics.median(walls):>9.1f} {max(m for _, m in runs):>8.2f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
