"""Factors per message or kernel size (SMPI-style piecewise factors): a
``[[size, factor], ...]`` list that multiplies a line's time, interpolated
in log size and constant beyond its ends. One type for the alpha-beta
network's ``size_scale``, a kernel's and the send and receive path's."""
from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


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


class DensityScale(BaseModel):
    """Factors over (size, density) for a selection kernel, whose time at one
    size moves with how many entries it keeps (top-k's k): ``factors[i][j]``
    at ``sizes[i]`` and ``densities[j]`` (k / size), interpolated bilinearly
    in log size and log density, constant beyond the ends. 1 at the density
    the kernel's line was fitted at (``reference_density``).

    The line comes from the algorithm runs, whose calls pay what the grid's
    calls on their own do not (a vector cold in the caches, a rank's
    co-runner): ``own_share[i]`` is the grid's time at the reference density
    over the line's at ``sizes[i]`` (at most 1). Only that share moves with
    the density: the factor applied is ``1 + own_share (f - 1)``, so what
    the runs add stays the same seconds at every density (gather_at at 3.1M
    entries: the line gives 0.36 ms at density 0.004, the grid 0.08 ms; the
    plain factor put density 0.05 at 4.3 ms where the held-out runs took
    1.4). The random-access kernels' grid is timed cold, as the runs meet
    their vector (``worker.COLD_KERNELS``), so their share is near 1.
    Without it (older profiles) the whole line moves."""

    model_config = ConfigDict(extra="forbid")
    reference_density: float = Field(gt=0, le=1, description="the density of the calls the line was fitted from")
    sizes: list[int] = Field(min_length=1, description="elements (a calibration's kernel sizes, up to 1.2e7)")
    densities: list[float] = Field(min_length=1)
    factors: list[list[float]]
    own_share: list[float] | None = Field(None, description="per size, the grid's time at the reference density "
                                                            "over the line's (at most 1): the share that moves")

    @model_validator(mode="after")
    def _shape(self):
        for key, xs in (("sizes", self.sizes), ("densities", self.densities)):
            if any(x <= 0 for x in xs) or any(b <= a for a, b in zip(xs, xs[1:])):
                raise ValueError(f"select_scale {key} {xs}: must be positive and increasing")
        if len(self.factors) != len(self.sizes) or any(len(row) != len(self.densities) for row in self.factors):
            raise ValueError(f"select_scale factors: one row per size ({len(self.sizes)}), each with one factor per "
                             f"density ({len(self.densities)})")
        if any(not f > 0 for row in self.factors for f in row):
            raise ValueError("select_scale factors: must be > 0")
        if self.own_share is not None and (len(self.own_share) != len(self.sizes)
                                           or any(not 0 < x <= 1 for x in self.own_share)):
            raise ValueError(f"select_scale own_share: one per size ({len(self.sizes)}), each in (0, 1]")
        return self

    def at(self, size, density):
        """The factor at ``size`` elements keeping ``density`` of them (numbers or arrays of one shape)."""
        ls, ld = np.log(self.sizes), np.log(self.densities)
        x = np.log(np.maximum(np.asarray(size, float), 1.0))
        y = np.log(np.clip(np.asarray(density, float), 1e-12, 1.0))
        by_size = np.array([np.interp(y, ld, row) for row in self.factors])   # (sizes, *shape)
        if len(ls) == 1:
            f = by_size[0]
        else:
            i = np.clip(np.searchsorted(ls, x) - 1, 0, len(ls) - 2)
            w = np.clip((x - ls[i]) / (ls[i + 1] - ls[i]), 0.0, 1.0)
            lo = np.take_along_axis(by_size, i[None], 0)[0] if by_size.ndim > 1 else by_size[i]
            hi = np.take_along_axis(by_size, (i + 1)[None], 0)[0] if by_size.ndim > 1 else by_size[i + 1]
            f = lo + w * (hi - lo)
        if self.own_share is not None:
            own = np.interp(x, ls, self.own_share) if len(ls) > 1 else self.own_share[0]
            f = 1.0 + own * (f - 1.0)
        return f if np.ndim(f) else float(f)
