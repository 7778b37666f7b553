"""``simsparse papers [NAME ...]``: run each paper experiment's config (or
read its results), print the paper's numbers beside ours with the ratio and
plot them (:mod:`.papers` holds the data model and the evaluation).

Each config runs with ``simsparse run`` in a child process into
``<out>/<config name>/`` (resumable: finished points are kept); ``--smoke`` runs the reduced variant
of each experiment (the ``smoke:`` keys of its data file: fewer ranks, less
data) into ``<out>/smoke/<config name>/``, as the test suite does, in this
process (its points take 0.1 to 2 s, a child's start 3 s).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from ...files import yaml_load
from ..config.schema import load_config
from ..run.execute import execute
from .papers import POINTS, REPO_ROOT, TOLERANCE, Experiment, PapersError, Results, compare, load_papers, select
from ...files import atomic_write
from ..results.provenance import git_commit, host, now
from ..results.store import ResultsStore

#: columns of the printed table
_SHOWN = ["experiment", "claim", "unit", "paper_value", "ours", "ratio", "meets_aim"]


def config_path(exp: Experiment, smoke: bool, out_dir: Path) -> Path:
    """The experiment's config, or its reduced variant written beside its results."""
    path = REPO_ROOT / exp.config
    if not smoke:
        return path
    raw = yaml_load(path.read_text())
    raw.update(exp.smoke)
    raw["name"] = f"{raw['name']}_smoke"
    small = out_dir / "config.smoke.yaml"
    atomic_write(small, lambda tmp: Path(tmp).write_text(yaml.safe_dump(raw, sort_keys=False)))
    return small


def run_experiment(exp: Experiment, out_dir: Path, smoke: bool = False, run: bool = True) -> Results:
    """Run the experiment's config with ``simsparse run`` in a child process
    (memory goes back between experiments; finished points are kept, so a
    second call resumes; a smoke run in this process) unless ``run`` is false, and return its results.
    The budget applies as to any ``simsparse run``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = config_path(exp, smoke, out_dir)
    config = load_config(path)
    if run:
        if smoke:
            execute(config, "sim", str(out_dir), trace=exp.trace, log=io.StringIO())
        else:
            args = ["run", str(path), "--out", str(out_dir), "--no-plot"] + (["--trace"] if exp.trace else [])
            done = subprocess.run([sys.executable, "-m", "simsparse.cli", *args], stdout=subprocess.DEVNULL)
            if done.returncode not in (0, 1):   # 1: a point's result differs from numpy (checks are off here)
                raise PapersError(f"simsparse run {path} failed (exit {done.returncode}); its message is above")
    ids = {p.point_id("sim") for p in config.points}
    rows = ResultsStore(out_dir).frame()
    rows = rows[rows["point_id"].isin(ids)] if len(rows) else rows
    return Results(rows, out_dir / "trace" if exp.trace else None)


def main(names: list[str], out: str | None = None, smoke: bool = False, run: bool = True, plot: bool = True,
         doc: str | None = None) -> int:
    """Run (or read) the experiments named, print the side-by-side table,
    write ``papers.csv``, ``papers.md`` and ``papers.png`` under ``out``
    (and the markdown into ``doc`` between its markers)."""
    base = Path(out) if out else Path("results") / "papers"
    if smoke:
        base = base / "smoke"
    started, load_before = now(), os.getloadavg()
    papers = load_papers()
    chosen = select(papers, names)
    results, walls = {}, {}
    for _paper, name, exp in chosen:
        t0 = time.perf_counter()
        results[name] = run_experiment(exp, base / Path(exp.config).stem, smoke, run)
        walls[name] = time.perf_counter() - t0
    for _paper, _name, exp in chosen:   # experiments a claim reads with from: but not named: their results on disk
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
    origin = {"started_at": started, "finished_at": now(), "git": git_commit(), "host": host(),
              "load_before": load_before, "load_after": os.getloadavg(), "ran": run, "smoke": smoke,
              "wall_s": {k: round(v, 1) for k, v in walls.items()}, "experiments": [n for _, n, _ in chosen]}
    atomic_write(base / "papers.provenance.json", lambda tmp: Path(tmp).write_text(json.dumps(origin, indent=1)))
    md = markdown(table)
    atomic_write(base / "papers.md", lambda tmp: Path(tmp).write_text(md))
    written = [base / "papers.csv", base / "papers.md"]
    if doc:
        written.append(splice(Path(doc), md))
    for paper_name, part in table.groupby("paper", sort=False):
        print(f"\n{paper_name}")
        shown = part[_SHOWN].copy()
        shown["meets_aim"] = shown["meets_aim"].map({True: "yes", False: "NO"}).fillna("-")
        print(shown.to_string(index=False))
    met = table["meets_aim"].eq(True).sum()
    judged = table["meets_aim"].notna().sum()
    print(f"\n{met} of {judged} claims meet the aim (within {TOLERANCE:.0%} and a ratio on the paper's side of 1, "
          f"an efficiency within {POINTS} points, or the relation holds); "
          f"{len(table) - judged} not computed. Wall: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()))
    if plot and len(table):
        written.append(plot_claims(table, base / "papers.png"))
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


#: the lines a document's generated table sits between (``--doc``)
BEGIN, END = "<!-- papers: begin -->", "<!-- papers: end -->"


def markdown(table: pd.DataFrame) -> str:
    """The claims as markdown: per experiment how many meet the aim, then every claim with the
    paper's value, ours, the ratio (points for an efficiency) and the verdict; generated, so
    the document says what ``simsparse papers`` printed."""
    if not len(table):
        return "No claims.\n"
    met, judged = int(table["meets_aim"].eq(True).sum()), int(table["meets_aim"].notna().sum())
    lines = [f"{met} of {judged} claims meet the aim; {len(table) - judged} not computed.", "",
             "| experiment | claims met |", "|---|---|"]
    for name, part in table.groupby("experiment", sort=False):
        lines.append(f"| `{name}` | {int(part['meets_aim'].eq(True).sum())} of {int(part['meets_aim'].notna().sum())} |")
    lines += ["", "| experiment | claim | what | paper | ours | ratio | aim |", "|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        unit = f" {r['unit']}" if isinstance(r["unit"], str) and r["unit"] and r["unit"] != "efficiency" else ""
        aim = {True: "yes", False: "**no**"}.get(r["meets_aim"], "-")
        lines.append(f"| `{r['experiment']}` | `{r['claim']}` | {r['what']} | {r['paper_value']}{unit} | "
                     f"{r['ours']}{unit} | {r['ratio']} | {aim} |")
    return "\n".join(lines) + "\n"


def splice(doc: Path, text: str, markers: tuple[str, str] = (BEGIN, END)) -> Path:
    """Replace what lies between ``doc``'s two ``markers`` lines (default :data:`BEGIN` and :data:`END`) with
    ``text``."""
    begin, end = markers
    try:
        old = doc.read_text()
    except OSError as e:
        raise PapersError(f"{doc}: {e.strerror}") from None
    if begin not in old or end not in old:
        raise PapersError(f"{doc}: the file has no '{begin}' and '{end}' lines to write between")
    head, rest = old.split(begin, 1)
    new = head + begin + "\n" + text + end + rest.split(end, 1)[1]
    atomic_write(doc, lambda tmp: Path(tmp).write_text(new))
    return doc


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
        met, judged = int(part["meets_aim"].eq(True).sum()), int(part["meets_aim"].notna().sum())
        note = f"{met} of {judged} claims meet the aim"
        if xs:
            lo, hi = min(xs + ys) / 2, max(xs + ys) * 2
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="0.85")
            ax.scatter(xs, ys, s=14)
            ax.set_xscale("log"), ax.set_yscale("log")
            ax.set_xlabel("paper"), ax.set_ylabel("ours")
            ax.text(0.03, 0.97, note, transform=ax.transAxes, va="top", fontsize=8)
        else:   # orderings only
            ax.axis("off")
            ax.text(0.5, 0.5, note + "\n(orderings and relations)", ha="center", va="center")
        ax.set_title(name)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path
