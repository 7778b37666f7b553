"""The differential harness on its full grid: every evaluator, forced through
the knob, on every algorithm, protocol variant and P, against the events.

Writes ``docs/evaluators.csv`` (one row a case and evaluator) and the table
between the markers in ``docs/architecture.md``: for each evaluator and
variant, how many (algorithm, P) cases were exact, within the declared
bound (with the largest error seen), or declined, and the bound. A broken
claim (an exact row that is not exact, a time past its bound) stops it.

    python scripts/evaluator_table.py            # the full grid (a few minutes)
    python scripts/evaluator_table.py --P 5 13   # fewer ranks
    python scripts/evaluator_table.py --render   # the table again from the stored CSV (the table's evaluators)
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simsparse.backends.evaluators import TABLE  # noqa: E402
from tests.backends.harness import ALGORITHMS, VARIANTS, label, reference, run_case  # noqa: E402

BEGIN, END = "<!-- evaluator table: begin -->", "<!-- evaluator table: end -->"
#: the last forced row's runtime causes (tests.backends.harness keeps it)
from tests.backends.harness import LAST  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, nargs="+", default=[1, 2, 3, 5, 8, 13, 64])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    ap.add_argument("--measure", action="store_true", help="record a broken claim and go on (to set the bounds)")
    ap.add_argument("--render", action="store_true", help="run nothing: render the stored CSV's rows of the "
                                                          "table's evaluators")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.render:
        with open(args.out / "evaluators.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["evaluator"] in TABLE]
        args.variants = list(dict.fromkeys(r["variant"] for r in rows))
        return write(rows, args, t0)
    rows = []
    for alg in ALGORITHMS:
        for variant in args.variants:
            for P in args.P:
                ref = reference(alg, variant, P)
                for name in TABLE:
                    if name == "events":
                        continue
                    outcome, detail = run_case(alg, variant, P, name, ref, strict=not args.measure)
                    err = ""
                    if outcome == "within":
                        err = detail.split("%")[0]
                    elif outcome == "broken" and "error " in detail:
                        err = str(100 * float(detail.split("error ")[1].split()[0].rstrip("'\")")))
                    rows.append({"evaluator": name, "variant": variant, "algorithm": label(alg), "P": P,
                                 "outcome": outcome, "error_pct": err, "detail": detail})
                    if outcome in ("within", "broken") and name in ("replay", "replay_py", "arrays"):
                        rows[-1]["detail"] += " met " + LAST.get("inexact", "")
            print(f"{label(alg)}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return write(rows, args, t0)


def write(rows: list, args, t0: float) -> int:
    """The CSV and the table in docs/architecture.md."""
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "evaluators.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    table = render(rows, args.variants)   # (from the rows: also `--render` of a stored CSV)
    arch = args.out / "architecture.md"
    text = arch.read_text()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + BEGIN + "\n" + table + END + rest.split(END, 1)[1]
        arch.write_text(text)
    print(table)
    print(f"{len(rows)} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def render(rows: list, variants: list) -> str:
    """One line per evaluator and variant: exact / within (largest error) / declined."""
    out = ["| evaluator | variant | exact | within its bound (largest error) | declined | declared |",
           "|---|---|---|---|---|---|"]
    for name in TABLE:
        if name == "events":
            continue
        for v in variants:
            mine = [r for r in rows if r["evaluator"] == name and r["variant"] == v]
            if not mine:
                continue
            n = {k: sum(r["outcome"] == k for r in mine) for k in ("exact", "within", "declined", "broken")}
            errs = [float(r["error_pct"]) for r in mine if r["error_pct"]]
            worst = f" ({max(errs):.2f} %)" if errs else ""
            bounds = sorted({r["detail"].split("at most ")[-1].split(" met ")[0] for r in mine if r["outcome"] == "within"})
            declared = ", ".join(bounds) + (" (at run time)" if n["exact"] and bounds else "") if bounds \
                else "exact" if n["exact"] else "-"
            broken = f", {n['broken']} BROKEN" if n["broken"] else ""
            out.append(f"| {name} | {v} | {n['exact']} | {n['within']}{worst}{broken} | {n['declined']} | {declared} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
