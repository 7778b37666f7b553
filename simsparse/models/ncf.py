"""NeuMF (He et al. 2017) for MovieLens-20M with the MLPerf NCF sizes (assumed: the MLPerf NCF reference config).

Layout of the MLPerf training reference ``recommendation/pytorch/neumf.py``: MF embeddings of
64 and MLP embeddings of 128 for 138,493 users and 26,744 items, MLP 256 -> 256 -> 128 -> 64
with ReLU, final Linear(64 + 64 -> 1), binary cross-entropy on implicit feedback.
Input: one (user, item) pair per sample. 31,832,577 parameters in 12 tensors. Our own code.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

USERS, ITEMS, MF_DIM, MLP = 138493, 26744, 64, (256, 256, 128, 64)


class NeuMF(nn.Module):
    def __init__(self):
        super().__init__()
        self.mf_user_embed = nn.Embedding(USERS, MF_DIM)
        self.mf_item_embed = nn.Embedding(ITEMS, MF_DIM)
        self.mlp_user_embed = nn.Embedding(USERS, MLP[0] // 2)
        self.mlp_item_embed = nn.Embedding(ITEMS, MLP[0] // 2)
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(MLP[:-1], MLP[1:]))
        self.final = nn.Linear(MLP[-1] + MF_DIM, 1)

    def forward(self, user, item):
        xmf = self.mf_user_embed(user) * self.mf_item_embed(item)
        x = torch.cat((self.mlp_user_embed(user), self.mlp_item_embed(item)), dim=1)
        for layer in self.mlp:
            x = F.relu(layer(x))
        return self.final(torch.cat((xmf, x), dim=1)).squeeze(1)


def build(name: str) -> nn.Module:
    assert name == "ncf_ml20m", name
    return NeuMF()


def example_batch(name: str, batch_size: int, generator=None, device="cpu"):
    """((user ids, item ids), 0/1 float labels), each (N,)."""
    u = torch.randint(0, USERS, (batch_size,), generator=generator)
    i = torch.randint(0, ITEMS, (batch_size,), generator=generator)
    y = torch.randint(0, 2, (batch_size,), generator=generator).float()
    return (u.to(device), i.to(device)), y.to(device)


def loss(name: str, model: nn.Module, batch) -> torch.Tensor:
    """Binary cross-entropy with logits (MLPerf NCF)."""
    (u, i), y = batch
    return F.binary_cross_entropy_with_logits(model(u, i), y)
