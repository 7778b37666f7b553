"""``simsparse report``: the documentation's measured figures, rendered from stored results.

Figures are data, never typed by hand: a run writes its results with their
provenance (``simsparse papers`` writes ``papers.csv`` and
``papers.provenance.json``), the results the docs quote are kept under
``docs/data/``, and this renders them:

The report pages live under ``docs/reports/`` (:data:`REPORTS`), beside
the method pages that say how each figure is measured:

* ``reports/papers.md``: the claim-by-claim table, between its
  ``<!-- papers: begin/end -->`` lines (:func:`.papers_run.markdown`);
* ``reports/validation.md``: one row per stored ``validate`` run, between its
  ``<!-- validation: begin/end -->`` lines, and ``docs/figures/validation.png``
  (:func:`validation_figure`: each run's points, predicted against
  measured). :func:`store_validation` keeps a
  run (``simsparse report --store-validation DIR``): its points' and phases'
  errors as ``validation/<suite>_<machine>.csv`` and its ``validate.json``
  (stages, loads, repeats' floor, commit and host) beside it;
* ``reports/performance.md``: the rows of ``benchmarks/bench_scale.py --out
  docs/data/scale.csv``, between its ``<!-- scale: begin/end -->`` lines;
* ``reports/performance.md``: the rows of ``benchmarks/bench_flow_waves.py --out
  docs/data/flow_waves.csv`` (each wave evaluator's error against the
  events), between its ``<!-- flow waves: begin/end -->`` lines;
* ``README.md``: the headline lines, between ``<!-- headline: begin/end -->``,
  one per kind of stored source: the papers' claims met, the validation
  error, the scale rows at their largest P; the dates and machines of the runs stay in the provenance files.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ...files import atomic_write
from .papers import PapersError
from .papers_run import markdown, splice
from .phases import error_stats

#: the report pages' folder under the docs folder
REPORTS = Path("reports")
#: the lines the README's headline block sits between
HEADLINE = ("<!-- headline: begin -->", "<!-- headline: end -->")
#: and reports/validation.md's table of stored runs
VALIDATION = ("<!-- validation: begin -->", "<!-- validation: end -->")
#: and reports/performance.md's table of the scale rows
SCALE = ("<!-- scale: begin -->", "<!-- scale: end -->")
#: and its table of the flow-level wave evaluators' errors
FLOW_WAVES = ("<!-- flow waves: begin -->", "<!-- flow waves: end -->")
#: the columns of compare.csv a stored validation run keeps
KEPT = ["level", "phase", "kind", "schedule", "model", "algorithm", "params", "P", "n", "density", "pred_s", "meas_s",
        "rel_err"]


def store_validation(compare_dir: Path, data: Path) -> Path:
    """Keep the ``validate`` run whose comparison is ``compare_dir`` under
    ``data/validation/``: its :data:`KEPT` columns as ``<suite>_<machine>.csv``
    and its ``validate.json`` as ``<suite>_<machine>.provenance.json``.
    Returns the CSV written."""
    try:
        log = json.loads((compare_dir / "validate.json").read_text())
        table = pd.read_csv(compare_dir / "compare.csv")
    except (OSError, ValueError) as e:
        raise PapersError(f"--store-validation {compare_dir}: not a comparison that validate wrote "
                          f"(compare.csv and validate.json): {e}") from None
    missing = [c for c in KEPT if c not in table]
    if missing:
        raise PapersError(f"--store-validation {compare_dir}/compare.csv: no column {', '.join(missing)}")
    name = f"{_suite(log)}_{log['machine']}"
    out = data / "validation"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / f"{name}.csv", lambda tmp: table[KEPT].to_csv(tmp, index=False))
    atomic_write(out / f"{name}.provenance.json", lambda tmp: Path(tmp).write_text(json.dumps(log, indent=1)))
    return out / f"{name}.csv"


def _suite(log: dict) -> str:
    """A validate run's suite: its experiment's name (its config's stem in a run from before it was kept)."""
    return log.get("name") or Path(log["config"]).stem


def validation_rows(data: Path) -> list[dict]:
    """Per stored validation run: its suite, machine, rank counts and the
    (median, p90) of |error| over points, communication phases and compute
    phases, from its CSV; the repeats' floor (one repeat against the
    others) from its provenance where it was measured more than once; its
    points' predicted and measured times (``pred_s``, ``meas_s``: the figure's)."""
    rows = []
    for path in sorted((data / "validation").glob("*.csv")):
        t = pd.read_csv(path)
        log = json.loads(path.with_suffix(".provenance.json").read_text())
        pts = t[t["level"] == "point"]
        spread = log.get("repeat_spread") or {}
        rows.append({"suite": _suite(log), "machine": log["machine"],
                     "P": ", ".join(str(p) for p in sorted(pts["P"].unique())), "points": len(pts),
                     "error": error_stats(pts["rel_err"]),
                     "signed": float(pd.to_numeric(pts["rel_err"], errors="coerce").median()),
                     "communication": error_stats(t.loc[t["kind"] == "communication", "rel_err"]),
                     "compute": error_stats(t.loc[t["kind"] == "compute", "rel_err"]),
                     "floor": (spread["one_vs_rest_median"], spread["one_vs_rest_p90"])
                     if spread and pd.notna(spread["one_vs_rest_median"]) else None,   # (none measured twice)
                     "compute_floor": (spread["compute_one_vs_rest_median"], spread["compute_one_vs_rest_p90"])
                     if spread and pd.notna(spread.get("compute_one_vs_rest_median")) else None,
                     "pred_s": pts["pred_s"], "meas_s": pts["meas_s"]})
    return rows


def _pair(mp) -> str:
    return "-" if mp is None else f"{100 * mp[0]:.1f} / {100 * mp[1]:.1f} %"


def validation_markdown(rows: list[dict]) -> str:
    """The table of :func:`validation_rows`: |error| as median / p90."""
    lines = ["| suite | machine | P | points | points: median / p90 | signed median | communication phases | "
             "compute phases | floor: one repeat against the others | compute phases' floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['suite']}` | {r['machine']} | {r['P']} | {r['points']} | **{_pair(r['error'])}** | "
                     f"{100 * r['signed']:+.1f} % | {_pair(r['communication'])} | {_pair(r['compute'])} | "
                     f"{_pair(r['floor'])} | {_pair(r.get('compute_floor'))} |")
    return "\n".join(lines) + "\n"


#: where the validation figure goes, under the docs folder
FIGURE = Path("figures") / "validation.png"


def validation_figure(rows: list[dict], out: Path) -> Path:
    """Each stored run's points (:func:`validation_rows`), predicted against
    measured time on log axes, with the diagonal and a 20 % band: one panel
    per run. Written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows):
        pred, meas = r["pred_s"], r["meas_s"]
        xs = [0.7 * min(meas.min(), pred.min()), 1.4 * max(meas.max(), pred.max())]
        ax.fill_between(xs, [x / 1.2 for x in xs], [x * 1.2 for x in xs], color="0.9", label="within 20 %")
        ax.plot(xs, xs, color="0.5", lw=0.8)
        ax.scatter(meas, pred, s=10, alpha=0.8)
        ax.set(xscale="log", yscale="log", xlim=xs, ylim=xs, xlabel="measured (s)",
               title=f"{r['suite']}\n{r['machine']}, {r['points']} points")
        ax.title.set_fontsize(8)
    axes[0][0].set_ylabel("predicted (s)")
    axes[0][0].legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return out


def read_claims(path: Path) -> pd.DataFrame:
    """A stored ``papers.csv`` as written: every value its text, ``meets_aim`` True, False or None."""
    t = pd.read_csv(path, dtype=str, keep_default_na=False)
    t["meets_aim"] = t["meets_aim"].map({"True": True, "False": False}).astype(object).where(
        t["meets_aim"].isin(["True", "False"]), None)
    return t


def scale_markdown(t: pd.DataFrame) -> str:
    """The rows of a stored ``bench_scale.py --out`` CSV as a table."""
    lines = ["| case | P | wall | peak RSS | the budget's estimate | evaluator (bound) | values | messages an "
             "iteration | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        lines.append(f"| `{r.case}` | {r.P} | **{r.wall_s:.1f} s** | **{r.rss_MB:.0f} MB** | {r.est_s:.3g} s, "
                     f"{r.est_MB:.0f} MB | {r.evaluator} ({r.bound:g}) | {r.values} | {r.msgs:.3g} | {r.load:.2f} |")
    return "\n".join(lines) + "\n"


def flow_waves_markdown(t: pd.DataFrame) -> str:
    """The rows of a stored ``bench_flow_waves.py --out`` CSV as a table: each
    evaluator's error against the events (blank where no collective was
    gathered: the events timed the point), and the wall times."""
    evals = [c[:-len("_error")] for c in t.columns if c.endswith("_error")]
    lines = ["| network | algorithm | P | events | events' spread over seeds | "
             + " | ".join(f"`{e}` error" for e in evals) + " | wall: events, " + ", ".join(evals) + " |",
             "|---|---|---|---|---|" + "---|" * len(evals) + "---|"]
    for r in t.to_dict("records"):
        errs = " | ".join("" if pd.isna(r[f"{e}_error"]) else f"{100 * r[f'{e}_error']:+.2f} %" for e in evals)
        walls = ", ".join(f"{r[f'{w}_wall_s']:.1f}" for w in ["events", *evals])
        spread = "" if pd.isna(r["events_spread"]) else f"{100 * r['events_spread']:.1f} %"   # (one seed: none)
        lines.append(f"| {r['network']} | {r['algorithm']} | {r['P']} | {1e3 * r['events_s']:.4g} ms | {spread} | "
                     f"{errs} | {walls} s |")
    return "\n".join(lines) + "\n"


def stored(data: Path) -> dict:
    """What is stored under ``data``, each read once: ``claims`` (papers.csv), ``runs``
    (:func:`validation_rows`), ``scale`` (scale.csv) and ``flow_waves`` (flow_waves.csv), None where absent."""
    papers, scale, waves = data / "papers.csv", data / "scale.csv", data / "flow_waves.csv"
    return {"claims": read_claims(papers) if papers.is_file() else None, "runs": validation_rows(data) or None,
            "scale": pd.read_csv(scale) if scale.is_file() else None,
            "flow_waves": pd.read_csv(waves) if waves.is_file() else None}


def headline(src: dict) -> list[str]:
    """One line per stored source (:func:`stored`), each with the page that explains it."""
    lines = []
    t = src["claims"]
    if t is not None:
        met, judged = int(t["meets_aim"].eq(True).sum()), int(t["meets_aim"].notna().sum())
        per = t.groupby("paper", sort=False)["meets_aim"].apply(lambda s: f"{int(s.eq(True).sum())}/{int(s.notna().sum())}")
        lines.append(f"* **Papers**: {met} of {judged} claims of the five seed papers met "
                     f"({', '.join(f'{p} {v}' for p, v in per.items())}); every claim in `docs/reports/papers.md`.")
    if src["runs"]:
        lines.append("* **Validation** on the emulated cluster, |error| median / p90 of the points: "
                     + "; ".join(f"`{r['suite']}` on {r['machine']} (P = {r['P']}, {r['points']} points) "
                                 f"{_pair(r['error'])}" for r in src["runs"]) + "; the method and every run in "
                     "`docs/reports/validation.md`.")
    if src["scale"] is not None:
        top = src["scale"].sort_values("P").groupby("case", sort=False).tail(1)
        lines.append("* **Scale** (one iteration, the defaults, this 2-core machine): " + "; ".join(
            f"`{r.case}` at P = {r.P} in {r.wall_s:.1f} s and {r.rss_MB / 1024:.2f} GB" for r in top.itertuples())
            + "; every row in `docs/reports/performance.md`.")
    return lines


def render(data: Path, readme: Path, docs: Path) -> list[Path]:
    """Render every page whose data is stored; returns the files written."""
    src, written, reports = stored(data), [], docs / REPORTS
    if src["claims"] is not None:
        written.append(splice(reports / "papers.md", markdown(src["claims"])))
    if src["runs"]:
        written.append(splice(reports / "validation.md", validation_markdown(src["runs"]) +
                              f"\n![each stored run's points, predicted against measured](../{FIGURE.as_posix()})\n",
                              VALIDATION))
        written.append(validation_figure(src["runs"], docs / FIGURE))
    if src["scale"] is not None:
        written.append(splice(reports / "performance.md", scale_markdown(src["scale"]), SCALE))
    if src["flow_waves"] is not None:
        written.append(splice(reports / "performance.md", flow_waves_markdown(src["flow_waves"]), FLOW_WAVES))
    written.append(splice(readme, "".join(f"{line}\n" for line in headline(src)), HEADLINE))
    return written


def provenance_of(data: Path) -> dict:
    """The stored provenance files under ``data``, by name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(data.glob("*.provenance.json"))}
