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
    from .execute import jobs_for

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
    at_once, _, why = jobs_for(exp.points, budget.Budget.from_env(), trace, jobs)
    print(f"points: {f'{at_once} at once' if at_once > 1 else 'one after another in this process'} ({why})", file=out)
