"""``simsparse run --explain``: for each point, what the simulator would carry,
which evaluators would time it and why the others are declined, and what the
budget estimates; nothing runs."""
from __future__ import annotations

import sys

from ..config.schema import Experiment
from . import budget
from .resolve import explain


def explain_points(exp: Experiment, trace: bool = False, out=None, jobs: int | None = None) -> None:
    """Print the explanation of every point of ``exp``; points that follow
    with the same explanation are folded into one line; then how many of the
    points would run at once (:func:`.execute.jobs_for`, ``--jobs``)."""
    from .execute import POOL_FROM_S, jobs_for

    out = out or sys.stdout
    last, same = None, 0
    for i, p in enumerate(exp.points, 1):
        lines = explain(p, trace)
        est = budget.point_estimate(p, trace)
        lines.append(f"estimate: {est.seconds:.3g} s, {est.memory_B / 1e9:.3g} GB ({est.how})")
        head = f"[{i}/{len(exp.points)}] {p.algorithm} P={p.P}" + (f" {p.schedule}" if p.schedule else "") + \
            f" ({p.network_spec().label()}, {'ideal' if p.compute is None else p.compute.get('name', 'custom')})"
        if lines == last:
            same += 1
            continue
        if same:
            print(f"  (the same for the next {same} points)", file=out)
            same = 0
        print(head, file=out)
        for line in lines:
            print(f"  {line}", file=out)
        last = lines
    if same:
        print(f"  (the same for the next {same} points)", file=out)
    at_once, _ = jobs_for(exp.points, budget.Budget.from_env(), trace, jobs)
    why = (f"{at_once} at once (one per core, the longest estimated first; --jobs 1: one after another)"
           if at_once > 1 else "one after another in this process (" +
           ("--jobs 1)" if jobs == 1 else f"a grid estimated under {POOL_FROM_S:g} s, or a single core or point)"))
    print(f"points: {why}", file=out)
