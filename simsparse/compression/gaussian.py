"""Gaussian-k threshold estimation (Shi et al., "Understanding top-k
sparsification in distributed deep learning", 2019; the Ok-Topk paper's
"Gaussiank" baseline, section 2 and 3.1.3).

The gradient is taken to be normal with its own mean and standard deviation;
the threshold that keeps a fraction ``density`` of it is the normal
percent-point function: ``mu + |z| sigma`` with ``z = Phi^-1(density / 2)``
(``utils.gen_threshold_from_normal_distribution(1 - density, mu, sigma)`` in
the public code, which returns ``mu -/+ z sigma`` and thresholds ``|g|`` by the
upper one). One O(n) pass for the statistics, no sorting.

The statistics are accumulated in float64 in both backends, so numpy and
torch give the same threshold to ~1e-15 relative, far below the float32
spacing of the data (the selection, hence the bytes, are the same).
"""
from __future__ import annotations

from statistics import NormalDist

import numpy as np

from ..compute.kernels import Work, _isz, kernel
from ..compute.sampled import Sampled


@kernel("mean_std", work=lambda out, x: Work(len(x), len(x) * _isz(x)))
def mean_std(x):
    """(mean, unbiased standard deviation) of a dense vector, as Python floats
    (of a sampled one: its distribution's)."""
    if len(x) < 2:
        return (float(x[0]) if len(x) else 0.0), 0.0
    return float(np.mean(x, dtype=np.float64)), float(np.std(x, dtype=np.float64, ddof=1))


@mean_std.on(Sampled)
def _mean_std_sampled(x):
    return x.moments


@mean_std.torch
def _mean_std_torch(x):
    import torch

    if len(x) < 2:
        return (float(x[0]) if len(x) else 0.0), 0.0
    std, mean = torch.std_mean(x.to(torch.float64), correction=1)
    return float(mean.item()), float(std.item())


def gaussian_threshold(mu: float, sigma: float, density: float) -> float:
    """``mu + |Phi^-1(density/2)| sigma``: the magnitude above which a normal
    N(mu, sigma^2) variable lies with probability ``density`` (for mu = 0)."""
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    return mu + abs(NormalDist().inv_cdf(density / 2)) * sigma
