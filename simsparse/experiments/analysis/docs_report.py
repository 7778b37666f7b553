"""``simsparse report``: the documentation's measured figures, rendered from stored results.

Figures are data, never typed by hand: a run writes its results with their
provenance (``simsparse papers`` writes ``papers.csv`` and
``papers.provenance.json``), the results the docs quote are kept under
``docs/data/``, and this renders them:

* ``docs/papers.md``: the claim-by-claim table, between its
  ``<!-- papers: begin/end -->`` lines (:func:`.papers_run.markdown`);
* ``README.md``: the headline lines, between ``<!-- headline: begin/end -->``,
  one per stored source: the papers' claims met, the dates and machines of
  the runs staying in the provenance files.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ...files import atomic_write
from .papers import PapersError
from .papers_run import markdown, splice

#: the lines the README's headline block sits between
HEADLINE = ("<!-- headline: begin -->", "<!-- headline: end -->")


def read_claims(path: Path) -> pd.DataFrame:
    """A stored ``papers.csv`` as written: every value its text, ``meets_aim`` True, False or None."""
    t = pd.read_csv(path, dtype=str, keep_default_na=False)
    t["meets_aim"] = t["meets_aim"].map({"True": True, "False": False}).astype(object).where(
        t["meets_aim"].isin(["True", "False"]), None)
    return t


def headline(data: Path) -> list[str]:
    """One line per stored source under ``data``, each with the page that explains it."""
    lines = []
    papers = data / "papers.csv"
    if papers.is_file():
        t = read_claims(papers)
        met, judged = int(t["meets_aim"].eq(True).sum()), int(t["meets_aim"].notna().sum())
        per = t.groupby("paper", sort=False)["meets_aim"].apply(lambda s: f"{int(s.eq(True).sum())}/{int(s.notna().sum())}")
        lines.append(f"* **Papers**: {met} of {judged} claims of the five seed papers met "
                     f"({', '.join(f'{p} {v}' for p, v in per.items())}); every claim in `docs/papers.md`.")
    return lines


def render(data: Path, readme: Path, docs: Path) -> list[Path]:
    """Render every page whose data is stored; returns the files written."""
    written = []
    papers = data / "papers.csv"
    if papers.is_file():
        written.append(splice(docs / "papers.md", markdown(read_claims(papers))))
    lines = headline(data)
    try:
        text = readme.read_text()
    except OSError as e:
        raise PapersError(f"{readme}: {e.strerror}") from None
    begin, end = HEADLINE
    if begin not in text or end not in text:
        raise PapersError(f"{readme}: no '{begin}' and '{end}' lines to write the headline between")
    head, rest = text.split(begin, 1)
    new = head + begin + "\n" + "".join(f"{line}\n" for line in lines) + end + rest.split(end, 1)[1]
    atomic_write(readme, lambda tmp: Path(tmp).write_text(new))
    written.append(readme)
    return written


def provenance_of(data: Path) -> dict:
    """The stored provenance files under ``data``, by name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(data.glob("*.provenance.json"))}
