"""The default plot of a results table: iteration time and busiest-rank bytes against P."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .store import atomic_write  # noqa: E402

FACETS = ["model", "network", "compute", "n", "density", "dtype", "data_scale"]
METRICS = [("time_s", "time per iteration [s]"), ("bytes_sent_max", "bytes sent by the busiest rank")]
MARKERS = "osD^v<>pP*Xh"
STYLES = ["-", "--", "-.", ":"]


def series_styles(names) -> dict:
    """A distinct (colour, marker, line style) for every series, stable by name."""
    cmap = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    return {name: dict(color=cmap(i % cmap.N), marker=MARKERS[i % len(MARKERS)], linestyle=STYLES[(i // 10) % len(STYLES)])
            for i, name in enumerate(sorted(names))}


def plot_time_vs_P(df: pd.DataFrame, path: Path, title: str = "") -> Path:
    """One row of panels per combination of the facet columns that vary
    (time, busiest-rank bytes), one line per algorithm and parameter setting,
    log-log axes, a shared legend on the right."""
    df = df.copy()
    df["series"] = df["algorithm"] + df["params"].fillna("").astype(str).map(
        lambda p: f" {p}" if p and p != "nan" else "")
    if "schedule" in df and df["schedule"].fillna("").astype(str).str.len().any():
        df["series"] = df["schedule"].fillna("").astype(str) + " / " + df["series"]
    facets = [c for c in FACETS if c in df.columns and df[c].nunique() > 1]
    groups = (list(df.groupby(facets)) if facets else [((), df)])[:8]
    styles = series_styles(df["series"].unique())
    nrow = len(groups)
    fig, axes = plt.subplots(nrow, len(METRICS), figsize=(11, 3.6 * nrow + 0.6), squeeze=False)
    for row, (key, g) in zip(axes, groups):
        key = key if isinstance(key, tuple) else (key,)
        where = ", ".join(f"{c}={v}" for c, v in zip(facets, key))
        for ax, (col, label) in zip(row, METRICS):
            for series, s in g.groupby("series"):
                s = s.sort_values("P")
                ax.plot(s["P"], s[col], label=series, markersize=4, **styles[series])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("P (ranks)")
            ax.set_ylabel(label)
            ax.set_title(where, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)
    return path
