"""Numbers as the tables and the progress line print them."""
from __future__ import annotations

import math


def _finite(x) -> float | None:
    """``x`` as a finite float, or None (missing, text, nan, inf)."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def fmt_time(s) -> str:
    """Seconds with a unit and 3 significant digits: ``464 us``, ``12.8 ms``, ``1.20 s``."""
    s = _finite(s)
    if s is None:
        return "-"
    if s == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale * (1 - 5e-4):
            return f"{_sig(s / scale)} {unit}"
    return f"{_sig(s / 1e-9)} ns"


def fmt_bytes(b) -> str:
    """Bytes in decimal units, 3 significant digits: ``83.9 kB``, ``4.19 MB``."""
    b = _finite(b)
    if b is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale * (1 - 5e-4):
            return f"{_sig(b / scale)} {unit}"
    return f"{b:.0f} B"


def fmt_count(n) -> str:
    """Element counts: exact multiples of 2^20 / 2^10 as ``1Mi`` / ``64Ki``,
    others with 3 significant digits (``1.73M``), small ones as they are."""
    try:
        n = int(n)
    except (TypeError, ValueError):
        return str(n)
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e4)):  # below 10000: all digits
        if n >= scale:
            return f"{_sig(n / (1e3 if unit == 'k' else scale))}{unit}"
    return str(n)


def fmt_duration(s: float) -> str:
    """Wall-clock durations: ``8 s``, ``2 min 05 s``, ``1 h 03 min``."""
    if not math.isfinite(s):
        return "?"
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _sig(x: float) -> str:
    """3 significant digits, no e-notation for the magnitudes used here."""
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"
