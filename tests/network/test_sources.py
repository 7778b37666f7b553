"""Sources inside the repository: every number of a network preset
(``topologies/``) and of a device profile (``simsparse/compute/profiles/``)
carries a comment naming its source (or saying derived, assumed or a choice),
each file lists its sources under ``source:``, and nothing points at files a
user who clones the repository does not have."""
import re

import pytest
import yaml

from tests.helpers import REPO

PRESETS = sorted((REPO / "topologies").glob("*.yaml")) + sorted((REPO / "simsparse/compute/profiles").glob("*.yaml"))
# a key whose value is a plain scalar, then an optional comment
LINE = re.compile(r"^\s*(?P<key>[\w.-]+):\s*(?P<value>[^\s#][^#]*?)?\s*(?:#\s*(?P<comment>.*))?$")
NUMBER = re.compile(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?")   # 2e-10 too, which YAML 1.1 reads as text
OUTSIDE = ("../shared", "shared/reference", "hardware.md", "seed_impls.md")


def numeric_lines(text):
    """(line number, key, comment) of every line that sets a key to a number."""
    for no, line in enumerate(text.splitlines(), 1):
        m = LINE.match(line)
        if m and m["value"] is not None and NUMBER.fullmatch(m["value"]):
            yield no, m["key"], (m["comment"] or "").strip()


def test_the_convention_sees_numbers_and_their_comments():
    text = "a: 1.0e-6   # Cray white paper\nb: 3\nc: name  # text\nd: true\ne: [1, 2]  # a list\nkernels:\n  topk:\n    per_elem_s: 2e-10\n"
    assert list(numeric_lines(text)) == [(1, "a", "Cray white paper"), (2, "b", ""), (8, "per_elem_s", "")]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_number_cites_its_source(path):
    text = path.read_text()
    source = yaml.safe_load(text).get("source")
    assert isinstance(source, str) and len(source.split()) >= 3, f"{path.name}: `source:` must list the sources"
    lines = list(numeric_lines(text))
    assert lines, f"{path.name}: no numbers found; is the convention still right?"
    for no, key, comment in lines:
        assert len(comment.split()) >= 2, f"{path.name}:{no}: {key} has no comment naming its source"


def test_nothing_cites_files_outside_the_repository():
    found = []
    for folder in ("topologies", "simsparse", "docs", "configs"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in {".py", ".md", ".yaml", ".yml", ".json", ".txt"} and path.is_file():
                text = path.read_text(errors="replace")
                found += [f"{path.relative_to(REPO)}: {s}" for s in OUTSIDE if s in text]
    assert (REPO / "README.md").is_file()
    found += [f"README.md: {s}" for s in OUTSIDE if s in (REPO / "README.md").read_text()]
    assert not found, found
