"""The default plot of a results table: time per iteration and busiest-rank
bytes against P.

* One time panel per combination of the columns that vary besides the
  series and P (e.g. one per ``compute`` value); one bytes panel per
  combination of those that can change the bytes (``network`` and
  ``compute`` cannot: the bytes panel does not repeat for them).
* One line per series (algorithm and parameters, behind the schedule for a
  training iteration), each with its own colour, line style and marker
  (tab10 colours, so no two of the first ten look alike; after ten, the
  style and marker still differ).
* Series that coincide stay visible: every series' points are shifted by a
  small fixed fraction of an octave along P (the ticks stay at the true P),
  and the line styles differ, so lines lying on top of each other show as
  interleaved dashes and side-by-side markers.
* The title names the config and what is the same in every panel (network,
  n, density, compute, ...).

:func:`plot_results` (``simsparse plot``) draws any numeric column against
any other from a results folder, one line per value of a ``hue`` column.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..config.errors import ConfigError  # noqa: E402
from ...files import atomic_write  # noqa: E402
from .table import fmt_count, series_label  # noqa: E402

FACETS = ["model", "batch_size", "network", "compute", "n", "density", "dtype", "data_scale"]
#: what the bytes sent cannot depend on
NOT_BYTES = ("network", "compute")
METRICS = [("time_s", "time per iteration [s]"), ("bytes_sent_max", "bytes sent by the busiest rank")]
MARKERS = "osD^v<>pP*Xh"
STYLES = ["-", "--", "-.", ":"]
MAX_PANELS = 12


def series_styles(names) -> dict:
    """A distinct (colour, marker, line style) for every series, in the given order."""
    cmap = plt.get_cmap("tab10")
    return {name: dict(color=cmap(i % 10), marker=MARKERS[i % len(MARKERS)], linestyle=STYLES[i % len(STYLES)])
            for i, name in enumerate(dict.fromkeys(names))}


def _label(col: str, v) -> str:
    return f"{col} = {fmt_count(v) if col == 'n' else v}"


def _varying(df: pd.DataFrame, cols) -> list[str]:
    return [c for c in cols if c in df.columns and df[c].astype(str).nunique() > 1]


def panels(df: pd.DataFrame) -> list[tuple[str, str, str, pd.DataFrame]]:
    """(metric column, axis label, panel title, rows) of every panel."""
    if "series" not in df.columns:
        df = df.assign(series=[series_label(r) for r in df.to_dict("records")])
    out = []
    for col, label in METRICS:
        if col not in df.columns:
            continue
        facets = _varying(df, [c for c in FACETS if col == "time_s" or c not in NOT_BYTES])
        if col != "time_s":
            # rows that differ only in network/compute carry the same bytes: keep one of each
            keep = [c for c in df.columns if c not in NOT_BYTES and c in FACETS + ["series", "P"]]
            df_b = df.drop_duplicates(subset=keep)
        else:
            df_b = df
        groups = df_b.groupby([df_b[c].astype(str) for c in facets], sort=False) if facets else [((), df_b)]
        for key, g in groups:
            key = key if isinstance(key, tuple) else (key,)
            where = ", ".join(_label(c, v) for c, v in zip(facets, key))
            out.append((col, label, where, g))
    return out[:MAX_PANELS]


def title_for(df: pd.DataFrame, name: str = "") -> str:
    """The config's name and what every row shares."""
    same = [c for c in FACETS if c in df.columns and df[c].astype(str).nunique() == 1
            and str(df[c].iloc[0]) not in ("", "nan")]
    parts = [_label(c, df[c].iloc[0]) for c in same if not (c == "data_scale" and float(df[c].iloc[0]) == 1.0)]
    return (f"{name}: " if name else "") + ", ".join(parts)


def plot_time_vs_P(df: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Time and busiest-rank bytes against P; log-log axes; a shared legend on the right."""
    df = df.copy()
    df["series"] = [series_label(r) for r in df.to_dict("records")]
    order = list(dict.fromkeys(df["series"]))
    styles = series_styles(order)
    m = len(order)
    step = min(0.06, 0.35 / m) if m > 1 else 0.0  # octaves between neighbouring series
    shift = {s: 2 ** ((j - (m - 1) / 2) * step) for j, s in enumerate(order)}
    pans = panels(df)
    ncol = min(3, len(pans))
    nrow = -(-len(pans) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol + 2.2, 4.0 * nrow + 0.9), squeeze=False)
    for ax, (col, label, where, g) in zip(axes.flat, pans):
        for series in order:
            s = g[g["series"] == series].sort_values("P")
            if s.empty:
                continue
            y = pd.to_numeric(s[col], errors="coerce")
            ax.plot(s["P"] * shift[series], y, label=series, markersize=5, linewidth=1.4, alpha=0.9,
                    markerfacecolor="none" if order.index(series) >= 10 else None, **styles[series])
        Ps = sorted(g["P"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ps, [str(p) for p in Ps])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("P (ranks)")
        ax.set_ylabel(label)
        ax.set_title(where or ("time" if col == "time_s" else "bytes"), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(pans):]:
        ax.set_visible(False)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title_for(df, title), fontsize=11)
    if step:
        fig.text(0.01, 0.005, "Series are shifted slightly along P so that equal values stay visible; "
                 "ticks are at the true P. Bytes do not depend on network or compute.", fontsize=7, alpha=0.7)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)
    return path


# -- simsparse plot ------------------------------------------------------------------------

class PlotError(ConfigError):
    """A results path, column or filter that cannot be plotted (exit status 2)."""


def _results_file(path) -> Path:
    p = Path(path)
    if p.is_dir():
        found = [p / f"results.{x}" for x in ("csv", "parquet") if (p / f"results.{x}").is_file()]
        if not found:
            raise PlotError(f"{p}: no results.csv or results.parquet in this folder (give a folder written by "
                            f"`simsparse run`, `sweep` or `measure`, or a .csv / .parquet file)")
        return found[0]
    if p.is_file() and p.suffix in (".csv", ".parquet"):
        return p
    raise PlotError(f"{p}: not a results folder nor a .csv / .parquet file")


def _column(df: pd.DataFrame, col: str, what: str, numeric: bool = False) -> None:
    from ..config.hints import did_you_mean

    if col not in df.columns:
        raise PlotError(f"--{what} {col}: no such column{did_you_mean(col, list(df.columns))}; the results have: "
                        f"{', '.join(df.columns)}")
    if numeric and pd.to_numeric(df[col], errors="coerce").isna().all():
        nums = [c for c in df.columns if pd.to_numeric(df[c], errors="coerce").notna().any()]
        raise PlotError(f"--{what} {col}: the column holds no numbers; numeric columns: {', '.join(nums)}")


def _filter(df: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    for cond in where:
        col, eq, val = cond.partition("=")
        if not eq:
            raise PlotError(f"--where {cond!r}: expected COL=VALUE, e.g. compute=p100")
        _column(df, col, "where")
        text = df[col].astype(str)
        keep = text == val
        if not keep.any():  # 16 and 16.0, True and true agree
            num = pd.to_numeric(df[col], errors="coerce")
            try:
                keep = num == float(val)
            except ValueError:
                keep = text.str.lower() == val.lower()
        if not keep.any():
            shown = ", ".join(sorted(text.unique())[:12])
            raise PlotError(f"--where {cond}: no row has {col} = {val}; its values: {shown}")
        df = df[keep]
    return df


def _log_scale(values: pd.Series) -> bool:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return bool(len(v)) and (v > 0).all() and v.max() / v.min() >= 8


def plot_results(results, x: str = "P", y: str = "time_s", hue: str = "series", where: list | None = None,
                 out=None) -> Path:
    """``y`` against ``x``, one line per ``hue`` value, one panel per combination of
    the other columns that vary (FACETS); repeated rows (seeds, ...) as their median."""
    from ..results.store import read_results

    path = _results_file(results)
    df = read_results(path)
    if df.empty:
        raise PlotError(f"{path}: no rows to plot")
    if hue == "series" and "series" not in df.columns and "algorithm" in df.columns:
        df["series"] = [series_label(r) for r in df.to_dict("records")]
    _column(df, x, "x")
    _column(df, y, "y", numeric=True)
    _column(df, hue, "hue")
    df = _filter(df, where or [])
    df = df.assign(**{y: pd.to_numeric(df[y], errors="coerce")})
    facets = [c for c in _varying(df, FACETS) if c not in (x, hue)]
    groups = list(df.groupby([df[c].astype(str) for c in facets], sort=False)) if facets else [((), df)]
    groups = groups[:MAX_PANELS]
    order = list(dict.fromkeys(df[hue].astype(str)))
    styles = series_styles(order)
    ncol = min(3, len(groups))
    nrow = -(-len(groups) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol + 2.2, 4.0 * nrow + 0.9), squeeze=False)
    repeated = False
    for ax, (key, g) in zip(axes.flat, groups):
        key = key if isinstance(key, tuple) else (key,)
        for name, s in g.groupby(g[hue].astype(str), sort=False):
            repeated |= bool(s[x].duplicated().any())
            s = s.groupby(x, sort=True)[y].median()
            ax.plot(s.index, s.values, label=name, markersize=5, linewidth=1.4, **styles[name])
        if _log_scale(g[x]):
            ax.set_xscale("log", base=2 if x == "P" else 10)
        if _log_scale(g[y]):
            ax.set_yscale("log")
        if x == "P":
            Ps = sorted(pd.to_numeric(g[x], errors="coerce").dropna().unique())
            ax.set_xticks(Ps, [str(int(p)) for p in Ps])
            ax.minorticks_off()
        ax.set_xlabel(x)
        ax.set_ylabel(y + (" (median of repeated rows)" if repeated else ""))
        ax.set_title(", ".join(_label(c, v) for c, v in zip(facets, key)), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, title=hue, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title_for(df, path.parent.name), fontsize=11)
    fig.tight_layout()
    out = Path(out) if out else path.parent / f"{y}_vs_{x}.png"
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)
    return out


def plot_compare(c, path: Path, errors: tuple, phases: pd.DataFrame | None, top: int = 15) -> Path:
    """Predicted against measured (log-log, y = x) and per-phase errors (median, min..max over points);
    ``errors``: (median, p90) of |error| over points, ``phases``: :func:`.phases.phase_summary`'s table."""
    import numpy as np

    pts = c.points
    series = pts["algorithm"] + pts["params"].map(lambda p: f" {p}" if p else "")
    series = np.where(pts["schedule"] != "", pts["schedule"] + " / " + series, series)
    styles = series_styles(set(series))
    two = phases is not None
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(13 if two else 6.5, 5.2), squeeze=False)
    ax = axes[0][0]
    for s in sorted(set(series)):
        sel = series == s
        st = styles[s]
        ax.scatter(pts["meas_s"][sel], pts["pred_s"][sel], label=s, color=st["color"], marker=st["marker"], s=28)
    lo = min(pts["meas_s"].min(), pts["pred_s"].min()) / 1.5
    hi = max(pts["meas_s"].max(), pts["pred_s"].max()) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    for f in (0.5, 2.0):
        ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured time per iteration [s]",
           ylabel="predicted time per iteration [s]")
    med, p90 = errors
    ax.set_title(f"{len(pts)} points; |error| median {100 * med:.0f}%, p90 {100 * p90:.0f}% (dotted: 2x)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    if two:
        ax = axes[0][1]
        stats = phases.set_index("phase")[["median", "min", "max"]]
        stats = stats.dropna().head(top).iloc[::-1].rename(columns={"median": "med", "min": "lo", "max": "hi"})
        y = np.arange(len(stats))
        ax.barh(y, 100 * stats["med"], color=np.where(stats["med"] >= 0, "tab:red", "tab:blue"), alpha=0.7)
        ax.errorbar(100 * stats["med"], y, xerr=[100 * (stats["med"] - stats["lo"]), 100 * (stats["hi"] - stats["med"])],
                    fmt="none", ecolor="k", lw=0.8, capsize=2)
        ax.set_yticks(y, stats.index, fontsize=8)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel("(predicted - measured) / measured [%]: median, min..max over points")
        ax.set_title(f"per phase (the {len(stats)} longest measured)", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path
