"""trace.json: the Trace Event format of a results folder's trace (Perfetto, chrome://tracing)."""
import json
import os
import stat
import textwrap
from collections import defaultdict

import pandas as pd
import pytest

from simsparse.cli import main
from simsparse.experiments.analysis.compare import read_csv
from simsparse.experiments.results.trace_event import trace_events, write_trace_json

CFG = """
name: te
network: {model: alphabeta, alpha_s: 1.0e-6, bandwidth_Bps: 1.0e9}
compute: p100
workload: {n: 1024, density: 0.05, seed: 1}
algorithms: [ring, oktopk]
P: [2, 4]
iterations: 2
warmup: 1
"""


def _ns(x):
    return round(x * 1000)


def _check_format(obj):
    """Numeric ts/dur >= 0, named processes and threads, properly nested events per thread."""
    assert set(obj) >= {"traceEvents", "displayTimeUnit"} and obj["displayTimeUnit"] in ("ms", "ns")
    ev = obj["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    xs = [e for e in ev if e["ph"] == "X"]
    spans = defaultdict(list)
    for e in xs:
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["pid"] in procs and (e["pid"], e["tid"]) in threads
        assert {"peer", "bytes"} <= set(e["args"]) and e["cat"] and e["name"]
        spans[e["pid"], e["tid"]].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    for v in spans.values():  # the format requires complete events of one thread to nest
        stack = []
        for s, end in sorted(v, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or end <= stack[-1]
            stack.append(end)
    assert len({t for _, t in threads}) == len(threads)  # tids unique over the file
    return procs, threads, xs


@pytest.fixture(autouse=True)
def usual_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_run_with_trace_writes_trace_json(tmp_path):
    cfg = tmp_path / "te.yaml"
    cfg.write_text(textwrap.dedent(CFG))
    out = tmp_path / "res"
    assert main(["run", str(cfg), "--out", str(out), "--trace", "--no-plot"]) == 0
    with open(out / "trace.json") as f:
        obj = json.load(f)
    procs, threads, xs = _check_format(obj)
    res, tr = read_csv(out / "results.csv"), read_csv(out / "trace.csv")
    assert sorted(procs) == list(range(1, len(res) + 1))
    for pid, row in enumerate(res.itertuples(), start=1):
        assert procs[pid].startswith(f"{pid}: {row.algorithm} P={row.P}") and row.point_id in procs[pid]
    # only the first measured iteration, every one of its records
    assert {e["args"]["iteration"] for e in xs} == {1}
    first = tr[tr.iteration == 1]
    assert len(xs) == len(first)
    # one thread per (rank, lane) of every point, named after it
    for pid, row in enumerate(res.itertuples(), start=1):
        want = {f"rank {r} / {ln}" for r, ln in first[first.point_id == row.point_id][["rank", "lane"]].itertuples(
            index=False)}
        assert {n for (p, _), n in threads.items() if p == pid} == want
    assert stat.S_IMODE((out / "trace.json").stat().st_mode) == 0o644


def _rec(rank, lane, op, s, e, it=1, phase="p", peer=-1):
    return {"point_id": "abc", "iteration": it, "rank": rank, "lane": lane, "phase": phase, "op": op, "peer": peer,
            "bytes": 0, "start_s": s * 1e-6, "end_s": e * 1e-6}


def test_lanes_are_ordered_and_unnested_overlaps_go_to_an_overflow_thread():
    recs = [_rec(0, "comm/b10", "send", 0, 1), _rec(0, "comm/b2", "send", 0, 1), _rec(0, "main", "forward", 0, 5),
            _rec(1, "main", "recv", 1.0, 2.5, peer=0), _rec(1, "main", "send", 2.0, 5.8, peer=0),  # overlap, no nesting
            _rec(1, "main", "compute:add_into", 2.1, 2.2), _rec(0, "main", "x", 0, 99, it=0)]
    res = pd.DataFrame([{"point_id": "abc", "algorithm": "ring", "P": 2, "n": 8, "backend": "mpi", "warmup": 1,
                         "params": "", "schedule": ""}])
    obj = trace_events(pd.DataFrame(recs), res)
    procs, threads, xs = _check_format(obj)
    assert procs == {1: "1: ring P=2 n=8 [mpi] (abc)"}
    order = [threads[1, t] for t in sorted(t for _, t in threads)]
    assert order == ["rank 0 / main", "rank 0 / comm/b2", "rank 0 / comm/b10", "rank 1 / main", "rank 1 / main (2)"]
    assert len(xs) == 6 and all(e["name"] != "x" for e in xs)  # the warm-up iteration is left out
    send = next(e for e in xs if e["name"] == "send" and e["args"]["peer"] == 0)
    assert threads[1, send["tid"]] == "rank 1 / main (2)" and send["ts"] == 2.0 and send["dur"] == pytest.approx(3.8)


def test_all_iterations_are_laid_end_to_end(tmp_path):
    recs = [_rec(0, "main", "a", 0, 10, it=0), _rec(0, "main", "b", 0, 4, it=1), _rec(0, "main", "c", 1, 3, it=2)]
    path = write_trace_json(pd.DataFrame(recs), None, tmp_path / "t.json", all_iterations=True)
    with open(path) as f:
        obj = json.load(f)
    _, _, xs = _check_format(obj)
    assert [(e["name"], e["ts"]) for e in xs] == [("a", 0.0), ("b", 10.0), ("c", 15.0)]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
