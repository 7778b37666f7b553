"""Record per-rank gradients of a small torch model for replay by a ``source:`` workload.

    python scripts/record_gradients.py --out grads/rank{rank}_iter{iteration}.npz --ranks 4 --iterations 3

Trains a small CNN with data-parallel SGD on random images: each rank takes
its own shard of each batch, its flattened ``.grad`` (plus the layer sizes)
is saved with :func:`simsparse.workload.record_gradients`, and the averaged
gradient updates the shared model, so later iterations see a trained model.
Replay them with::

    workload: {source: {path: "grads/rank{rank}_iter{iteration}.npz"}, density: 0.01}

In your own training loop, call ``record_gradients(model.parameters(), path,
rank, iteration)`` after ``loss.backward()`` on every rank.
"""
import argparse

import torch

from simsparse.workload import record_gradients


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="grads/rank{rank}_iter{iteration}.npz")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="images per rank")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for it in range(a.iterations):
        images, labels = torch.randn(a.ranks * a.batch, 3, 32, 32), torch.randint(0, 10, (a.ranks * a.batch,))
        total = [torch.zeros_like(p) for p in net.parameters()]
        for r in range(a.ranks):
            net.zero_grad()
            sl = slice(r * a.batch, (r + 1) * a.batch)
            torch.nn.functional.cross_entropy(net(images[sl]), labels[sl]).backward()
            path = record_gradients(net.parameters(), a.out, rank=r, iteration=it)
            for t, p in zip(total, net.parameters()):
                t += p.grad / a.ranks
        for t, p in zip(total, net.parameters()):
            p.grad = t
        opt.step()
        print(f"iteration {it}: wrote {a.ranks} files, e.g. {path}")
    n = sum(p.numel() for p in net.parameters())
    print(f"workload: {{source: {{path: {a.out!r}}}}}  # n = {n}, {len(list(net.parameters()))} layers")


if __name__ == "__main__":
    main()
