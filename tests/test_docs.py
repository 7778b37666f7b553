"""The documentation site builds with `mkdocs build --strict` (a broken link or a page missing
from the nav fails), and its generated pages hold what the code holds."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
