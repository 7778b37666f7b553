"""BERT-base pretraining model (Devlin et al. 2019) as trained by Ok-Topk.

Ok-Topk ``BERT/bert`` builds BERT from ``transformers/modeling.py`` (NVIDIA/PipeDream
style ``BertLayer``, ``BertPooler``, ``BertPreTrainingHeads``) split into the stages of
``models/bert/depth=4/*``, with ``configs/bert_config_bert-base-uncased.json``: 12 layers,
hidden 768, 12 heads, ffn 3072, vocab 30522, 512 positions, 2 token types, GELU, dropout
0.1, LayerNorm eps 1e-12. The stages hold their own MLM decoder matrix, so it is not tied
to the word embedding: that gives 133,547,324 parameters in 207 tensors, the total the
Ok-Topk paper reports (1537 V + 86,635,010 with V = 30,522). Attention is written out
(matmul, scale, mask, softmax, dropout, matmul) as in that code. The code here is our own.

One deliberate difference: Ok-Topk's ``BertLMPredictionHead`` keeps the 30,522-element MLM
bias as its own parameter, which ``parameters()`` yields *before* the head transform; here
it is the decoder Linear's bias, right after the decoder matrix, because that is the order
in ``simsparse/data/layer_params.json``. Same tensors, same total, same computation.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, LAYERS, HEADS, FFN, MAX_POS, TYPES, SEQ = 30522, 768, 12, 12, 3072, 512, 2, 128
LN_EPS, DROPOUT, MASKED_FRACTION = 1e-12, 0.1, 0.15


class Embeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = nn.Embedding(MAX_POS, HIDDEN)
        self.token_type_embeddings = nn.Embedding(TYPES, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=LN_EPS)

    def forward(self, input_ids, token_type_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        return F.dropout(self.LayerNorm(x), DROPOUT, self.training)


class Layer(nn.Module):
    """One encoder layer: self-attention (q, k, v, output dense, LayerNorm) then the FFN (dense, dense, LayerNorm)."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.attn_out = nn.Linear(HIDDEN, HIDDEN)
        self.attn_norm = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.intermediate = nn.Linear(HIDDEN, FFN)
        self.output = nn.Linear(FFN, HIDDEN)
        self.out_norm = nn.LayerNorm(HIDDEN, eps=LN_EPS)

    def _heads(self, x):
        n, s, _ = x.shape
        return x.view(n, s, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

    def forward(self, x, mask):
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS) + mask
        probs = F.dropout(F.softmax(scores, dim=-1), DROPOUT, self.training)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(x.shape)
        x = self.attn_norm(F.dropout(self.attn_out(ctx), DROPOUT, self.training) + x)
        h = F.gelu(self.intermediate(x))
        return self.out_norm(F.dropout(self.output(h), DROPOUT, self.training) + x)


class BertPretraining(nn.Module):
    """BERT-base with pooler, MLM head (transform + untied decoder with bias) and NSP head.

    Input: token ids, token type ids and attention mask, each (N, 128); output: MLM logits
    (N, 128, 30522) for every position, as in the Ok-Topk heads, and NSP logits (N, 2).
    """

    def __init__(self):
        super().__init__()
        self.embeddings = Embeddings()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.pooler = nn.Linear(HIDDEN, HIDDEN)
        self.transform = nn.Linear(HIDDEN, HIDDEN)
        self.transform_norm = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.decoder = nn.Linear(HIDDEN, VOCAB)
        self.seq_relationship = nn.Linear(HIDDEN, 2)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        x = self.embeddings(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        h = self.transform_norm(F.gelu(self.transform(x)))
        return self.decoder(h), self.seq_relationship(pooled)


def build(name: str) -> nn.Module:
    assert name == "bert_base", name
    return BertPretraining()


def example_batch(name: str, batch_size: int, generator=None, device="cpu"):
    """((ids, token types, mask), (MLM labels with -1 where not masked, NSP labels)); 15 % of positions masked."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ), generator=generator)
    types = (torch.arange(SEQ) >= SEQ // 2).long().expand(batch_size, SEQ).contiguous()
    mask = torch.ones(batch_size, SEQ, dtype=torch.long)
    masked = torch.rand(batch_size, SEQ, generator=generator).argsort(dim=1)[:, :round(MASKED_FRACTION * SEQ)]
    mlm = torch.full((batch_size, SEQ), -1, dtype=torch.long)
    mlm.scatter_(1, masked, torch.randint(0, VOCAB, masked.shape, generator=generator))
    nsp = torch.randint(0, 2, (batch_size,), generator=generator)
    to = lambda t: t.to(device)
    return (to(ids), to(types), to(mask)), (to(mlm), to(nsp))


def loss(name: str, model: nn.Module, batch) -> torch.Tensor:
    """Pretraining loss: MLM cross-entropy over the masked positions plus NSP cross-entropy."""
    (ids, types, mask), (mlm, nsp) = batch
    scores, rel = model(ids, types, mask)
    return F.cross_entropy(scores.reshape(-1, VOCAB), mlm.reshape(-1), ignore_index=-1) + F.cross_entropy(rel, nsp)
