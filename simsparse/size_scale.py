"""Factors per message or kernel size (SMPI-style piecewise factors): a
``[[size, factor], ...]`` list that multiplies a line's time, interpolated
in log size and constant beyond its ends. One type for the alpha-beta
network's ``size_scale``, a kernel's and the send and receive path's."""
from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import AfterValidator


def _check(scale):
    if scale:
        sizes = [m for m, _ in scale]
        if any(m <= 0 for m in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"size_scale sizes {sizes}: must be positive and increasing")
        if any(not f > 0 for _, f in scale):
            raise ValueError(f"size_scale factors {[f for _, f in scale]}: must be > 0")
    return scale


#: ``[[size, factor], ...]``: sizes positive and increasing, factors > 0
SizeScale = Annotated[list[tuple[int, float]], AfterValidator(_check)]


def log_table(scale) -> tuple[np.ndarray, np.ndarray] | None:
    """``scale`` as (log sizes, factors) for :func:`factor_at`; None for no factors."""
    if not scale:
        return None
    return np.log([float(m) for m, _ in scale]), np.array([float(f) for _, f in scale])


def factor_at(table, size):
    """The factor of a :func:`log_table` at ``size`` (a number or an array); 1 without one."""
    if table is None:
        return 1.0
    f = np.interp(np.log(np.maximum(size, 1.0)), *table)
    return f if isinstance(f, np.ndarray) and f.ndim else float(f)
