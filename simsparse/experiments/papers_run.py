"""``simsparse papers [NAME ...]``: run each paper experiment's config (or
read its results), print the paper's numbers beside ours with the ratio and
plot them (:mod:`.papers` holds the data model and the evaluation).

Each config runs like ``simsparse run`` into ``<out>/<config name>/``
(resumable: finished points are kept); ``--smoke`` runs the reduced variant
of each experiment (the ``smoke:`` keys of its data file: fewer ranks, less
data) into ``<out>/smoke/<config name>/``, as the test suite does.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from .config import load_config
from .papers import REPO_ROOT, TOLERANCE, Experiment, Results, compare, load_papers, select
from .store import ResultsStore, atomic_write

#: columns of the printed table
_SHOWN = ["experiment", "claim", "unit", "paper_value", "ours", "ratio", "meets_aim"]


def config_path(exp: Experiment, smoke: bool, out_dir: Path) -> Path:
    """The experiment's config, or its reduced variant written beside its results."""
    path = REPO_ROOT / exp.config
    if not smoke:
        return path
    raw = yaml.safe_load(path.read_text())
    raw.update(exp.smoke)
    raw["name"] = f"{raw['name']}_smoke"
    small = out_dir / "config.smoke.yaml"
    atomic_write(small, lambda tmp: Path(tmp).write_text(yaml.safe_dump(raw, sort_keys=False)))
    return small


def run_experiment(exp: Experiment, out_dir: Path, smoke: bool = False, run: bool = True,
                   log=sys.stderr) -> Results:
    """Simulate the experiment's points not yet in ``out_dir`` (none when
    ``run`` is false) and return its results."""
    from .progress import Progress
    from .runner import simulate_point

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(config_path(exp, smoke, out_dir))
    store = ResultsStore(out_dir)
    ids = {p.point_id("sim") for p in cfg.points}
    store.retain(ids)
    if run:
        pending = [p for p in cfg.points
                   if not store.has(p.point_id("sim")) or (exp.trace and not store.has_trace(p.point_id("sim")))]
        progress = Progress(pending, cfg.name, "sim", stream=log)
        try:
            for p in pending:
                progress.started(p)
                outcome = simulate_point(p, trace=exp.trace)
                store.save_trace(outcome.row["point_id"], outcome.trace if exp.trace else None)
                store.add(outcome.row)
                progress.finished(p, outcome.row)
        finally:
            progress.close()
    rows = store.frame()
    rows = rows[rows["point_id"].isin(ids)] if len(rows) else rows
    return Results(rows, store.trace_dir if exp.trace else None)


def main(names: list[str], out: str | None = None, smoke: bool = False, run: bool = True, plot: bool = True) -> int:
    """Run (or read) the experiments named, print the side-by-side table,
    write ``papers.csv`` and ``papers.png`` under ``out``."""
    base = Path(out) if out else Path("results") / "papers"
    if smoke:
        base = base / "smoke"
    papers = load_papers()
    chosen = select(papers, names)
    results, walls = {}, {}
    for paper, name, exp in chosen:
        t0 = time.perf_counter()
        results[name] = run_experiment(exp, base / Path(exp.config).stem, smoke, run)
        walls[name] = time.perf_counter() - t0
    for paper, name, exp in chosen:   # experiments a claim reads with from: but not named: their results on disk
        for other in _referenced(exp):
            if other not in results and (base / other).is_dir():
                results[other] = run_experiment(_by_name(papers, other), base / other, smoke, run=False)
    rows = []
    for paper, name, exp in chosen:
        res = results[name]
        res.others = results
        rows += compare(paper, name, exp, res)
    table = pd.DataFrame(rows)
    atomic_write(base / "papers.csv", lambda tmp: table.to_csv(tmp, index=False))
    written = [base / "papers.csv"]
    for paper_name, part in table.groupby("paper", sort=False):
        print(f"\n{paper_name}")
        shown = part[_SHOWN].copy()
        shown["meets_aim"] = shown["meets_aim"].map({True: "yes", False: "NO"}).fillna("-")
        print(shown.to_string(index=False))
    met = table["meets_aim"].eq(True).sum()
    judged = table["meets_aim"].notna().sum()
    print(f"\n{met} of {judged} claims meet the aim (within {TOLERANCE:.0%}, or the relation holds); "
          f"{len(table) - judged} not computed. Wall: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()))
    if plot and len(table):
        written.append(plot_claims(table, base / "papers.png"))
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


def _referenced(exp: Experiment) -> set[str]:
    """The experiments whose results a claim reads with ``from:``."""
    found = set()

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("from"), str):
                found.add(x["from"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    for c in exp.claims:
        walk(c.ours)
    return found


def _by_name(papers, name: str) -> Experiment:
    return next(x for p in papers.values() for e, x in p.experiments.items() if e == name)


def plot_claims(table: pd.DataFrame, path: Path) -> Path:
    """Ours against the paper's value for every numeric claim (log-log, the
    diagonal and the +-25 % band), one panel per paper."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    papers = list(dict.fromkeys(table["paper"]))
    fig, axes = plt.subplots(1, len(papers), figsize=(4.2 * len(papers), 4.2), squeeze=False)
    for ax, name in zip(axes[0], papers):
        part = table[table["paper"] == name]
        xs, ys, labels = [], [], []
        for _, r in part.iterrows():
            for p, o in zip(str(r["paper_value"]).split(" to "), str(r["ours"]).split(" to ")):
                try:
                    x, y = float(p), float(o)
                except ValueError:
                    continue
                if x > 0 and y > 0:
                    xs.append(x), ys.append(y), labels.append(r["claim"])
        if xs:
            lo, hi = min(xs + ys) / 2, max(xs + ys) * 2
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="0.85")
            ax.scatter(xs, ys, s=14)
            ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_title(name), ax.set_xlabel("paper"), ax.set_ylabel("ours")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path
