"""The default plot of a results table: iteration time against P."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .store import atomic_write  # noqa: E402

FACETS = ["network", "compute", "n", "density", "dtype"]


def plot_time_vs_P(df: pd.DataFrame, path: Path, title: str = "") -> Path:
    """One panel per combination of the facet columns that vary, one line per
    algorithm (and parameter setting); log-log axes."""
    df = df.copy()
    df["series"] = df["algorithm"] + df["params"].fillna("").map(lambda p: f" {p}" if p else "")
    facets = [c for c in FACETS if c in df.columns and df[c].nunique() > 1]
    groups = list(df.groupby(facets)) if facets else [((), df)]
    groups = groups[:12]
    ncol = min(3, len(groups))
    nrow = (len(groups) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.8 * nrow), squeeze=False)
    for ax, (key, g) in zip(axes.flat, groups):
        for series, s in g.groupby("series"):
            s = s.sort_values("P")
            ax.plot(s["P"], s["time_s"], marker="o", label=series)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("P (ranks)")
        ax.set_ylabel("time per iteration [s]")
        key = key if isinstance(key, tuple) else (key,)
        ax.set_title(", ".join(f"{c}={v}" for c, v in zip(facets, key)) or title, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path
