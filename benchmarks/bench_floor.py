"""The floor of a per-rank discrete-event simulation in CPython: the cheapest
ring allreduce schedule a generator per rank and a heap of events can run,
against simsparse's own ring on the alpha-beta network, at the same P.

    python benchmarks/bench_floor.py --P 256 1024

The toy keeps only what any such simulator must do per message step: resume
the rank's generator, match its send with the neighbour's receive, push the
arrival on a heap and pop it (no payloads, no phases, no kernels, no
network state beyond one latency). Its cost per message is therefore a lower
bound for the design, and says what a target in messages per second needs:
e.g. a ring at P = 4096 is 2 P (P - 1) = 33.5 M messages, so 60 s means
1.8 us per message. Both columns are wall seconds of one process, run back
to back.
"""
from __future__ import annotations

import argparse
import heapq
import sys
import tempfile
import time
from pathlib import Path


def toy_ring(P: int, alpha: float = 1e-6) -> tuple[float, int]:
    """2(P-1) steps per rank; each step sends to r+1 and waits for r-1's message."""
    heap: list = []
    seq = 0
    now = 0.0
    inbox = [0] * P          # messages arrived and not yet consumed
    waiting = [False] * P    # blocked on its receive

    def rank(r):
        right = (r + 1) % P
        for _ in range(2 * (P - 1)):
            yield right        # post the send; then wait for one message from the left
    gens = [rank(r) for r in range(P)]

    def advance(r):
        nonlocal seq
        try:
            dst = next(gens[r])
        except StopIteration:
            return
        seq += 1
        heapq.heappush(heap, (now + alpha, seq, dst))
        if inbox[r]:
            inbox[r] -= 1
            advance(r)
        else:
            waiting[r] = True

    for r in range(P):
        advance(r)
    msgs = 0
    while heap:
        now, _, dst = heapq.heappop(heap)
        msgs += 1
        if waiting[dst]:
            waiting[dst] = False
            advance(dst)
        else:
            inbox[dst] += 1
    return now, msgs


def simsparse_ring(P: int) -> tuple[float, int]:
    import yaml

    from simsparse.experiments.config.schema import load_config
    from simsparse.experiments.run.runner import simulate_point

    cfg = dict(name="floor", P=P, iterations=1, warmup=0, check=False, network="aries_alphabeta",
               algorithms=["ring"], workload={"n": 1048576, "density": 0.01, "dtype": "float32"})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "floor.yaml"
        path.write_text(yaml.safe_dump(cfg))
        (point,) = load_config(path).points
    row = simulate_point(point).row
    return row["time_s"], row["msgs_total"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--P", type=int, nargs="+", default=[256, 1024])
    args = ap.parse_args()
    simsparse_ring(4)   # imports and caches out of the timings
    print(f"{'P':>6} {'messages':>10} {'toy s':>8} {'toy us/msg':>11} {'simsparse s':>12} {'us/msg':>8} {'ratio':>6}")
    for P in args.P:
        t = time.perf_counter()
        _, msgs = toy_ring(P)
        toy = time.perf_counter() - t
        t = time.perf_counter()
        _, m2 = simsparse_ring(P)
        real = time.perf_counter() - t
        assert m2 == msgs, (m2, msgs)
        print(f"{P:>6} {msgs:>10} {toy:>8.2f} {toy / msgs * 1e6:>11.2f} {real:>12.2f} {real / msgs * 1e6:>8.2f} "
              f"{real / toy:>6.1f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
