"""What the real backend's send path costs in a loop of messages and inside an
algorithm: ``wire.pack`` of the payloads the algorithms send, back to back and
after what a rank does between two messages (waits, kernels).

    python benchmarks/bench_message_path.py [--reps 400]

Prints, per payload, the median pack and unpack time back to back, after a
1 ms sleep (a rank that waited in MPI), after a sweep of 16 MB (a kernel),
and after both. ``simsparse calibrate`` therefore times the path around the
messages of its algorithm runs, not in a loop (``simsparse.compute.message_path``).
Run it with nothing else on the machine.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args()
    import torch

    from simsparse.backends.real import wire
    from simsparse.ops import COO, Bundle, Dense

    torch.set_num_threads(1)
    x = torch.randn(1 << 20)
    sweep = torch.randn(4 << 20)   # 16 MB

    def to_numpy(t):
        return t.detach().cpu().numpy()

    def payloads():
        _, ix = torch.topk(x[:10000].abs(), 100)
        return {"COO block of 100 (800 B) in a bundle": Bundle((COO(ix.to(torch.int32), x[ix], 10000),)),
                "dense slice of 5000 (20 KB)": Dense(x[5000:10000]),
                "dense slice of 500000 (2 MB, uncopied)": Dense(x[:500000])}

    between = {"back to back": lambda: None, "after a 1 ms sleep": lambda: time.sleep(1e-3),
               "after a 16 MB sweep": lambda: sweep.sum(),
               "after both": lambda: (time.sleep(1e-3), sweep.sum())}
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.reps}")
    print(f"{'payload':40s} {'before the pack':22s} {'pack':>9s} {'unpack':>9s}")
    for name in payloads():
        for label, fn in between.items():
            tp, tu = [], []
            for _ in range(args.reps):
                fn()
                p = payloads()[name]
                t0 = time.perf_counter()
                buf, data = wire.pack(p, to_numpy)
                t1 = time.perf_counter()
                wire.unpack(buf, torch.from_numpy, data)
                tu.append(time.perf_counter() - t1)
                tp.append(t1 - t0)
            print(f"{name:40s} {label:22s} {np.median(tp) * 1e6:7.1f}us {np.median(tu) * 1e6:7.1f}us")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
