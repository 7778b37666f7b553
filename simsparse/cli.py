"""Command line: ``simsparse run | measure | compare | topo | list``."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import pandas as pd

from .experiments.config import ConfigError, Experiment, load_config
from .experiments.loop import TRACE_COLUMNS
from .experiments.store import ResultsStore, write_csv

TABLE_COLUMNS = ["schedule", "model", "batch_size", "merged_groups", "algorithm", "params", "P", "n", "density", "network",
                 "compute", "time_s", "t_sparsify_s", "t_comm_nonoverlap_s", "bytes_sent_max",
                 "bytes_total", "correct"]


def entry() -> int:
    """The console script: like main(), but ends quietly when piped into `head`."""
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="simsparse", description="Simulate (and measure) sparse allreduce algorithms.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("run", "simulate every point of a config"),
                           ("measure", "run the same points for real under mpiexec (mpi4py + torch)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("config", help="experiment YAML file")
        p.add_argument("--out", help="results folder (default results/<name> for run, results/<name>_mpi for measure)")
        p.add_argument("--trace", action="store_true", help="also write the per-operation trace.csv")
        p.add_argument("--fresh", action="store_true", help="ignore results already in the folder")
        p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
        if name == "measure":
            p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                           help="where tensors live (auto: CUDA when torch sees a GPU)")
            p.add_argument("--timeout", type=float, default=900, help="seconds allowed per point")
    p = sub.add_parser("compare", help="compare predicted results with measured ones, per point and per phase")
    p.add_argument("pred", metavar="PRED", help="predicted results folder (or its results.csv), from `simsparse run`")
    p.add_argument("meas", metavar="MEAS", help="measured results folder (or its results.csv), from `simsparse measure`")
    p.add_argument("--out", help="output folder (default <MEAS>/compare_<PRED folder name>)")
    p.add_argument("--no-plot", action="store_true", help="skip compare.png")
    p.add_argument("--allow-partial", action="store_true",
                   help="compare the points in common when some are in only one of PRED and MEAS")
    p.add_argument("--pred-where", action="append", default=[], metavar="COL=VALUE",
                   help="use only PRED rows with this value (repeatable), e.g. compute=p100")
    p.add_argument("--meas-where", action="append", default=[], metavar="COL=VALUE",
                   help="use only MEAS rows with this value (repeatable)")
    p = sub.add_parser("calibrate", help="microbenchmarks of this machine -> a machine profile (network + compute)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="where tensors live")
    p.add_argument("--ranks", type=int, nargs="+", default=[2], help="rank counts to calibrate (one profile each)")
    p.add_argument("--out", help="profile path; {ranks} is replaced by the rank count "
                                 "(default results/calibration/local-{ranks}r.yaml)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (about 10 s)")
    p.add_argument("--models", nargs="*", default=["resnet20_cifar10"], help="models whose layers to time")
    p.add_argument("--batch-size", type=int, default=8, help="batch size of the layer timings")
    sub.add_parser("list", help="list algorithms, schedules, models, device profiles and network presets")
    p = sub.add_parser("topo", help="summarise (and draw) the machine a network preset builds for P ranks")
    p.add_argument("network", help="preset name (e.g. piz_daint_aries) or network YAML file")
    p.add_argument("-P", type=int, default=16, help="number of ranks (default 16)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset key (repeatable)")
    p.add_argument("--draw", metavar="PNG", help="draw the instance to this PNG file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            return _list()
        if args.cmd == "topo":
            return _topo(args)
        if args.cmd == "calibrate":
            return _calibrate(args)
        if args.cmd == "compare":
            from .experiments.compare import run_compare

            run_compare(args.pred, args.meas, out=args.out, plot=not args.no_plot, allow_partial=args.allow_partial,
                        pred_where=args.pred_where, meas_where=args.meas_where,
                        warn=lambda m: print(m, file=sys.stderr))
            return 0
        return _execute(load_config(args.config), args)
    except ConfigError as e:
        print(f"simsparse: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nsimsparse: interrupted; finished points are saved, run the same command again to resume.",
              file=sys.stderr)
        return 130
    except Exception as e:  # a failure of a run: say what, without a traceback
        from .experiments.measure import MeasureError

        if isinstance(e, MeasureError):
            print(f"simsparse: error: {e}", file=sys.stderr)
            return 2
        raise


def _execute(exp: Experiment, args) -> int:
    from tqdm import tqdm

    backend = "sim" if args.cmd == "run" else "mpi"
    if backend == "sim":
        from .experiments.runner import simulate_point

        def run_batch(ps):
            return [simulate_point(ps[0], trace=args.trace)]
    else:
        from .experiments.measure import check_prerequisites, measure_points

        check_prerequisites()

        def run_batch(ps):
            return measure_points(ps, device=args.device, trace=args.trace, timeout_s=args.timeout)

    out_dir = Path(args.out) if args.out else Path("results") / (exp.name + ("" if backend == "sim" else "_mpi"))
    store = ResultsStore(out_dir, fresh=args.fresh)
    stale = store.retain({p.point_id(backend) for p in exp.points})
    if stale:
        print(f"simsparse: moved {stale} rows of points no longer in {exp.path} to {out_dir / 'results.stale.csv'}",
              file=sys.stderr)
    trace_dir = out_dir / "trace"

    def todo(p):
        pid = p.point_id(backend)
        return not store.has(pid) or (args.trace and not (trace_dir / f"{pid}.csv").exists())

    pending = [p for p in exp.points if todo(p)]
    skipped = len(exp.points) - len(pending)
    if skipped:
        print(f"simsparse: {skipped} of {len(exp.points)} points already in {store.csv}; running the other "
              f"{len(pending)}", file=sys.stderr)

    def save(outcome):
        if args.trace:
            write_csv(pd.DataFrame(outcome.trace), trace_dir / f"{outcome.row['point_id']}.csv")
        store.add(outcome.row)

    # the real backend runs all points of one P in one mpiexec launch
    batches = [[p] for p in pending] if backend == "sim" else \
        [[p for p in pending if p.P == P] for P in dict.fromkeys(p.P for p in pending)]
    with tqdm(total=len(pending), desc=f"{exp.name} [{backend}]", unit="point", disable=None, leave=False) as bar:
        for batch in batches:
            bar.set_postfix_str(f"{batch[0].algorithm} P={batch[0].P}" if len(batch) == 1 else f"P={batch[0].P}")
            try:
                outcomes = run_batch(batch)
            except Exception as e:
                for o in getattr(e, "done", []):
                    save(o)
                raise
            for o in outcomes:
                save(o)
            bar.update(len(batch))
    df = store.frame()
    if args.trace:
        from .experiments.trace_event import write_trace_json

        # point_id as text: an all-digit id would otherwise be read as a number
        parts = [pd.read_csv(trace_dir / f"{pid}.csv", dtype={"point_id": str}) for pid in df["point_id"]
                 if (trace_dir / f"{pid}.csv").exists()]
        trace = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=TRACE_COLUMNS)
        write_csv(trace, out_dir / "trace.csv")
        write_trace_json(trace, df, out_dir / "trace.json")  # the first measured iteration of each point
    _print_table(df)
    written = [store.csv]
    if not args.no_plot and not df.empty:
        from .experiments.plot import plot_time_vs_P

        written.append(plot_time_vs_P(df, out_dir / "time_vs_P.png", title=exp.name))
    if args.trace:
        written += [out_dir / "trace.csv", out_dir / "trace.json"]
    print("wrote " + ", ".join(str(w) for w in written))
    bad = df[df["correct"].astype(str) == "False"]
    if len(bad):
        print(f"simsparse: {len(bad)} points gave results that differ from the numpy reference", file=sys.stderr)
        return 1
    return 0


def _print_table(df: pd.DataFrame) -> None:
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    t = df[cols].copy()
    empty = [c for c in t.columns if not t[c].astype(str).replace("nan", "").str.len().any()]
    t = t.drop(columns=empty)
    with pd.option_context("display.max_rows", 200, "display.width", 160, "display.float_format", "{:.6g}".format):
        print(t.to_string(index=False))


def _calibrate(args) -> int:
    from .calibration import CalibrationError, calibrate

    for r in args.ranks:
        print(f"calibrating {r} ranks on the {args.device} ...", file=sys.stderr, flush=True)
        try:
            out = calibrate(args.device, r, args.out, quick=args.quick, models=args.models, batch_size=args.batch_size,
                            command="simsparse " + " ".join(sys.argv[1:]))
        except CalibrationError as e:
            print(f"simsparse: error: {e}", file=sys.stderr)
            return 2
        prof = yaml_load(out)
        net, fits = prof["network"], prof["fits"]
        print(f"wrote {out}: alpha {net['alpha_s'] * 1e6:.1f} us, bandwidth {net['bandwidth_Bps'] / 1e9:.2f} GB/s, "
              f"eager up to {net['eager_threshold_B']} B (fit median |err| "
              f"{fits['network']['residuals']['median_rel']:.1%}); {len(prof['compute']['kernels'])} kernels "
              f"(median |err| {_median_res(fits['kernels']):.1%}); layers of {', '.join(fits['layers']) or 'no model'}")
    return 0


def yaml_load(path):
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)


def _median_res(fits: dict) -> float:
    import numpy as np

    vals = [f["residuals"]["median_rel"] for f in fits.values()]
    return float(np.median(vals)) if vals else float("nan")


def _topo(args) -> int:
    import yaml

    from .experiments import config
    from .network.spec import NETWORK_SPECS
    from .network.summary import draw, summary

    over = {}
    for kv in args.set:
        key, eq, val = kv.partition("=")
        if not eq:
            raise ConfigError(f"--set {kv!r}: expected KEY=VALUE")
        over[key] = yaml.safe_load(val)
    variants = config.network_variants({"preset": args.network, **over}, Path.cwd() / "topo")
    if len(variants) != 1:
        raise ConfigError(f"topo describes one network; the overrides make {len(variants)}")
    spec = NETWORK_SPECS[variants[0]["model"]].model_validate(variants[0])
    try:
        info = summary(spec, args.P)
        if args.draw:
            draw(spec, args.P, args.draw)
    except ValueError as e:
        raise ConfigError(f"network {args.network}: {e}") from None
    width = max(map(len, info))
    for k, v in info.items():
        print(f"{k:>{width}}: {v:.6g}" if isinstance(v, float) else f"{k:>{width}}: {v}")
    if args.draw:
        print(f"wrote {args.draw}")
    return 0


def _list() -> int:
    from .algorithms import ALGORITHMS
    from .compute.devices import builtin_profiles
    from .experiments.config import TOPOLOGY_DIRS

    print("algorithms:")
    for name, cls in sorted(ALGORITHMS.items()):
        first = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        print(f"  {name:22s} {first if len(first) <= 96 else first[:93] + '...'}")
    from .compute.models import DEFAULT_BATCH, model_costs
    from .schedules import SCHEDULES

    print("schedules (a training iteration; with 'model' and 'schedules' in a config):")
    for name, cls in sorted(SCHEDULES.items()):
        first = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        kind = "dense" if cls.accepts == "dense" else "compressed"
        line = f"[{kind}] {first}"
        print(f"  {name:12s} {line if len(line) <= 106 else line[:103] + '...'}")
    print("models (per-tensor compute tables; batch size default from the model's paper):")
    for name, table in sorted(model_costs().items()):
        params = sum(t["size"] for t in table["tensors"])
        print(f"  {name:24s} {params / 1e6:8.2f}M parameters, {len(table['tensors']):3d} tensors, "
              f"batch {DEFAULT_BATCH.get(name, '-')}, {table.get('input', '')}")
    print("device profiles: ideal, " + ", ".join(builtin_profiles()))
    presets = sorted(p.stem for d in TOPOLOGY_DIRS for p in d.glob("*.yaml"))
    print("network presets: " + (", ".join(presets) or "(none)"))
    return 0


if __name__ == "__main__":
    sys.exit(entry())
