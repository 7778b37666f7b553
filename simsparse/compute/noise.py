"""Kernel noise: the same kernel call takes a different time each time.

A kernel's cost line (:class:`~simsparse.compute.devices.KernelCost`) is fitted
to the *median* call at each size. A run pays every call's own time, and a
collective waits for the slowest rank's: over an iteration the sum of calls
follows their mean, and a step every rank must finish follows the maximum
over ranks, both above the median (the amplification of OS noise by
synchronisation: Petrini, Kerbyson and Pakin, SC 2003; Hoefler, Schneider
and Lumsdaine, SC 2010, who inject it into LogGOPSim the same way).

``simsparse calibrate`` times every kernel call of its algorithm runs in place,
on every rank at once (:class:`~simsparse.calibration.probes.KernelProbe`);
each call over the median of its (kernel, size) is one sample of the noise. Short calls vary
most (on this host a call of about 10 us had a mean 1.10 and a 90th
percentile 1.42 times its median, one of 1 to 10 ms 1.005 and 1.11), so the
samples are kept per decade of the median call time (:class:`NoiseBand`:
20 equally likely ratios, the quantiles at (i + 1/2) / 20).

The simulator multiplies each kernel call's modelled time, and each piece
of a layer's forward and backward, by one ratio drawn from the band of that
time (:class:`KernelNoise`). A kernel draws from the kernel calls' bands; a
layer's piece from its model's own, fitted on the repetitions of the
model's timing (``ModelTimes.noise``), where they were kept. The draw is a hash of
(seed, rank, the rank's call count): independent between ranks and calls,
identical from run to run.
"""
from __future__ import annotations

import bisect

from pydantic import BaseModel, ConfigDict, Field, field_validator

_MASK = (1 << 64) - 1


class NoiseBand(BaseModel):
    """Calls whose median time is at most ``up_to_s`` (the last band: any longer)."""

    model_config = ConfigDict(extra="forbid")
    up_to_s: float = Field(gt=0, description="the band's upper edge: calls of a median time up to this")
    ratios: list[float] = Field(min_length=2, description="equally likely values of a call's time over its "
                                                          "median, ascending")

    @field_validator("ratios")
    @classmethod
    def _positive_ascending(cls, v):
        if any(r <= 0 for r in v) or any(b < a for a, b in zip(v, v[1:])):
            raise ValueError("ratios must be positive and ascending (quantiles of time over median)")
        return v


def _splitmix64(x: int) -> int:
    """One step of SplitMix64 (Steele, Lea and Flood, OOPSLA 2014): a 64-bit hash of ``x``."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class KernelNoise:
    """Draws each kernel call's factor (:meth:`factor`) from the profile's bands."""

    __slots__ = ("edges", "ratios", "seed", "calls")

    def __init__(self, bands, seed: int = 0):
        bands = sorted((b if isinstance(b, NoiseBand) else NoiseBand.model_validate(b) for b in bands),
                       key=lambda b: b.up_to_s)
        if not bands:
            raise ValueError("kernel_noise needs at least one band")
        self.edges = [b.up_to_s for b in bands[:-1]]
        self.ratios = [tuple(b.ratios) for b in bands]
        self.seed = seed
        self.calls: dict[int, int] = {}

    def factor(self, rank: int, seconds: float) -> float:
        """The factor on the ``rank``'s next call, of modelled time ``seconds``."""
        count = self.calls.get(rank, 0)
        self.calls[rank] = count + 1
        ratios = self.ratios[bisect.bisect_left(self.edges, seconds)]
        u = _splitmix64((self.seed << 48) ^ (rank << 32) ^ count)
        return ratios[(u * len(ratios)) >> 64]

    def mean(self, seconds: float) -> float:
        """The mean factor on a call of ``seconds``."""
        ratios = self.ratios[bisect.bisect_left(self.edges, seconds)]
        return sum(ratios) / len(ratios)


def draws_noise(compute: dict | None) -> bool:
    """Whether a point's profile (a ``compute`` dict) draws noise: its kernels' or a model's own."""
    compute = compute or {}
    return bool(compute.get("kernel_noise")) or any((m or {}).get("noise")
                                                    for m in (compute.get("models") or {}).values())
