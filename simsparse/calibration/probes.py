"""Probes of ``simsparse calibrate``'s worker: wrappers around the real
backend that time, in place, what the simulator costs apart -- every
kernel's torch implementation (:class:`KernelProbe`), a rank program's own
CPU between its requests (:class:`StepProbe`) and each message's send and
receive path (:class:`PathProbe`). Each is installed by patching the class
attribute it wraps and restored by ``close()``; only while ``active`` does
it record."""
from __future__ import annotations

import resource
import time

import numpy as np


def _minflt() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def back_to_back(call) -> bool:
    """Whether a recorded call (:class:`KernelProbe`'s fields, then the rank that
    :func:`~.worker.every_rank` appends) repeated its rank's previous request, a
    call of the same kernel, with no message or wait between."""
    return len(call) > 8 and bool(call[7])


class KernelProbe:
    """Wraps every kernel's torch implementation to record (name, elements,
    bytes, seconds, minor page faults, parts, sparse entries, back to back),
    the name with the call's path
    (``"name/path"``, :class:`~simsparse.compute.kernels.Work`) where it
    reports one. A call that faulted grew the rank's heap (its first
    touches), which a measured iteration in steady state does not pay
    (:mod:`simsparse.backends.real.rank_env`). Back to back (1): the call
    repeats its rank's previous request, a call of the same kernel, as the
    real backend's rank state :attr:`rank` says (``back_to_back``; the caller
    sets it to each run's)."""

    def __init__(self, sync, now=time.perf_counter):
        from ..compute.kernels import KERNELS

        self.calls: list = []
        self.active = False
        self.rank = None   # the real backend's rank state of the run being probed
        self._orig = {}
        for name, k in KERNELS.items():
            self._orig[name] = k.torch_fn
            k.torch_fn = self._wrap(k, k.torch_fn, sync, now)

    def _wrap(self, k, fn, sync, now):
        def timed(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            sync()
            f0 = _minflt()
            t0 = now()
            out = fn(*args, **kwargs)
            sync()
            dt = now() - t0
            faults = _minflt() - f0
            w = k.work(out, *args, **kwargs)
            name = f"{k.name}/{w.path}" if w.path else k.name
            b2b = int(bool(getattr(self.rank, "back_to_back", False)))
            self.calls.append((name, float(w.elems), float(w.bytes), dt, faults, float(w.parts), float(w.select), b2b))
            return out

        return timed

    def close(self):
        from ..compute.kernels import KERNELS

        for name, fn in self._orig.items():
            KERNELS[name].torch_fn = fn


class StepProbe:
    """Times a rank program's own CPU between its requests: the driver's
    stepping and the program's Python (``MPIDriver.step``, which runs the
    generator until it blocks) less what runs inside it and is costed
    elsewhere: the posting of messages (``isend``/``irecv``:
    ``message_cpu_s``) and the kernels an idle device runs at once
    (``_device``: :class:`KernelProbe`)."""

    def __init__(self, now=time.perf_counter):
        from ..backends.real.mpi import MPIContext, MPIDriver

        self.own: list[float] = []   # per step: its time less what is costed elsewhere
        self.active = False
        self._orig = [(MPIDriver, "step", MPIDriver.step), (MPIContext, "isend", MPIContext.isend),
                      (MPIContext, "irecv", MPIContext.irecv), (MPIDriver, "_device", MPIDriver._device)]
        probe, depth, other = self, [0], [0.0]

        def step(fn):
            def run(*args):
                if not probe.active or depth[0]:   # (a step inside a step is timed by the outer one)
                    return fn(*args)
                depth[0] += 1
                other[0] = 0.0
                t0 = now()
                try:
                    return fn(*args)
                finally:
                    depth[0] -= 1
                    probe.own.append(now() - t0 - other[0])
            return run

        def post(fn):   # time inside a step that is not the program's own
            def run(*args, **kwargs):
                if not probe.active or not depth[0]:
                    return fn(*args, **kwargs)
                t0 = now()
                try:
                    return fn(*args, **kwargs)
                finally:
                    other[0] += now() - t0
            return run

        for cls, attr, fn in self._orig:
            setattr(cls, attr, step(fn) if attr == "step" else post(fn))

    def summary(self) -> dict:
        """Quantiles of the steps' own time (a few first steps pay one-off costs: connections, first pages)."""
        own = np.asarray(self.own or [np.nan])
        return {"steps": len(self.own), "median_s": float(np.median(own)), "mean_s": float(own.mean()),
                "p10_s": float(np.percentile(own, 10)), "p90_s": float(np.percentile(own, 90))}

    def close(self):
        for cls, attr, fn in self._orig:
            setattr(cls, attr, fn)


class PathProbe:
    """Times the real backend's send and receive path around every message
    (:mod:`simsparse.compute.message_path`). ``samples``: (side, wire
    format, payload bytes, seconds).

    * ``calls=False``: the serialisation of each send (``Mailbox.pack``) and
      the unpacking of each receive (``wire.unpack``), nothing of the MPI
      calls between them, which move the bytes and are the transport's: on
      a testbed its point-to-point patterns fit them.
    * ``calls=True``: ``isend`` whole (serialise and post) and, per receive,
      its match, receive and unpacking (``Mailbox._take``) -- for a message
      too large to receive at once only its unpacking (``Mailbox._complete``:
      its receive call moves the data). Where the algorithms run on the
      transport the profile is for (this host's shared memory), the MPI
      calls' own CPU in place is part of what a message costs its ranks: a
      2 MB isend here copies part of its message before it returns (118 us
      in the suite's ring against a 10 us pack).
    """

    FORMATS = {b"DNS1": "dense", b"DNS2": "split", b"PKL1": "packed"}

    def __init__(self, now=time.perf_counter, calls: bool = True):
        self.samples: list = []
        self.active = False
        self._orig = self._around_calls(now) if calls else self._around_serialisation(now)

    def _around_serialisation(self, now) -> list:
        from ..backends.real import wire

        orig = [(wire.Mailbox, "pack", wire.Mailbox.pack), (wire, "unpack", wire.unpack)]
        pack, unpack = (fn for _, _, fn in orig)
        probe, fmt_of = self, self.FORMATS.get

        def timed_pack(box, h, *args, **kwargs):
            if not probe.active:
                return pack(box, h, *args, **kwargs)
            t0 = now()
            pack(box, h, *args, **kwargs)
            probe.samples.append(("send", fmt_of(bytes(h.buf[:4])), h.nbytes, now() - t0))

        def timed_unpack(buf, *args, **kwargs):
            if not probe.active:
                return unpack(buf, *args, **kwargs)
            t0 = now()
            value = unpack(buf, *args, **kwargs)
            probe.samples.append(("recv", fmt_of(bytes(buf[:4])), value.nbytes, now() - t0))
            return value

        wire.Mailbox.pack, wire.unpack = timed_pack, timed_unpack
        return orig

    def _around_calls(self, now) -> list:
        from ..backends.real import wire
        from ..backends.real.mpi import MPIContext

        orig = [(MPIContext, "isend", MPIContext.isend), (wire.Mailbox, "_take", wire.Mailbox._take),
                (wire.Mailbox, "_complete", wire.Mailbox._complete)]
        isend, take, complete = (fn for _, _, fn in orig)
        probe, fmt_of, inside = self, self.FORMATS.get, [0, None]

        def timed_isend(ctx, *args, **kwargs):
            if not probe.active:
                return isend(ctx, *args, **kwargs)
            t0 = now()
            h = isend(ctx, *args, **kwargs)
            probe.samples.append(("send", fmt_of(bytes(h.buf[:4])), h.nbytes, now() - t0))
            return h

        def timed_take(box, h, msg, status):
            if not probe.active:
                return take(box, h, msg, status)
            inside[0] += 1
            t0 = now()
            try:
                take(box, h, msg, status)
            finally:
                inside[0] -= 1
            if h.done:    # received and unpacked at once (small); else _complete times the unpacking
                probe.samples.append(("recv", inside[1], h.nbytes, now() - t0))

        def timed_complete(box, h):
            if not probe.active or h.kind != "recv":
                return complete(box, h)
            f = fmt_of(bytes(h.buf[:4]))
            t0 = now()
            complete(box, h)
            dt = now() - t0
            if inside[0]:
                inside[1] = f
            else:
                probe.samples.append(("recv", f, h.nbytes, dt))

        MPIContext.isend, wire.Mailbox._take, wire.Mailbox._complete = timed_isend, timed_take, timed_complete
        return orig

    def gathered(self, comm) -> list:
        """Every rank's samples (on every rank)."""
        return [s for part in comm.allgather(self.samples) for s in part if s[1] is not None]

    def close(self):
        for cls, attr, fn in self._orig:
            setattr(cls, attr, fn)
