"""Hints in error messages: "did you mean", and where a YAML mistake is."""
from __future__ import annotations

from pathlib import Path

from ...registry import did_you_mean  # noqa: F401  (the config loader's hints)


_OPENERS = {"flow sequence": "this '[' list", "flow mapping": "this '{' mapping", "quoted": "this quoted string"}


def yaml_where(e, path: Path) -> str:
    """Where a YAML error is. The parser notices an unclosed bracket or quote
    only where the next token cannot continue it, often lines later; its
    *context* mark is where the construct began, so that is the line named."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    pm, cm = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
    context = getattr(e, "context", None) or ""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []

    def show(mark):
        text = lines[mark.line].strip() if mark.line < len(lines) else ""
        return f"line {mark.line + 1}, column {mark.column + 1}" + (f" ({text!r})" if text else "")

    if cm is not None and pm is not None and (cm.line, cm.column) < (pm.line, pm.column):
        began = context.removeprefix("while ").replace("parsing ", "").replace("scanning ", "")
        opened = next((w for k, w in _OPENERS.items() if k in began), None)
        if opened:  # an unclosed [ { or quote: the mistake is where it opened
            return f" at {show(cm)}: {opened} is not closed; the parser gave up at {show(pm)}: {problem}"
        return f" at {show(pm)}: {problem} (in the {began.removeprefix('a ')} that starts at line {cm.line + 1})"
    return f" at {show(pm)}: {problem}" if pm is not None else f": {problem}"
