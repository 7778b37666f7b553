"""Recurrent models: the PTB word-level LSTM and DeepSpeech-style LSTM for AN4.

Shapes and registration order follow GaussianK-SGD/Ok-Topk (see each class);
the code is our own.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

PTB_VOCAB, PTB_STEPS, PTB_DIM = 10000, 35, 1500
AN4_FREQ, AN4_FRAMES, AN4_LABELS, AN4_HIDDEN, AN4_LAYERS, AN4_CONTEXT = 161, 300, 29, 800, 5, 20


class _LSTMSequence(torch.autograd.Function):
    """One unidirectional LSTM layer over a whole (T, N, I) sequence from a zero state, computed as cuDNN does.

    Forward: one GEMM for the input projection of all steps, then per step one GEMM with
    W_hh and the gate arithmetic. Backward: the recurrence for the gate gradients step by
    step, then one GEMM each for dW_ih, dW_hh and the input gradient over all T*N rows.
    Gate order i, f, g, o as in ``nn.LSTM``.
    """

    @staticmethod
    def forward(ctx, x, w_ih, w_hh, b_ih, b_hh):
        t_len, n, _ = x.shape
        hid = w_hh.shape[1]
        pre = torch.addmm(b_ih + b_hh, x.reshape(t_len * n, -1), w_ih.t()).view(t_len, n, 4 * hid)
        h = x.new_zeros(n, hid)
        c = x.new_zeros(n, hid)
        hs, cs, sig, gs, tcs = [h], [c], [], [], []
        for t in range(t_len):
            z = torch.addmm(pre[t], h, w_hh.t())
            s = torch.sigmoid(z)                     # i, f, o gates (the g slice is unused)
            g = torch.tanh(z[:, 2 * hid:3 * hid])
            c = torch.addcmul(s[:, hid:2 * hid] * c, s[:, :hid], g)
            tc = torch.tanh(c)
            h = s[:, 3 * hid:] * tc
            for lst, v in ((hs, h), (cs, c), (sig, s), (gs, g), (tcs, tc)):
                lst.append(v)
        hs, cs, sig, gs, tcs = (torch.stack(v) for v in (hs, cs, sig, gs, tcs))
        ctx.save_for_backward(x, w_ih, w_hh, hs, cs, sig, gs, tcs)
        return hs[1:], cs[-1]

    @staticmethod
    def backward(ctx, grad_out, grad_c_last):
        x, w_ih, w_hh, hs, cs, sig, gs, tcs = ctx.saved_tensors
        t_len, n, _ = x.shape
        hid = w_hh.shape[1]
        dact = sig * (1 - sig)                       # d gate / d pre-activation, all steps at once
        dact[..., 2 * hid:3 * hid] = 1 - gs * gs
        dtc = 1 - tcs * tcs
        dh = torch.zeros_like(hs[0])
        dc = torch.zeros_like(cs[0]) if grad_c_last is None else grad_c_last
        dz = [None] * t_len
        for t in reversed(range(t_len)):
            s, g, tc = sig[t], gs[t], tcs[t]
            i, f, o = s[:, :hid], s[:, hid:2 * hid], s[:, 3 * hid:]
            dh = dh + grad_out[t]
            dc = torch.addcmul(dc, dh * o, dtc[t])
            dz[t] = torch.cat((dc * g, dc * cs[t], dc * i, dh * tc), 1) * dact[t]
            dc = dc * f
            dh = dz[t] @ w_hh
        dg = torch.stack(dz).view(t_len * n, 4 * hid)
        dx = (dg @ w_ih).view_as(x) if ctx.needs_input_grad[0] else None
        dw_ih = dg.t() @ x.reshape(t_len * n, -1)
        dw_hh = dg.t() @ hs[:-1].reshape(t_len * n, hid)
        db = dg.sum(0)
        return dx, dw_ih, dw_hh, db, db.clone()


class SeqLSTM(nn.LSTM):
    """Single-layer unidirectional ``nn.LSTM`` (same tensors, names and initialisation).

    Off CUDA its forward runs :class:`_LSTMSequence` (the cuDNN algorithm in plain torch
    ops: whole-sequence GEMMs for the input projection and the weight gradients), so that
    its measured work per sample matches a GPU run; on CUDA it is ``nn.LSTM`` (cuDNN). The
    initial state is zero; returns ``(output, (h_T, c_T))`` with the final state
    ``(1, N, H)`` as ``nn.LSTM`` does.
    """

    def __init__(self, input_size: int, hidden_size: int, batch_first: bool = False):
        super().__init__(input_size, hidden_size, num_layers=1, bias=True, batch_first=batch_first)

    def forward(self, x, hx=None):
        if x.is_cuda or hx is not None:
            return super().forward(x, hx)
        if self.batch_first:
            x = x.transpose(0, 1)
        out, c = _LSTMSequence.apply(x, self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0)
        h = out[-1:]
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, (h, c.unsqueeze(0))


class LSTMPTB(nn.Module):
    """Two-layer word-level LSTM language model for Penn Treebank (Zaremba et al. 2014, "large").

    As the class ``lstm(vocab_size=10000, embedding_dim=1500, num_steps=35, num_layers=2,
    dp_keep_prob=0.35)`` of Ok-Topk ``LSTM/models/lstm.py`` (created in ``LSTM/dl_trainer.py``):
    Embedding 10000x1500, dropout 0.65, two LSTM layers of 1500, dropout 0.65, Linear 1500 -> 10000 not tied to the
    embedding, cross-entropy over every position; embedding and decoder initialised
    uniformly in [-0.1, 0.1], decoder bias 0.
    The two layers are two single-layer :class:`SeqLSTM` modules with dropout between them; that
    is the computation of one ``nn.LSTM(num_layers=2, dropout=0.65)`` with the same tensors
    in the same order, and lets per-layer costs be told apart.
    Input: (N, 35) token ids; target: the next token at each position. Runs time-major like
    the original (whose trainer transposes the batch), so the logits are (35, N, vocab).
    66,034,000 parameters in 11 tensors.
    """

    def __init__(self, vocab: int = PTB_VOCAB, dim: int = PTB_DIM, layers: int = 2, dropout: float = 0.65):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.lstm = nn.ModuleList(SeqLSTM(dim, dim) for _ in range(layers))
        self.sm_fc = nn.Linear(dim, vocab)
        self.p = dropout
        nn.init.uniform_(self.word_embeddings.weight, -0.1, 0.1)
        nn.init.uniform_(self.sm_fc.weight, -0.1, 0.1)
        nn.init.zeros_(self.sm_fc.bias)

    def forward(self, tokens):
        """(N, 35) token ids -> (35, N, vocab) logits, time-major as in the original."""
        x = F.dropout(self.word_embeddings(tokens.t()), self.p, self.training)
        for layer in self.lstm:
            x, _ = layer(x)           # zero initial state (truncated BPTT state is not carried here)
            x = F.dropout(x, self.p, self.training)
        return self.sm_fc(x)


class SequenceWise(nn.Module):
    """Applies a module to (T, N, H) input collapsed to (T*N, H) (DeepSpeech.pytorch)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x):
        t, n = x.shape[:2]
        return self.module(x.reshape(t * n, -1)).view(t, n, -1)


class BatchRNN(nn.Module):
    """Optional sequence-wise BatchNorm1d followed by a unidirectional LSTM."""

    def __init__(self, cin: int, hidden: int, batch_norm: bool = True):
        super().__init__()
        self.batch_norm = SequenceWise(nn.BatchNorm1d(cin)) if batch_norm else None
        self.rnn = SeqLSTM(cin, hidden)

    def forward(self, x):
        if self.batch_norm is not None:
            x = self.batch_norm(x)
        return self.rnn(x)[0]


class Lookahead(nn.Module):
    """Row convolution over the next ``context`` frames (Wang et al. 2016), weight (features, context+1).

    Computed as a depthwise ``conv1d`` on the zero-padded sequence, which is the same sum
    as the stack-and-multiply of the original code.
    """

    def __init__(self, features: int, context: int):
        super().__init__()
        self.context = context
        self.weight = nn.Parameter(torch.empty(features, context + 1))
        nn.init.uniform_(self.weight, -(context + 1) ** -0.5, (context + 1) ** -0.5)

    def forward(self, x):                                   # (T, N, H)
        y = F.pad(x.permute(1, 2, 0), (0, self.context))    # (N, H, T + context)
        y = F.conv1d(y, self.weight.unsqueeze(1), groups=self.weight.shape[0])
        return y.permute(2, 0, 1)


class DeepSpeechAN4(nn.Module):
    """DeepSpeech2-style acoustic model for AN4 as in Ok-Topk ``LSTM/models/lstm_models.py`` (``DeepSpeech``).

    Built by ``LSTM/models/lstman4.py`` with hidden 800, 5 layers, LSTM, unidirectional,
    16 kHz audio, 20 ms windows (161 frequency bins), 29 labels, lookahead context 20:
    Conv2d(1->32, 41x11, stride 2x2) + BN + Hardtanh(0, 20), Conv2d(32->32, 21x11, stride 2x1)
    + BN + Hardtanh, five LSTM layers of 800 (BatchNorm before all but the first), lookahead
    row convolution + Hardtanh, then BatchNorm1d(800) and Linear 800 -> 29 without bias.
    Input: (N, 1, 161, T) spectrogram, here T = 300 frames (3 s at a 10 ms hop; an assumed
    typical AN4 utterance, the loader's manifests are not public). All utterances in a
    batch have the full length, so there is no packing and no masking.
    27,569,568 parameters in 40 tensors.
    """

    def __init__(self, hidden: int = AN4_HIDDEN, layers: int = AN4_LAYERS, labels: int = AN4_LABELS,
                 context: int = AN4_CONTEXT, freq: int = AN4_FREQ):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, 32, (41, 11), stride=(2, 2), padding=(20, 5)), nn.BatchNorm2d(32), nn.Hardtanh(0, 20, inplace=True),
            nn.Conv2d(32, 32, (21, 11), stride=(2, 1), padding=(10, 5)), nn.BatchNorm2d(32), nn.Hardtanh(0, 20, inplace=True))
        f = (freq + 2 * 20 - 41) // 2 + 1
        f = (f + 2 * 10 - 21) // 2 + 1
        self.rnns = nn.Sequential(*(BatchRNN(32 * f if i == 0 else hidden, hidden, batch_norm=i > 0) for i in range(layers)))
        self.lookahead = nn.Sequential(Lookahead(hidden, context), nn.Hardtanh(0, 20, inplace=True))
        self.fc = SequenceWise(nn.Sequential(nn.BatchNorm1d(hidden), nn.Linear(hidden, labels, bias=False)))

    @staticmethod
    def frames_out(frames: int) -> int:
        """Output frames for ``frames`` input frames (only the first conv strides in time)."""
        return (frames + 2 * 5 - 11) // 2 + 1

    def forward(self, x):                        # (N, 1, F, T)
        x = self.conv(x)                         # (N, 32, F', T')
        n, c, f, t = x.shape
        x = x.view(n, c * f, t).permute(2, 0, 1).contiguous()   # (T', N, 32 F')
        x = self.rnns(x)
        x = self.lookahead(x)
        return self.fc(x).transpose(0, 1)        # (N, T', labels)


def build(name: str) -> nn.Module:
    if name == "lstm_ptb":
        return LSTMPTB()
    if name == "lstm_an4":
        return DeepSpeechAN4()
    raise KeyError(name)


def example_batch(name: str, batch_size: int, generator=None, device="cpu"):
    """PTB: (tokens (N, 35), next tokens (N, 35)); AN4: (spectrogram (N, 1, 161, 300), frame labels (N, 150))."""
    if name == "lstm_ptb":
        seq = torch.randint(0, PTB_VOCAB, (batch_size, PTB_STEPS + 1), generator=generator)
        return seq[:, :-1].to(device), seq[:, 1:].to(device)
    if name == "lstm_an4":
        x = torch.randn(batch_size, 1, AN4_FREQ, AN4_FRAMES, generator=generator)
        y = torch.randint(0, AN4_LABELS, (batch_size, DeepSpeechAN4.frames_out(AN4_FRAMES)), generator=generator)
        return x.to(device), y.to(device)
    raise KeyError(name)


def loss(name: str, model: nn.Module, batch) -> torch.Tensor:
    """Cross-entropy per token (PTB) or per output frame (AN4).

    Ok-Topk trains AN4 with warp-ctc's CTC loss; a per-frame cross-entropy over the same
    (N, T', 29) outputs stands in for it here (CTC has no meta-device kernel, and its cost is
    negligible next to the five LSTM layers).
    """
    x, y = batch
    out = model(x)
    if name == "lstm_ptb":
        y = y.t()                     # logits are time-major
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
