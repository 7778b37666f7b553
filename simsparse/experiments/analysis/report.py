"""What a finished ``run``, ``measure`` or ``sweep`` prints: the table, the
plot and the combined traces; exit status 1 when a result was wrong."""
from __future__ import annotations

import sys
from pathlib import Path

from ..config.schema import Experiment
from ..results.store import ResultsStore
from .plot import plot_time_vs_P
from .table import results_table


def report(exp: Experiment, store: ResultsStore, out_dir: Path, baseline: str | None = None, trace: bool = False,
           plot: bool = True, written: tuple = ()) -> int:
    """The table, the plot and the combined traces of a finished run; exit 1 when a result was wrong."""
    df = store.frame()
    traces, note = store.combine_traces(trace)
    if note:
        print(f"simsparse: {note}", file=sys.stderr)
    table, notes = results_table(df, baseline)
    for n in notes:
        print(f"simsparse: {n}", file=sys.stderr)
    if exp.description:
        print(f"{exp.name}: {exp.description}")
    print(table)
    written = [store.file, *written]
    if plot and not df.empty:
        written.append(plot_time_vs_P(df, out_dir / "time_vs_P.png", title=exp.name))
    written += traces
    if trace:
        written.append(store.trace_dir)
    print("wrote " + ", ".join(str(w) for w in written))
    bad = df[df["correct"].astype(str) == "False"] if "correct" in df else df.iloc[:0]
    if len(bad):
        print(f"simsparse: {len(bad)} points gave results that differ from the numpy reference", file=sys.stderr)
        return 1
    return 0
