"""``simsparse advise``: which allreduce and schedule win for a model on a network at P ranks.

Simulating every schedule of BERT at P = 64 takes hours (a layer-wise
schedule runs ~200 collectives per iteration), so the advisor predicts in
three steps, each fast and stated in its output:

1. **Network.** A flow-level network is replaced by its alpha-beta fit at P
   ranks: a ring allreduce (2(P-1) steps of ``alpha + chunk beta``, next
   neighbours, so little contention) simulated on the network itself at two
   sizes (``--flow`` keeps the flow-level model, slower). An ``alphabeta``
   network is used as it is.
2. **Collectives.** Every registered algorithm, with its default parameters,
   alone on a bucket of d elements, simulated at :data:`N_SIZES` sizes from
   the model's smallest tensor to its whole gradient, on the device profile,
   carrying at most :data:`CARRY` elements per rank (``data_scale``) and with
   slowly drifting gradients (threshold reuse pays). Each gives the device
   time of the collective (selection, compression, reduction), the rest
   (communication), the busiest rank's bytes and the messages, interpolated
   linearly in d between the sizes.
3. **Schedules.** Each schedule's own planner on these cost models, and the
   iteration time of its plan by the pipeline model of OMGS-SGD (Eqs. 5-9,
   :func:`~simsparse.schedules.planner.pipeline_time`): forward, backward
   tensor by tensor, each bucket's device work on the device, its
   communication on one stream.

**How far to trust it.** One-bucket schedules (``whole``, ``topk_sgd``)
agree with simulating the schedule within 2 % (BERT-base, P = 64, Aries
alpha-beta; ``tests/cli/test_advise.py`` checks 5 % on ResNet-20). Pipelined
schedules come out optimistic: in the simulator a bucket's collective runs its
reduction and selection kernels on the device between its messages, so they
wait behind the backward pass; the model puts them before the messages. On
that BERT case: wfbp 172 ms predicted against 240 ms simulated, mg_wfbp 174
against 204, lags_sgd 160 against 176, mgs_sgd 144 against 155.

The answer: every (schedule, algorithm) ranked by predicted iteration time
(``advise.csv``), the top choices with why (busiest-rank bytes, startup
terms, the share of communication hidden behind the backward pass), and a
training config of the top choices (``config.yaml``) to simulate them in
full with ``simsparse sweep``. The collectives' rows are kept in
``collectives/results.csv``, so a second call reuses them.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ...algorithms import ALGORITHMS
from ...compute.devices import DEVICES, load_profile
from ...compute.models import default_batch_size, model_profile, resolve_model
from ...registry import UnknownName, is_dotted
from ...schedules import SCHEDULES, PlanCosts
from ...schedules.planner import pipeline_time
from ..config.errors import ConfigError
from ..config.sources import network_variants
from ..config.specs import WorkloadSpec
from ..config.hints import did_you_mean
from ..config.point import Point
from ...files import atomic_write
from ..results.store import ResultsStore, write_csv
from ..run.sweep import ident, outcomes
from .table import fmt_bytes, fmt_count, fmt_time

#: most elements per rank the collectives' simulations carry
CARRY = 1 << 16
#: bucket sizes simulated per algorithm
N_SIZES = 4
#: schedules whose planner has a paper and an exact variant
PLANNERS = ("paper", "optimal")


@dataclass
class Costs:
    """One algorithm's simulated metrics at the sizes ``d``, interpolated between them."""

    d: np.ndarray
    dev: np.ndarray
    comm: np.ndarray
    bytes_max: np.ndarray
    msgs: np.ndarray   # per rank

    def at(self, what: str, d):
        return np.interp(d, self.d, getattr(self, what))

    @property
    def startup(self) -> float:
        """The communication time at zero size, extrapolated from the two smallest sizes."""
        if len(self.d) < 2:
            return float(self.comm[0])
        slope = (self.comm[1] - self.comm[0]) / (self.d[1] - self.d[0])
        return float(max(0.0, self.comm[0] - slope * self.d[0]))


# -- inputs ----------------------------------------------------------------------------

def _inputs(args):
    """(network dict, compute dict, model profile) of the command line, or ConfigError."""
    where = Path.cwd() / "advise"
    nets = network_variants(args.network, where)
    if len(nets) != 1:
        raise ConfigError(f"--network {args.network}: expands into {len(nets)} networks; advise takes one")
    try:
        args.model = resolve_model(args.model)
    except ValueError as e:
        raise ConfigError(f"--model: {e}") from None
    if not 0 < args.density <= 1:
        raise ConfigError(f"--density {args.density}: allowed 0 < density <= 1")
    if args.P < 2:
        raise ConfigError(f"-P {args.P}: with one rank there is nothing to communicate; allowed P >= 2")
    try:
        prof = load_profile(args.compute, Path.cwd())
    except (FileNotFoundError, UnknownName) as e:
        if is_dotted(args.compute):
            raise ConfigError(f"--compute: {e}") from None
        allowed = DEVICES.names()
        raise ConfigError(f"--compute {args.compute!r}: device profile not found{did_you_mean(args.compute, allowed)};"
                          f" allowed: {', '.join(allowed)}, a .yaml path, or a dotted path package.module:PROFILE") \
            from None
    if prof.peak_flops is None:
        raise ConfigError(f"--compute {args.compute}: the profile has no peak_flops, needed to time the model's layers")
    try:
        batch = args.batch_size or default_batch_size(args.model)
    except ValueError as e:
        raise ConfigError(f"--batch-size: {e}") from None
    if batch < 1:
        raise ConfigError(f"--batch-size {batch}: allowed >= 1")
    return nets[0], prof.model_dump(), model_profile(args.model, batch, prof)


def _workload(n: int, density: float) -> dict:
    return WorkloadSpec(n=n, density=density, seed=0, drift=0.1).model_dump()


# -- step 1: the network -------------------------------------------------------------------

def alphabeta_fit(net: dict, P: int, run) -> tuple[dict, str]:
    """The network the collectives run on, and a sentence saying what it is."""
    if net.get("model", "alphabeta") == "alphabeta" or run.flow:
        what = "as given" if net.get("model", "alphabeta") == "alphabeta" else "flow-level (--flow)"
        return net, f"{_name(net)}, {what}"
    chunks = (16, 1 << 18)  # elements per rank and step: eager, and 1 MiB messages
    pts = [Point(algorithm="ring", P=P, workload=_workload(P * c, 0.01), network=net, iterations=1, warmup=0,
                 check=False) for c in chunks]
    rows = run.rows(pts)
    t_small, t_large = (rows[ident(p)]["time_s"] / (2 * (P - 1)) for p in pts)  # one step: alpha + 4 c beta
    beta = max((t_large - t_small) / (4 * (chunks[1] - chunks[0])), 1e-15)   # seconds per byte
    alpha = max(t_small - 4 * chunks[0] * beta, 0.0)
    fit = {"model": "alphabeta", "name": f"{_name(net)} (alpha-beta fit)", "alpha_s": alpha,
           "bandwidth_Bps": 1 / beta, "eager_threshold_B": net.get("eager_threshold_B", 65536),
           "rendezvous_rtt_s": net.get("rendezvous_rtt_s", 0.0), "unexpected_window_B": net.get("unexpected_window_B")}
    return fit, (f"an alpha-beta fit of {_name(net)} at P = {P} (alpha {alpha * 1e6:.2f} us, {1 / beta / 1e9:.2f} GB/s, "
                 f"from a ring allreduce simulated on it, whose steps are 2(P-1) x (alpha + chunk beta); contention "
                 f"is not modelled: --flow simulates the flow-level network, slower)")


def _name(net: dict) -> str:
    return str(net.get("name") or net.get("model", "network"))


# -- step 2: the collectives ---------------------------------------------------------------

def collective_points(net: dict, compute: dict, P: int, sizes: list[int], density: float) -> dict:
    """{algorithm: [points at the sizes it accepts]} and {algorithm: why it is left out}."""
    pts, skipped = {}, {}
    for name, cls in sorted(ALGORITHMS.items()):
        params = cls.Params()
        ok, why = [], None
        for d in sizes:
            problem = cls.check_setup(P, d, params)
            pt = Point(algorithm=name, P=P, workload=_workload(d, density), network=net, compute=compute,
                       iterations=1, warmup=1, check=False, data_scale=min(1.0, CARRY / d))
            if problem is None:
                try:
                    small, _ = pt.at_scale()
                    problem = None if small.workload["n"] >= P else "too few elements carried"
                except ValueError as e:
                    problem = str(e)
            if problem is None:
                ok.append(pt)
            else:
                why = why or f"d = {d}: {problem}"
        if len(ok) >= 2:
            pts[name] = ok
        else:
            skipped[name] = why or "fewer than two bucket sizes apply"
    return pts, skipped


def costs_of(points: list[Point], rows: dict) -> Costs:
    got = [(p.workload["n"], rows[ident(p)]) for p in points]
    d = np.array([n for n, _ in got], float)

    def col(key):
        return np.array([float(r.get(key) or 0.0) for _, r in got])

    P = points[0].P
    return Costs(d, col("t_compute_s"), col("t_comm_s"), col("bytes_sent_max"), col("msgs_total") / P)


# -- step 3: the schedules -----------------------------------------------------------------

def rank_choices(prof, costs: dict[str, Costs]) -> pd.DataFrame:
    """Every (schedule, planner, algorithm) with its predicted iteration and why, fastest first."""
    sizes, tb = prof.sizes[::-1], prof.t_bwd[::-1]
    out = []
    for sname, scls in sorted(SCHEDULES.items()):
        planners = PLANNERS if "planner" in scls.Params.model_fields else (None,)
        for aname, c in costs.items():
            if scls.check_algorithm(ALGORITHMS[aname]):
                continue
            pc = PlanCosts(tuple(tb), tuple(sizes), lambda d, c=c: c.at("dev", d), lambda d, c=c: c.at("comm", d),
                           c.startup, prof.t_forward)
            for planner in planners:
                params = scls.Params() if planner is None else scls.Params(planner=planner)
                plan = scls.plan(params, pc)
                tl = pipeline_time(plan, pc.tb, pc.sizes, pc.ts, pc.tc, pc.tf)
                groups = np.array(_group_sizes(plan, sizes), float)
                comm = float(np.sum(c.at("comm", groups)))
                out.append({"schedule": sname + ("" if planner in (None, "paper") else " (optimal)"),
                            "algorithm": aname, "t_iter_s": tl.t_iter, "t_forward_backward_s": prof.t_forward
                            + sum(tb), "t_device_extra_s": float(np.sum(c.at("dev", groups))),
                            "t_comm_s": comm, "t_comm_nonoverlap_s": tl.non_overlapped,
                            "overlap": min(1.0, max(0.0, 1.0 - tl.non_overlapped / comm)) if comm > 0 else 1.0,
                            "groups": len(plan), "startup_s": len(plan) * c.startup,
                            "bytes_sent_max": float(np.sum(c.at("bytes_max", groups))),
                            "msgs_per_rank": float(np.sum(c.at("msgs", groups)))})
    df = pd.DataFrame(out).sort_values("t_iter_s", kind="stable").reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def _group_sizes(plan, sizes) -> list[int]:
    out, i = [], 0
    for g in plan:
        out.append(int(sum(sizes[i:i + g])))
        i += g
    return out


# -- the command ---------------------------------------------------------------------------

class _Runner:
    """Simulates points not yet in the store (``jobs`` processes), keeps every row."""

    def __init__(self, store: ResultsStore, jobs: int, flow: bool):
        self.store, self.jobs, self.flow = store, jobs, flow

    def rows(self, points: list[Point]) -> dict:
        pending = [p for p in points if not self.store.has(ident(p))]
        for p, got in outcomes(pending, "local", min(self.jobs, max(1, len(pending)))):
            if isinstance(got, BaseException):
                raise RuntimeError(f"simulating {p.algorithm} at P = {p.P}, n = {p.workload['n']} failed: {got}")
            self.store.add(got[0])
        return {ident(p): self.store.rows[ident(p)] for p in points}


def advise_at(P: int, net: dict, compute: dict, prof, density: float, run: _Runner, log) -> tuple:
    """(ranked table, network sentence, left-out algorithms) at P ranks."""
    net_used, net_note = alphabeta_fit(net, P, run)
    sizes = sorted({int(round(x)) for x in np.geomspace(max(min(prof.sizes), P), sum(prof.sizes), N_SIZES)})
    pts, skipped = collective_points(net_used, compute, P, sizes, density)
    todo = sum(not run.store.has(ident(p)) for ps in pts.values() for p in ps)
    if todo:
        print(f"simsparse: P = {P}: simulating {todo} collectives ({len(pts)} algorithms x {len(sizes)} bucket sizes "
              f"from {fmt_count(sizes[0])} to {fmt_count(sizes[-1])} elements)", file=log, flush=True)
    rows = run.rows([p for ps in pts.values() for p in ps])
    costs = {a: costs_of(ps, rows) for a, ps in pts.items()}
    return rank_choices(prof, costs), net_note, skipped


def advise(args, log=None) -> int:
    """``simsparse advise``: print the ranking and the why of the top choices, write the tables."""
    import time

    log = log or sys.stderr
    t0 = time.perf_counter()
    net, compute, prof = _inputs(args)
    stem = Path(args.network).stem
    out = Path(args.out) if args.out else Path("results") / f"advise_{stem}_{args.model}_P{args.P}"
    store = ResultsStore(out / "collectives", order=None)
    run = _Runner(store, args.jobs, args.flow)
    table, net_note, skipped = advise_at(args.P, net, compute, prof, args.density, run, log)
    print(f"{args.model} (batch {prof.batch_size}, {fmt_count(sum(prof.sizes))} parameters in {len(prof.sizes)} "
          f"tensors) on {stem} at P = {args.P}, {compute.get('name', 'custom')} compute, density {args.density:g}")
    print(f"  collectives simulated on {net_note}; each at {N_SIZES} bucket sizes carrying at most {fmt_count(CARRY)} "
          f"elements per rank (data_scale); schedules timed by OMGS-SGD's pipeline model on those costs (optimistic "
          f"for many buckets: up to 30 % below a simulation of the schedule; config.yaml simulates the top choices).")
    if skipped:
        print("  left out: " + "; ".join(f"{a} ({why})" for a, why in skipped.items()))
    print(_why(table, args.top))
    write_csv(table, out / "advise.csv")
    written = [out / "advise.csv", _check_config(args, table, out)]
    if args.sweep_P:
        written.append(_sweep_P(args, net, compute, prof, run, out, log))
    print(f"wrote {', '.join(map(str, written))} in {time.perf_counter() - t0:.0f} s")
    return 0


def _why(table: pd.DataFrame, top: int) -> str:
    """The ranked table (top rows) and a sentence per top choice."""
    dense = table[table["algorithm"].isin([a for a, c in ALGORITHMS.items() if c.dense])]
    best_dense = dense.iloc[0] if len(dense) else None
    cols = ["rank", "schedule", "algorithm", "t_iter_s", "groups", "bytes_sent_max", "startup_s", "overlap"]
    shown = table[cols].head(max(top, 10)).copy()
    shown["t_iter_s"] = shown["t_iter_s"].map(fmt_time)
    shown["bytes_sent_max"] = shown["bytes_sent_max"].map(fmt_bytes)
    shown["startup_s"] = shown["startup_s"].map(fmt_time)
    shown["overlap"] = shown["overlap"].map(lambda x: f"{x:.0%}")
    shown.columns = ["#", "schedule", "algorithm", "iteration", "buckets", "sent (busiest)", "startups", "hidden"]
    lines = ["", shown.to_string(index=False), "", "why:"]
    for _, r in table.head(top).iterrows():
        vs = ""
        if best_dense is not None and r["algorithm"] != best_dense["algorithm"]:
            vs = (f", {best_dense['t_iter_s'] / r['t_iter_s']:.2f}x the best dense choice "
                  f"({best_dense['schedule']} / {best_dense['algorithm']}, {fmt_time(best_dense['t_iter_s'])}, "
                  f"{fmt_bytes(best_dense['bytes_sent_max'])} sent)")
        buckets = f"{r['groups']} bucket{'s' if r['groups'] != 1 else ''}"
        lines.append(f"  {r['rank']}. {r['schedule']} / {r['algorithm']}: {fmt_time(r['t_iter_s'])} per iteration"
                     f"{vs}. The busiest rank sends {fmt_bytes(r['bytes_sent_max'])} in {buckets} "
                     f"({r['msgs_per_rank']:.0f} messages per rank, startup terms {fmt_time(r['startup_s'])}); "
                     f"{r['overlap']:.0%} of its {fmt_time(r['t_comm_s'])} of communication is hidden behind the "
                     f"backward pass; its device work adds {fmt_time(r['t_device_extra_s'])} to the "
                     f"{fmt_time(r['t_forward_backward_s'])} of forward and backward.")
    return "\n".join(lines)


def _check_config(args, table: pd.DataFrame, out: Path) -> Path:
    """A training config of the top choices, to simulate them in full with ``simsparse sweep``."""
    top = table.head(args.top)
    scheds = list(dict.fromkeys(s.split(" ")[0] for s in top["schedule"]))
    cfg = {"name": f"{out.name}_check", "description": f"the top {args.top} choices of simsparse advise, simulated",
           "network": args.network, "compute": args.compute,
           "model": {"name": args.model, "batch_size": int(args.batch_size or default_batch_size(args.model)),
                     "density": args.density},
           "schedules": scheds, "algorithms": list(dict.fromkeys(top["algorithm"])), "P": args.P,
           "iterations": 1, "warmup": 1, "data_scale": 0.001}
    path = out / "config.yaml"
    head = ("# simsparse advise: its top choices as a training config. `simsparse sweep` on it simulates every\n"
            "# schedule with every algorithm here in full (minutes to hours: a layer-wise schedule runs one\n"
            "# collective per bucket).\n")
    text = head + yaml.safe_dump(cfg, sort_keys=False)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return path


def _sweep_P(args, net, compute, prof, run: _Runner, out: Path, log) -> Path:
    """The winner at P = 4, 8, ... up to -P: where it changes."""
    Ps = sorted({*(1 << i for i in range(2, int(math.log2(args.P)) + 1)), args.P})
    rows, last = [], None
    for P in Ps:
        table, _, _ = advise_at(P, net, compute, prof, args.density, run, log)
        win, second = table.iloc[0], table.iloc[1] if len(table) > 1 else None
        choice = f"{win['schedule']} / {win['algorithm']}"
        rows.append({"P": P, "winner": choice, "t_iter_s": win["t_iter_s"],
                     "runner_up": "" if second is None else f"{second['schedule']} / {second['algorithm']}",
                     "margin": np.nan if second is None else second["t_iter_s"] / win["t_iter_s"] - 1,
                     "changes": last is not None and choice != last})
        last = choice
    df = pd.DataFrame(rows)
    print("\nthe winner as P grows:")
    for r in df.itertuples():
        mark = "  <- changes" if r.changes else ""
        print(f"  P = {r.P:>5}: {r.winner:36s} {fmt_time(r.t_iter_s):>9}, {r.margin:+.1%} before {r.runner_up}{mark}")
    path = out / "advise_by_P.csv"
    write_csv(df, path)
    return path
