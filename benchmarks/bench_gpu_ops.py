"""What one eager torch op costs on a GPU, by kind, and whether a small model's
pass is bound by the GPU or by the CPU that issues its ops.

    python benchmarks/bench_gpu_ops.py        # needs a CUDA GPU; prints microseconds as JSON

Every op runs 400 times back to back with one synchronisation at the end
(median of three spans after 20 warm-ups), at resnet20_cifar10's sizes (batch
32, 16 channels of 32x32): so each figure is max(issue cost, GPU time) per
call. The models' forward passes run eagerly and as a replayed CUDA graph (the
GPU's work alone, no Python and no dispatch per op). On an H100 (2026-11-26,
docs/calibrations/h100_ops.json): elementwise ops 6 to 8 us, a convolution 24
us (31 through its module), a training batch norm 16 (31), and resnet20's
forward 1.97 ms eager against 0.51 ms as a graph.
"""
from __future__ import annotations

import json
import sys


def per_call(fn, sync, n=400):
    """Median of three spans of ``n`` back-to-back calls, after 20 warm-ups."""
    from simsparse.calibration.worker import _median, per_call as span

    for _ in range(20):
        fn()
    return _median([span(fn, sync, n) for _ in range(3)])


def main() -> int:
    import torch
    import torch.nn.functional as F

    from simsparse import models

    if not torch.cuda.is_available():
        print("bench_gpu_ops: torch sees no CUDA device; nothing to measure", file=sys.stderr)
        return 0
    dev, sync = torch.device("cuda"), torch.cuda.synchronize
    x = torch.randn(32, 16, 32, 32, device=dev)
    w = torch.randn(16, 16, 3, 3, device=dev)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False).to(dev)
    bn = torch.nn.BatchNorm2d(16).to(dev)
    rm, rv, g, b = (torch.zeros(16, device=dev), torch.ones(16, device=dev), torch.ones(16, device=dev),
                    torch.zeros(16, device=dev))
    a1 = torch.ones(1, device=dev)
    c1 = torch.empty_like(a1)
    lx, lw = torch.randn(32, 64, device=dev), torch.randn(10, 64, device=dev)
    xg = x.clone().requires_grad_()

    def block():
        F.relu(bn(conv(xg))).sum().backward()

    ops = {"add_1elem_out": lambda: torch.add(a1, a1, out=c1), "relu": lambda: F.relu(x),
           "add_32x16x32x32": lambda: x + x, "conv2d_F": lambda: F.conv2d(x, w, padding=1),
           "conv2d_module": lambda: conv(x),
           "batch_norm_train_F": lambda: F.batch_norm(x, rm, rv, g, b, training=True),
           "batch_norm_module": lambda: bn(x), "linear_F": lambda: F.linear(lx, lw)}
    res = {k: per_call(f, sync) for k, f in ops.items()}
    res["conv_bn_relu_fwd_bwd"] = per_call(block, sync, 200)
    for name in ("resnet20_cifar10", "vgg16_cifar10"):
        m = models.build(name).to(dev)
        batch = models.example_batch(name, 32, generator=torch.Generator().manual_seed(0), device=dev)
        res[f"{name}_fwd"] = per_call(lambda: models.loss(name, m, batch), sync, 50)
        with torch.no_grad():
            res[f"{name}_fwd_nograd"] = per_call(lambda: models.loss(name, m, batch), sync, 50)

        def step():
            for p in m.parameters():
                p.grad = None
            models.loss(name, m, batch).backward()

        res[f"{name}_fwd_bwd"] = per_call(step, sync, 30)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():   # warm-up off the default stream, as graph capture asks
            for _ in range(3):
                models.loss(name, m, batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            models.loss(name, m, batch)
        res[f"{name}_fwd_nograd_graph"] = per_call(graph.replay, sync, 50)
    json.dump({k: round(v * 1e6, 2) for k, v in res.items()}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
