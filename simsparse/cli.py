"""Command line: ``simsparse run | measure | compare | calibrate | topo | list``."""
from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
import sys
from pathlib import Path

from .experiments.config.schema import ConfigError, Experiment, load_config
from .files import yaml_load
from .testbed import Testbed


def entry() -> int:
    """The console script: like main(), but ends quietly when piped into `head`."""
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


def _count(noun: str):
    """An argparse type: a whole number of ``noun``, at least 1."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {noun}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n} {noun}: at least 1 is needed")
        return n
    return parse


_ranks = _count("ranks")


def _seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not s > 0:
        raise argparse.ArgumentTypeError(f"{text} s: must be a positive number of seconds")
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="simsparse", description="Simulate (and measure) sparse allreduce algorithms.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("run", "simulate every point of a config"),
                           ("measure", "run the same points for real under mpiexec (mpi4py + torch)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("config", help="experiment YAML file")
        p.add_argument("--out", help="results folder (default results/<name> for run, results/<name>_mpi for measure)")
        p.add_argument("--trace", action="store_true",
                       help="also record every operation: trace/<point>.csv, trace.csv and trace.json")
        p.add_argument("--fresh", action="store_true", help="ignore results already in the folder")
        p.add_argument("--force", action="store_true",
                       help="run even when the estimated work is past the budget (SIMSPARSE_BUDGET)")
        p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
        if name == "run":
            p.add_argument("--jobs", "-j", type=_count("jobs"),
                           help="points simulated at once (default: one per core where the grid is estimated at "
                                "10 s or more and their memory fits; 1: one after another in this process)")
            p.add_argument("--explain", action="store_true",
                           help="say, for each point, what it carries, why each evaluator is taken or declined and "
                                "what the budget estimates; run nothing")
        p.add_argument("--baseline", metavar="SERIES",
                       help="what the table's speed-up compares with: an algorithm (or 'schedule / algorithm') "
                            "of the config (default: rabenseifner, else ring, else recursive_doubling)")
        if name == "measure":
            p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                           help="where tensors live (auto: CUDA when torch sees a GPU)")
            p.add_argument("--timeout", type=float, default=900,
                           help="seconds a point may take (the first 60 s more, for start-up); then mpiexec and its "
                                "ranks are stopped, finished points kept")
            p.add_argument("--oversubscribe", action="store_true",
                           help="allow more ranks than cores (they share cores, and the times show it)")
            p.add_argument("--testbed", metavar="SPEC",
                           help="run on the emulated cluster SPEC describes (an Ethernet network YAML or preset; "
                                "needs root): rank i in host namespace i, MPI over TCP through shaped links")
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
    p.add_argument("--testbed", metavar="SPEC", help="calibrate on the emulated cluster SPEC describes (needs root); "
                                                     "the profile is SPEC with the measured per-message costs")
    p = sub.add_parser("list", help="list algorithms (with their parameters), schedules, models, device profiles "
                                    "and network presets; with names, the details of each")
    p.add_argument("names", nargs="*", metavar="NAME", help="an algorithm, schedule, model, profile or preset")
    p = sub.add_parser("topo", help="summarise (and draw) the machine a network preset builds for P ranks")
    p.add_argument("network", help="preset name (e.g. piz_daint_aries) or network YAML file")
    p.add_argument("-P", type=_ranks, default=16, help="number of ranks, at least 1 (default 16)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset key (repeatable)")
    p.add_argument("--draw", metavar="PNG", help="draw the part of the machine that holds the ranks to this PNG")
    _add_analysis_parsers(sub)
    _add_testbed_parsers(sub)
    _add_papers_parser(sub)
    _add_model_parser(sub)
    p = sub.add_parser("report", help="render the docs' measured figures (the tables of docs/reports/, the "
                                      "README's headline lines) from the results stored under docs/data/")
    p.add_argument("--data", default="docs/data", help="where the stored results are (default docs/data)")
    p.add_argument("--store-validation", action="append", default=[], metavar="DIR",
                   help="first keep the validate run whose comparison folder is DIR (its compare.csv and "
                        "validate.json) under DATA/validation/ (repeatable)")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--docs", default="docs")
    args = ap.parse_args(argv)
    with _signals_as_interrupts() as received:
        return _dispatch(args, received)


@contextlib.contextmanager
def _signals_as_interrupts():
    """SIGTERM (and SIGINT) raise KeyboardInterrupt in the main thread, so a
    killed run unwinds like Ctrl-C: the results store stays consistent and
    mpiexec is stopped. Yields a list that receives the signal number."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, frame):
        received.append(signum)
        progress = sys.modules.get("simsparse.experiments.run.progress")
        if progress is None:
            raise KeyboardInterrupt
        deferred = bool(progress.SIGNALLED)
        progress.SIGNALLED.append(signum)   # raised again when a point starts or ends
        if deferred or not _in_compiler(frame):
            raise KeyboardInterrupt

    def unraisable(u, hook=sys.unraisablehook):   # a swallowed interrupt is raised again between points
        if not (received and u.exc_type is KeyboardInterrupt):
            hook(u)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield received
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        sys.unraisablehook = old_hook
        progress = sys.modules.get("simsparse.experiments.run.progress")
        if progress is not None:   # (held for this command's runs only)
            progress.SIGNALLED.clear()


def _in_compiler(frame) -> bool:
    """Whether numba's compiler is on the stack. An interrupt raised there can
    leave an llvmlite object half built, whose finaliser then prints a
    traceback at exit (CI: SIGINT mid-run), so the first signal waits for the
    run's next point boundary; a second one interrupts at once."""
    while frame is not None:
        if frame.f_globals.get("__name__", "").partition(".")[0] in ("numba", "llvmlite"):
            return True
        frame = frame.f_back
    return False


def forget_caught_interrupt() -> None:
    """CPython 3.11 raises a flag when a KeyboardInterrupt leaves code run by
    ``exec`` of a string (numba's and dataclasses' generated code) even when a
    caller catches it, and under ``python -m`` the process then kills itself
    with SIGINT at exit whatever main returned (CI: a SIGTERM mid-run ended
    -2, not 143). The CLI has handled the interrupt, so the flag is cleared;
    where the interpreter has no such flag this does nothing."""
    import ctypes

    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ValueError, AttributeError):
        pass


def _dispatch(args, received: list) -> int:
    from .backends.evaluators import EvaluationError
    from .experiments.run.budget import BudgetError
    from .experiments.results.paths import OutsideError
    from .experiments.analysis.papers import PapersError
    from .testbed import PlanError, TestbedError

    try:
        if args.cmd == "list":
            from .experiments.analysis.catalog import list_names

            return list_names(args.names)
        if args.cmd == "topo":
            from .experiments.analysis.topo import show_topology

            return show_topology(args.network, args.P, args.set, args.draw)
        if args.cmd == "calibrate":
            return _calibrate(args)
        if args.cmd == "compare":
            from .experiments.analysis.compare import run_compare

            run_compare(args.pred, args.meas, out=args.out, plot=not args.no_plot, allow_partial=args.allow_partial,
                        pred_where=args.pred_where, meas_where=args.meas_where,
                        warn=lambda m: print(m, file=sys.stderr))
            return 0
        if args.cmd == "sweep":
            return _sweep(load_config(args.config), args)
        if args.cmd == "advise":
            return _advise(args)
        if args.cmd == "plot":
            return _plot(args)
        if args.cmd in ("testbed", "validate"):
            return _testbed_commands(args)
        if args.cmd == "papers":
            return _papers(args)
        if args.cmd == "model":
            return _model(args)
        if args.cmd == "report":
            from .experiments.analysis.docs_report import render, store_validation

            for folder in args.store_validation:
                print(f"wrote {store_validation(Path(folder), Path(args.data))}")
            for path in render(Path(args.data), Path(args.readme), Path(args.docs)):
                print(f"wrote {path}")
            return 0
        return _execute(load_config(args.config), args)
    except (ConfigError, BudgetError, OutsideError, TestbedError, PlanError, PapersError, EvaluationError) as e:
        print(f"simsparse: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        forget_caught_interrupt()
        signum = received[-1] if received else signal.SIGINT
        print(f"\nsimsparse: {signal.Signals(signum).name}: stopped; finished points are saved, run the same command "
              f"again to resume.", file=sys.stderr)
        return 128 + signum
    except MemoryError:
        print(f"simsparse: error: {_out_of_memory(args)}", file=sys.stderr)
        return 2
    except Exception as e:  # a failure of a run: say what, without a traceback
        from .experiments.run.measure import MeasureError

        if isinstance(e, MeasureError):
            print(f"simsparse: error: {e}", file=sys.stderr)
            return 2
        raise


def _out_of_memory(args) -> str:
    """What ran out of memory, under which limit, and the keys that size it."""
    from .experiments.run.budget import address_space_limit

    space = address_space_limit()
    under = f" under this process's address-space limit of {space / 1e9:.3g} GB (ulimit -v)" if space else ""
    config = getattr(args, "config", None)
    if config is None:
        lower = "lower -P" if hasattr(args, "P") else "use smaller inputs"
    else:
        lower = f"lower 'workload.n' or 'P' in {config}" + (", or set 'data_scale' below 1 (the fraction of the data "
                                                            "the simulator carries)" if args.cmd != "measure" else "")
    forced = ", with --force skipping the budget's estimate" if getattr(args, "force", False) else ""
    return f"{config or args.cmd}: simsparse {args.cmd} ran out of memory{under}{forced}; {lower}, or allow more memory."


def _execute(exp: Experiment, args) -> int:
    from .experiments.run.execute import execute

    if getattr(args, "explain", False):
        from .experiments.run.explain import explain_points

        explain_points(exp, trace=args.trace, jobs=args.jobs)
        return 0

    spec = _testbed_spec(args) if args.cmd != "run" else None
    done = execute(exp, "sim" if args.cmd == "run" else "mpi", args.out, fresh=args.fresh, trace=args.trace,
                   force=args.force, device=getattr(args, "device", "cpu"), timeout=getattr(args, "timeout", None),
                   oversubscribe=getattr(args, "oversubscribe", False),
                   testbed=(args.testbed, lambda P: Testbed(spec, P)) if spec is not None else None,
                   command=["simsparse", *sys.argv[1:]], jobs=getattr(args, "jobs", None))
    return _report(exp, done.store, done.out_dir, args, written=tuple(done.written))


def _report(exp: Experiment, store, out_dir: Path, args, written: tuple = ()) -> int:
    from .experiments.analysis.report import report

    return report(exp, store, out_dir, baseline=args.baseline, trace=args.trace, plot=not args.no_plot,
                  written=written)


# -- simsparse papers ------------------------------------------------------------------------

def _add_papers_parser(sub) -> None:
    p = sub.add_parser("papers", help="replay the seed papers' headline experiments (configs/papers/): the paper's "
                                      "numbers beside ours, with the ratio")
    p.add_argument("names", nargs="*", metavar="NAME", help="a paper (oktopk, omgs, fft, sparcml, deft) or an "
                                                            "experiment (default: all)")
    p.add_argument("--out", help="results folder (default results/papers; one subfolder per config)")
    p.add_argument("--smoke", action="store_true", help="the reduced variants (fewer ranks, less data), as CI runs")
    p.add_argument("--no-run", action="store_true", help="only read the results already there")
    p.add_argument("--no-plot", action="store_true", help="skip papers.png")
    p.add_argument("--doc", metavar="MD", help="also write the claim-by-claim table into this markdown file, "
                                               "between its '<!-- papers: begin -->' and '<!-- papers: end -->' lines "
                                               "(docs/reports/papers.md)")


def _papers(args) -> int:
    from .experiments.analysis.papers_run import main as papers_main

    return papers_main(args.names, out=args.out, smoke=args.smoke, run=not args.no_run, plot=not args.no_plot,
                       doc=args.doc)


# -- simsparse model ------------------------------------------------------------------------

def _add_model_parser(sub) -> None:
    p = sub.add_parser("model", help="a model simsparse did not ship: count its per-tensor work (import)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    q = verbs.add_parser("import", help="build a model on the meta device (no GPU, no weights), count its FLOPs, "
                                        "bytes and kernels per parameter tensor, and write the table a config's "
                                        "model key can name")
    q.add_argument("spec", help="hf:ConfigClass[(key=value, ...)], torchvision:name or package.module:function(...); "
                                "input keys: seq, vocab, image=(C, H, W), classes")
    q.add_argument("-o", "--out", required=True, metavar="JSON", help="the table to write (a .csv with "
                                                                    "--format astrasim)")
    _interchange_args(q)
    q = verbs.add_parser("profile", help="time a model on this machine's CPU or GPU (one device: the "
                                         "communication is simulated): its forward pass and each tensor's gradient "
                                         "becoming ready, and write a device profile that carries them")
    q.add_argument("spec", help="a packaged model, a preset or a spec, as `import` takes it")
    q.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    q.add_argument("--batch-size", type=int, default=None, help="samples per iteration (default: the model's)")
    q.add_argument("--reps", type=int, default=5, help="timed iterations after one warm-up; the median is kept")
    q.add_argument("--ranks", type=int, default=1,
                   help="ranks that will share this host (CPU): each times the model at once with its share of the "
                        "cores, as measure's ranks run and as calibrate times layers, by calibrate's clock (CPU "
                        "seconds with more ranks than cores) (default 1: the device alone)")
    q.add_argument("--base", required=True, metavar="PROFILE",
                   help="the device profile the measured times join (its kernels time the rest): a packaged one "
                        "(p100, h100, ...) or the one `simsparse calibrate` wrote for this machine")
    q.add_argument("-o", "--out", required=True, metavar="YAML", help="the device profile to write; a config "
                                                                    "names it as compute:")
    q = verbs.add_parser("export", help="a model's per-tensor times on a device profile as a per-layer CSV "
                                        "(name, elements, forward_s, backward_s), the table a config's model key "
                                        "also takes")
    q.add_argument("spec", help="a packaged model, a preset, a spec or a table")
    q.add_argument("--compute", required=True, metavar="PROFILE", help="the device profile that times it")
    q.add_argument("--batch-size", type=int, default=None, help="samples per iteration (default: the model's)")
    q.add_argument("-o", "--out", required=True, metavar="CSV", help="the per-layer CSV (a workload text file with "
                                                                   "--format astrasim)")
    _interchange_args(q)


def _interchange_args(q) -> None:
    q.add_argument("--format", choices=["simsparse", "astrasim", "simai"], default="simsparse",
                   help="astrasim: ASTRA-sim 1.0's data-parallel text workload; simai: SimAI's (AICB's) workload "
                        "of data parallelism alone (import: SPEC is the file; the result is a per-layer CSV a "
                        "config names)")
    q.add_argument("--cycle-s", type=float, default=1e-9, help="astrasim, simai: seconds per compute cycle "
                                                                "(default 1 ns)")
    q.add_argument("--bytes-per-element", type=int, default=4, help="astrasim, simai: bytes of one gradient "
                                                                     "element (default 4, fp32)")
    q.add_argument("--gpus", type=int, default=None, help="simai export: the data-parallel ranks (its all_gpus)")


def _model(args) -> int:
    from .files import atomic_write
    from .models.sources import ModelSpecError, table

    if args.verb in ("profile", "export") or getattr(args, "format", "") in ("astrasim", "simai"):
        try:
            if args.verb == "import":
                from .models.interchange import read_astrasim, read_simai, write_rows_csv
                read = read_simai if args.format == "simai" else read_astrasim
                rows = read(args.spec, args.cycle_s, args.bytes_per_element)
                write_rows_csv(rows, Path(args.out))
                print(f"{args.spec}: {len(rows)} layers, {sum(r['elements'] for r in rows):,} parameters; wrote "
                      f"{args.out} (a config names it as model: {{name: {args.out}}})")
                return 0
            return _model_profile(args) if args.verb == "profile" else _model_export(args)
        except (ModelSpecError, ValueError, KeyError, FileNotFoundError) as e:
            print(f"simsparse: error: model profile: {str(e).strip(chr(39))}", file=sys.stderr)
            return 2
    try:
        doc = table(args.spec)
    except ModelSpecError as e:
        print(f"simsparse: error: {e}", file=sys.stderr)
        return 2
    try:
        atomic_write(Path(args.out), lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=1) + "\n"))
    except OSError as e:
        print(f"simsparse: error: model import -o {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"{doc['spec']}: {doc['total_params']:,} parameters in {doc['num_tensors']} tensors, {doc['input']}; "
          f"per sample {doc['fwd_gflops']:.4g} GFLOP forward, {doc['bwd_gflops']:.4g} backward; wrote {args.out} "
          f"(a config names it as model: {{name: {args.out}}})")
    return 0


def _model_profile(args) -> int:
    """``simsparse model profile``: :func:`simsparse.calibration.time_layers` (one device, or ``--ranks`` N at
    once), the intervals turned into per-tensor times as ``calibrate`` turns them, written into a copy of ``--base``."""
    import platform

    import torch
    import yaml

    from .calibration import layer_times, time_layers
    from .compute.devices import load_profile
    from .compute.models import default_batch_size, is_bf16, resolve_model
    from .files import atomic_write

    spec = resolve_model(args.spec)   # (a model that cannot be built is refused before anything runs)
    batch = args.batch_size or default_batch_size(spec)
    if batch < 1 or args.reps < 1 or args.ranks < 1:
        raise ValueError("--batch-size, --reps and --ranks must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here; use --device cpu")
    base = load_profile(args.base, Path.cwd())

    raw = time_layers(args.device, [spec], batch, args.reps, args.ranks)
    _, models = layer_times(raw)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else (platform.processor() or platform.machine())
    prof = base.model_dump(exclude_none=True)
    prof["name"] = f"{base.name}+{args.device}"
    amp = is_bf16(spec)
    settings = {"device": f"{args.device} ({device})", "dtype": "bfloat16" if amp else "float32", "amp": amp,
                "compile": False,
                "torch": str(torch.__version__), "batch_size": batch, "reps": args.reps, "ranks": args.ranks}
    prof["models"] = {**prof.get("models", {}), spec: {**models[spec], "settings": settings}}
    precision = "bf16 autocast" if amp else "fp32"
    note = (f"# simsparse model profile: {spec} at batch {batch}, {precision}, eager (no torch.compile), torch "
            f"{torch.__version__}, on {args.device} ({device}); median of {args.reps} iterations after one warm-up;\n"
            f"# the rest of the profile is {args.base}'s\n")
    atomic_write(Path(args.out), lambda tmp: Path(tmp).write_text(note + yaml.safe_dump(prof, sort_keys=False)))
    m = raw[spec]
    print(f"{spec}, batch {batch}, {args.device}: forward {m['forward_s'] * 1e3:.3g} ms, backward "
          f"{sum(m['backward_s']) * 1e3:.3g} ms over {len(m['backward_s'])} tensors; wrote {args.out} "
          f"(a config names it as compute: {args.out}, with batch_size {batch})")
    return 0


def _model_export(args) -> int:
    """``simsparse model export``: :func:`~simsparse.compute.models.model_profile` as a per-layer CSV."""
    from .compute.devices import load_profile
    from .compute.models import default_batch_size, model_profile, resolve_model
    from .models.interchange import write_layer_csv

    if args.format == "simai" and (args.gpus or 0) < 1:
        raise ValueError("--format simai: give --gpus, the data-parallel ranks the workload is for (SimAI's all_gpus)")
    spec = resolve_model(args.spec)
    batch = args.batch_size or default_batch_size(spec)
    prof = model_profile(spec, batch, load_profile(args.compute, Path.cwd()))
    if args.format == "astrasim":
        from .models.interchange import write_astrasim
        write_astrasim(prof, Path(args.out), args.cycle_s, args.bytes_per_element)
    elif args.format == "simai":
        from .models.interchange import write_simai
        write_simai(prof, Path(args.out), args.gpus, args.cycle_s, args.bytes_per_element)
    else:
        write_layer_csv(prof, Path(args.out))
    print(f"{spec}, batch {batch}, on {prof.device}: {len(prof.sizes)} tensors, forward {prof.t_forward * 1e3:.4g} ms, "
          f"backward {prof.t_backward * 1e3:.4g} ms ({prof.source}); wrote {args.out}")
    return 0


# -- simsparse sweep | advise | plot -------------------------------------------------------

def _add_analysis_parsers(sub) -> None:
    from .experiments.run.sweep import EXECUTORS, default_jobs

    p = sub.add_parser("sweep", help="simulate every point of a config in parallel (local processes, MPI or Dask); "
                                     "resumable, with provenance")
    p.add_argument("config", help="experiment YAML file")
    p.add_argument("--jobs", "-j", type=_count("jobs"), default=default_jobs(),
                   help="worker processes (local, and a Dask LocalCluster; default: the cores here)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: a process pool; mpi: under `mpiexec -n N python -m mpi4py.futures -m simsparse.cli`; "
                        "dask: a Dask cluster (--scheduler, else a LocalCluster)")
    p.add_argument("--scheduler", metavar="ADDR", help="address of a Dask scheduler (tcp://host:8786)")
    p.add_argument("--format", choices=["csv", "parquet"], default="csv", help="results.csv or results.parquet")
    p.add_argument("--out", help="results folder (default results/<name>)")
    p.add_argument("--trace", action="store_true", help="also record every operation (as for run)")
    p.add_argument("--fresh", action="store_true", help="ignore results already in the folder")
    p.add_argument("--force", action="store_true",
                   help="run even when the estimated work is past the budget (SIMSPARSE_BUDGET)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    p.add_argument("--baseline", metavar="SERIES", help="what the table's speed-up compares with (as for run)")
    p = sub.add_parser("advise", help="rank every algorithm and schedule for a model on a network at P ranks")
    p.add_argument("--network", required=True, help="network preset (e.g. piz_daint_aries) or YAML file")
    p.add_argument("--model", required=True, help="model (simsparse list shows them)")
    p.add_argument("-P", type=_ranks, required=True, help="number of ranks")
    p.add_argument("--density", type=float, default=0.01, help="k/n of the sparse allreduces (default 0.01)")
    p.add_argument("--compute", default="p100", help="device profile (default p100)")
    p.add_argument("--batch-size", type=int, help="samples per rank (default: the model's)")
    p.add_argument("--sweep-P", action="store_true", help="also rank at P = 4, 8, ... up to -P: where the winner changes")
    p.add_argument("--flow", action="store_true",
                   help="simulate the collectives on the flow-level network (slower) instead of its alpha-beta fit")
    p.add_argument("--top", type=_count("choices"), default=5, help="choices explained (default 5)")
    p.add_argument("--jobs", "-j", type=_count("jobs"), default=default_jobs(), help="worker processes (default: the cores)")
    p.add_argument("--out", help="folder for the tables (default results/advise_<network>_<model>_P<N>)")
    p = sub.add_parser("plot", help="PNG plots of any results folder")
    p.add_argument("results", metavar="RESULTS", help="results folder (or its results.csv / results.parquet)")
    p.add_argument("--x", default="P", help="column on the x axis (default P)")
    p.add_argument("--y", default="time_s", help="column on the y axis (default time_s)")
    p.add_argument("--hue", default="series", help="column that tells lines apart (default: schedule / algorithm "
                                                   "and parameters)")
    p.add_argument("--where", action="append", default=[], metavar="COL=VALUE", help="keep only these rows (repeatable)")
    p.add_argument("--out", help="PNG path (default <RESULTS>/<y>_vs_<x>.png)")


def _sweep(exp: Experiment, args) -> int:
    from .experiments.run.sweep import sweep
    from .experiments.results.format import fmt_duration

    from .experiments.run import budget
    from .experiments.results.paths import results_dir

    out_dir = results_dir(exp.name, args.out)
    limits = budget.Budget.from_env()
    if not args.force:
        budget.check(exp.points, limits, "sim", args.trace, where=exp.path)
    res = sweep(exp, out_dir, executor=args.executor, jobs=args.jobs, scheduler=args.scheduler, fmt=args.format,
                fresh=args.fresh, trace=args.trace, command=["simsparse", *sys.argv[1:]],
                max_seconds=None if args.force else limits.max_seconds)
    if res.ran or res.failed:
        print(f"simsparse: {res.ran} points in {fmt_duration(res.elapsed_s)}", file=sys.stderr)
    status = _report(exp, res.store, out_dir, args, written=tuple(res.written))
    if res.failed:
        print(f"simsparse: {len(res.failed)} points failed (listed above); run the same command again to retry them",
              file=sys.stderr)
        return 1
    return status


def _advise(args) -> int:
    from .experiments.analysis.advise import advise

    return advise(args)


def _plot(args) -> int:
    from .experiments.analysis.plot import plot_results

    print(f"wrote {plot_results(args.results, args.x, args.y, args.hue, args.where, args.out)}")
    return 0


def _calibrate(args) -> int:
    from .calibration import CalibrationError, calibrate

    spec = _testbed_spec(args)
    for r in args.ranks:
        print(f"calibrating {r} ranks on the {args.device}{' of testbed ' + args.testbed if spec else ''} ...",
              file=sys.stderr, flush=True)
        try:
            out = calibrate(args.device, r, args.out, quick=args.quick, models=args.models, batch_size=args.batch_size,
                            command="simsparse " + " ".join(sys.argv[1:]), testbed=spec)
        except CalibrationError as e:
            print(f"simsparse: error: {e}", file=sys.stderr)
            return 2
        prof = yaml_load(Path(out).read_text())
        net, fits = prof["network"], prof["fits"]
        if spec is None:
            head = (f"alpha {net['alpha_s'] * 1e6:.1f} us, bandwidth {net['bandwidth_Bps'] / 1e9:.2f} GB/s, eager up "
                    f"to {net['eager_threshold_B']} B")
        else:
            g = fits["network"]["goodput"]
            head = (f"o {(net['send_overhead_s'] + net['recv_overhead_s']) * 1e6:.0f} us, g {net['gap_s'] * 1e6:.0f} us, "
                    f"goodput {(g['measured_Bps'] or 0) / 1e6:.2f} MB/s measured, {g['model_Bps'] / 1e6:.2f} MB/s "
                    f"by framing")
            if net.get("ack_queue_efficiency", 1.0) < 1.0:
                head += f", ports acked through full ports keep {net['ack_queue_efficiency']:.0%} of their rate"
        errs = [abs(c["error"]) for c in fits["patterns"] if c["error"] is not None]
        print(f"wrote {out}: {head}; patterns within {_median(errs):.1%} of the model (median); "
              f"{len(prof['compute']['kernels'])} kernels (median |err| {_median_res(fits['kernels']):.1%}); "
              f"layers of {', '.join(fits['layers']) or 'no model'}")
    return 0


def _median(xs) -> float:
    import numpy as np

    return float(np.median(xs)) if len(xs) else float("nan")


def _testbed_spec(args):
    """The Ethernet description of ``--testbed``, checked (None without it)."""
    if not getattr(args, "testbed", None):
        return None
    from .testbed import load_spec, why_not

    reason = why_not()
    if reason:
        raise ConfigError(f"--testbed {args.testbed}: {reason}")
    return load_spec(args.testbed)


def _add_testbed_parsers(sub) -> None:
    p = sub.add_parser("testbed", help="the emulated cluster: build, remove or show the machine a network YAML "
                                       "describes (network namespaces, bridges, shaped links; needs root)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("spec", nargs="?", metavar="SPEC", help="an Ethernet network YAML or preset (status: optional)")
    p.add_argument("-P", type=_ranks, default=4, help="hosts (ranks) to build for (up; default 4)")
    p = sub.add_parser("validate", help="calibrate, predict, measure and compare a config in one command, on a "
                                        "testbed or on this host")
    p.add_argument("config", help="experiment YAML file")
    p.add_argument("--testbed", metavar="SPEC", help="the emulated cluster to run on (default: this host)")
    p.add_argument("--out", help="results folder (default results/<name>_<machine>)")
    p.add_argument("--fresh", action="store_true", help="predict and measure every point again")
    p.add_argument("--recalibrate", action="store_true",
                   help="calibrate again even where a profile of this machine exists")
    p.add_argument("--quick", action="store_true", help="a quick calibration (fewer sizes and repetitions)")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu", help="where tensors live")
    p.add_argument("--timeout", type=float, default=900, help="seconds a measured point may take")
    p.add_argument("--repeats", type=_count("repeats"), default=None,
                   help="measure the config this many times and compare each point's median repeat "
                        "(default 3 on this host, 5 on a testbed)")
    p.add_argument("--repeat-below", type=_seconds, default=None, metavar="S",
                   help="repeat only the points the first measurement timed below S seconds (default: every "
                        "point on this host, 0.2 on a testbed, where longer points are decided by the links)")
    p.add_argument("--ranks", type=_ranks, nargs="+", default=None, metavar="P",
                   help="rank counts to run instead of the config's P; the run is named <name>_p<P>")


def _testbed_commands(args) -> int:
    if args.cmd == "validate":
        from .experiments.analysis.validate import validate

        validate(args.config, args.testbed, args.out, args.fresh, args.quick, args.device, args.timeout,
                 repeats=args.repeats, recalibrate=args.recalibrate, repeat_below_s=args.repeat_below,
                 ranks=args.ranks)
        return 0
    from .testbed import commands

    if args.action != "status" and not args.spec:
        raise ConfigError(f"simsparse testbed {args.action} needs SPEC: an Ethernet network YAML or preset")
    if args.action == "up":
        return commands.up(args.spec, args.P)
    if args.action == "down":
        return commands.down(args.spec)
    return commands.status(args.spec)


def _median_res(fits: dict) -> float:
    import numpy as np

    vals = [f["residuals"]["median_rel"] for f in fits.values()]
    return float(np.median(vals)) if vals else float("nan")


if __name__ == "__main__":
    sys.exit(entry())
