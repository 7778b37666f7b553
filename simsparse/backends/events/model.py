"""The training model on every rank's device (the simulator's handlers of
``forward``, ``grad_ready`` and ``grads_ready``): the model profile's
forward time, and the backward of tensors in reverse registration order,
each gradient ready when the backward has reached it (:mod:`.sim`). Each
piece of a rank's forward and backward draws a factor for its time
(``_piece``): the layers' times are medians of their repetitions, and on
ranks that share cores the pieces' spread sets where a short call after
the backward falls in the scheduler's slice (the held-out training suite
at P = 8 on the star). The bands are the model's own, measured on the
repetitions of its timing, where it kept them; else the device's kernel
noise, which is two to three times wider and skewed (pieces of 1 to 10 ms:
a standard deviation of 0.20 and a mean of 1.07 against 0.07 and 1.01
for ResNet-32's pieces, 8 ranks on 2 cores; ``benchmarks/bench_layer_noise.py``),
so that every layer took some 5 % more than its measured median."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...jit import njit
from ...ops import TraceRecord
from ..driver import BLOCKED
from ..protocol import device_start, fifo, resumed


def _chain(cum, ready_at, lo, hi, next_bwd, device_free, now, busy, bulk_until):
    """:meth:`ModelHandlers.on_grads_ready`'s clock for backward positions
    ``lo`` to ``hi - 1`` on arrays, the same floating-point operations in
    the same order (compiled: 207 tensors a BERT iteration and rank at
    3.6 us each in Python). Returns (next_bwd, device_free, now, busy,
    kernels queued behind a bulk collective's)."""
    late = 0
    for pos in range(lo, hi):
        if pos >= next_bwd:
            dt = cum[pos + 1] - cum[next_bwd]
            first = next_bwd
            next_bwd = pos + 1
            end = fifo(device_free, now, dt)
            if dt > 0:
                busy += dt
                if now < bulk_until:
                    late += 1
            if end > now:
                device_free = end
            at = device_free if device_free > now else now
            for q in range(first, pos + 1):
                ready_at[q] = at
            if end > now:
                now = resumed(now, end)
        elif ready_at[pos] - now > 0:
            now = now + (ready_at[pos] - now)
    return next_bwd, device_free, now, busy, late


_CHAIN = njit(_chain)


@dataclass(frozen=True)
class TrainingModel:
    """What ``forward`` and ``grad_ready`` cost on every rank's device, and
    where each tensor's gradient lies in the rank's flat gradient vector.
    ``t_backward`` and ``sizes`` are in registration order."""

    t_forward: float
    t_backward: tuple
    sizes: tuple
    #: the pieces' own noise bands (``ModelProfile.noise``), or None: the device's kernel noise
    noise: tuple | None = None

    @property
    def offsets(self) -> list:
        return list(np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(int)) if self.sizes else []


class ModelHandlers:
    """The :class:`~.sim.Simulator`'s handlers of the model's requests (its
    ``model``, ``grads``, ``_views``, ``_bwd_cum``, ``_device``, ``layer_noise`` and clock)."""

    def on_forward(self, prog, req):
        return self._device(prog, self._piece(prog.ctx.rank, self._model("forward").t_forward), None, "forward",
                            "forward")

    def on_grad_ready(self, prog, req):
        m, rs = self._model("grad_ready"), prog.ctx.r
        i = req.index
        L = len(m.sizes)
        if not 0 <= i < L:
            raise IndexError(f"grad_ready({i}): the model has {L} tensors")
        a, b = self._views[i]
        value = self.grads[rs.rank][a:b]
        pos = L - 1 - i
        if pos >= rs.next_bwd:  # run the backward of tensors next_bwd..pos
            dt, covered = self._issue_backward(rs, pos)
            out = self._device(prog, dt, value, "backward", "backward", covered)
            end = max(rs.device_free, self.env.now)
            for p in covered:   # (with shared cores: when the backward has run, see _core_done)
                rs.ready_at[p] = end
            return out
        delay = rs.ready_at[pos] - self.env.now
        if delay <= 0:
            return value
        self.env.at(delay, self._resume, (prog, value))
        return BLOCKED

    def on_grads_ready(self, prog, req):
        """:meth:`on_grad_ready` of tensors ``end - 1`` down to ``first`` in
        turn, on the clock each would have resumed at (``now + (end - now)``,
        as the engine adds a delay), with one wake-up at the last: the same
        device spans, busy time and trace, one event instead of one a tensor
        (BERT: 207 a rank and iteration)."""
        m, rs = self._model("grad_ready"), prog.ctx.r
        L, now, parts = len(m.sizes), self.env.now, []
        grads, ctx = self.grads[rs.rank], prog.ctx
        if _CHAIN is not None and not self.trace_on and self.layer_noise is None and 0 <= req.first <= req.end <= L:
            return self._grads_compiled(prog, req, rs, grads, L)
        for i in range(req.end - 1, req.first - 1, -1):
            if not 0 <= i < L:
                raise IndexError(f"grad_ready({i}): the model has {L} tensors")
            a, b = self._views[i]
            parts.append(grads[a:b])
            pos = L - 1 - i
            if pos >= rs.next_bwd:   # as on_grad_ready's _device
                dt, covered = self._issue_backward(rs, pos)
                start = device_start(rs.device_free, now)
                end = start + dt
                if dt > 0:
                    rs.busy["backward"] += dt
                    if now < rs.bulk_until:   # as _device
                        self.inexact["device"] += 1
                if self.trace_on:
                    self.trace.append(TraceRecord(rs.rank, ctx._phase, "backward", -1, 0, start, end, ctx.lane))
                if end > now:
                    rs.device_free = end
                for p in covered:
                    rs.ready_at[p] = rs.device_free if rs.device_free > now else now
                if end > now:
                    now = resumed(now, end)
            elif rs.ready_at[pos] - now > 0:
                now = now + (rs.ready_at[pos] - now)
        if now > self.env.now:
            self.env.at_time(now, self._resume, (prog, parts))
            return BLOCKED
        return parts

    def _grads_compiled(self, prog, req, rs, grads, L: int):
        """:meth:`on_grads_ready` with the clock compiled (:func:`_chain`)."""
        ready = np.array(rs.ready_at)
        nb, rs.device_free, now, rs.busy["backward"], late = _CHAIN(
            self._bwd_cum_a, ready, L - req.end, L - req.first, rs.next_bwd, rs.device_free, self.env.now,
            rs.busy["backward"], rs.bulk_until)
        if nb != rs.next_bwd:
            rs.ready_at[rs.next_bwd:nb] = ready[rs.next_bwd:nb].tolist()
            rs.next_bwd = nb
        self.inexact["device"] += late
        views = self._views[req.first:req.end][::-1]
        cut = getattr(grads, "tensors", None)   # (a sampled model cuts its tensors in one call)
        parts = cut(views) if cut is not None else [grads[a:b] for a, b in views]
        if now > self.env.now:
            self.env.at_time(now, self._resume, (prog, parts))
            return BLOCKED
        return parts

    def _issue_backward(self, rs, pos: int) -> tuple[float, range]:
        """The backward of the rank's tensors from the first not yet issued
        to ``pos`` (backward order), issued: its seconds and the tensors."""
        dt = self._piece(rs.rank, self._bwd_cum[pos + 1] - self._bwd_cum[rs.next_bwd])
        covered = range(rs.next_bwd, pos + 1)
        rs.next_bwd = pos + 1
        return dt, covered

    def _piece(self, rank: int, seconds: float) -> float:
        """A forward or backward piece's modelled ``seconds``, times the rank's next draw of the
        model's own noise bands (its layers' repetitions), or of the device's kernel noise where
        its timing kept none (``Simulator.layer_noise``, as ``on_compute`` draws a kernel call's)."""
        noise = self.layer_noise
        return seconds if noise is None else seconds * noise.factor(rank, seconds)

    def _model(self, what) -> TrainingModel:
        if self.model is None:
            raise RuntimeError(f"ctx.{what}() needs a model: this run simulates a bare collective")
        return self.model
