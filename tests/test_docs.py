"""The documentation site builds with `mkdocs build --strict` (a broken link or a page missing
from the nav fails), and its generated pages hold what the code holds."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_site_builds_strict_with_its_generated_pages(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    config = (site / "reference" / "config" / "index.html").read_text()
    for key in ("evaluation", "data_scale", "first_bucket_mb", "unexpected_window_B", "layer_spread"):
        assert f"<code>{key}</code>" in config, key   # every key of the schemas, generated
    from simsparse.algorithms import ALGORITHMS
    pages = {cls.__module__.rsplit(".", 1)[1] for cls in ALGORITHMS.values()}
    for stem in pages:   # one page per family, each naming its algorithms
        text = (site / "algorithms" / stem / "index.html").read_text()
        assert all(f"<code>{n}</code>" in text for n, c in ALGORITHMS.items() if c.__module__.endswith(stem))


#: the pages that say how a figure is measured (their figures: docs/reports/, rendered by simsparse report)
METHOD_PAGES = ("validation.md", "performance.md", "papers.md")
#: what a journal leaves behind: a date, a load average, a commit hash
JOURNAL = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|load [0-9]"
                     r"|(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w.-])")


def test_the_readme_and_the_method_pages_are_short_and_hold_no_history():
    """The README is at most 200 lines and the method pages 300 each; none holds a date, a load
    average or a commit hash (measurements and their provenance live in docs/data/ and the reports)."""
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 200
    for name in METHOD_PAGES:
        assert len((ROOT / "docs" / name).read_text().splitlines()) <= 300, name
    for path in [ROOT / "README.md"] + [ROOT / "docs" / n for n in METHOD_PAGES]:
        found = [f"{path.name}:{i}: {m.group(0)}" for i, line in enumerate(path.read_text().splitlines(), 1)
                 for m in JOURNAL.finditer(line)]
        assert not found, found
