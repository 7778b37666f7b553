"""The same kernels in the same algorithm runs, through this host's shared memory and on an emulated cluster.

    python benchmarks/bench_kernels_in_place.py [--testbed topologies/testbed_star.yaml] [--P 2]
        [--algorithms ring topka gtopk qsgd_allgather] [--sizes 10000 100000] [--repeats 3] [--spin]

Needs root (the testbed) and the [mpi] extra. ``simsparse measure --trace``
runs one config (the algorithms at the sizes, density 0.01, 5 iterations
after 2 warm-ups) ``--repeats`` times on each side, alternating: on this
host (MPICH's shared memory, ranks spinning) and on the testbed (each rank in
its namespace, TCP through veth pairs and a bridge, ranks sleeping in
``poll`` until a socket has data: ``testbed.MPI_ENV``); with ``--spin`` a
third side runs on the testbed with spinning ranks (``SIMSPARSE_WAIT=spin``),
which tells the sockets' path from the sleeps. Per algorithm, size and
kernel it prints the median over the repeats of each run's median call (wall
time, every rank, the iterations after the warm-ups) and the testbed's over the host's, with the
repeats' range. Where the ratio is above 1, a kernel timed through shared
memory misses what it costs in a testbed run: what
:func:`simsparse.calibration.calibrate` avoids by running the calibration's
algorithms on the testbed it profiles.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def medians(out: Path):
    """Per (algorithm, n, kernel) the median wall time of its calls in one measured run's measured iterations
    (``analysis.kernels.call_stats``, as ``validate`` compares them), in microseconds."""
    import pandas as pd

    from simsparse.experiments.analysis.kernels import call_stats

    r = pd.read_csv(out / "results.csv")
    t = call_stats(pd.read_csv(out / "trace.csv"), dict(zip(r.point_id, r.warmup)))
    t = t.merge(r[["point_id", "algorithm", "n"]], on="point_id")
    t["us"] = t.median_s * 1e6
    t["kernel"] = t.op.str.removeprefix("compute:")
    return t.set_index(["algorithm", "n", "kernel"]).us


def main(argv=None) -> None:
    import numpy as np
    import pandas as pd
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--testbed", default="topologies/testbed_star.yaml")
    ap.add_argument("--P", type=int, default=2)
    ap.add_argument("--algorithms", nargs="+", default=["ring", "topka", "gtopk", "qsgd_allgather"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spin", action="store_true", help="a third side: the testbed with spinning ranks")
    args = ap.parse_args(argv)
    sides = {"host": ([], {}), "testbed": (["--testbed", args.testbed], {})}
    if args.spin:
        sides["testbed spin"] = (["--testbed", args.testbed], {"SIMSPARSE_WAIT": "spin"})
    load = os.getloadavg()[0]
    runs: dict = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as td:
        cfg = Path(td) / "kernels_in_place.yaml"
        cfg.write_text(yaml.safe_dump({
            "name": "kernels_in_place", "network": {"model": "alphabeta"}, "P": [args.P],
            "workload": {"n": args.sizes, "density": 0.01, "seed": 7, "drift": 0.2},
            "algorithms": args.algorithms, "iterations": 5, "warmup": 2, "check": False}))
        for i in range(args.repeats):
            for side, (flags, env) in sides.items():
                out = Path(td) / f"{side.replace(' ', '_')}{i}"
                proc = subprocess.run([sys.executable, "-m", "simsparse.cli", "measure", str(cfg), "--trace",
                                       "--no-plot", "--out", str(out), *flags], cwd=ROOT, env={**os.environ, **env},
                                      capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"measure on the {side} failed:\n{proc.stderr[-2000:]}")
                runs[side].append(medians(out))
    print(f"P = {args.P}, {args.repeats} runs a side, median call in us (median over runs); "
          f"{Path(args.testbed).name} over the host, with the runs' range; load {load:.2f} before and "
          f"{os.getloadavg()[0]:.2f} after")
    table = {}
    for side, got in runs.items():
        table[side] = pd.concat(got, axis=1).median(axis=1)
    host = pd.concat(runs["host"], axis=1)
    for side in [s for s in sides if s != "host"]:
        mine = pd.concat(runs[side], axis=1)
        ratios = mine.values[:, :, None] / host.values[:, None, :]   # every run against every run
        table[f"{side} / host"] = np.median(ratios, axis=(1, 2))
        table[f"{side} range"] = [f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(ratios.min(axis=(1, 2)), ratios.max(axis=(1, 2)))]
    print(pd.DataFrame(table).round(2).to_string())


if __name__ == "__main__":
    sys.exit(main())
