"""Run experiment points on the simulator backend."""
from __future__ import annotations

from ..config.point import Point
from ..results.metrics import PointOutcome
from .plan import with_plan
from .simulate import simulate


def simulate_point(point: Point, trace: bool = False, keep_results: bool = False,
                   max_seconds: float | None = None) -> PointOutcome:
    """Simulate ``warmup + iterations`` iterations of one point; a point tried
    as bulk rounds that declines with events past ``max_seconds`` stops with
    :class:`~.budget.BudgetError` (None: no limit)."""
    return simulate(with_plan(point), trace, keep_results, max_seconds)
