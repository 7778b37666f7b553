"""The real backend's send and receive path: the CPU a message costs its
sender before it leaves and its receiver after it arrives.

A rank program's ``isend`` serialises its payload (:mod:`simsparse.backends.real.wire`:
``.cpu().numpy()``, a copy into one buffer, a pickled header for structured
payloads) before it posts ``MPI_Isend``, so the message leaves that much
later; a received message is unpacked into tensors before its handle
completes. Both run in the rank's Python on its core. The MPI calls between
them (post, match, receive) are the transport's. Where the calibration's
algorithms ran on the profile's own transport (this host's shared memory)
the path holds them too, as they cost in place (a 2 MB isend copies part of
its message before it returns); for a testbed, whose calibration runs the
algorithms on its sockets, the path is the serialisation alone and the
calls stay in the transport's fits (LogGP ``o``, ``message_cpu_s``), which
its point-to-point patterns measure:
:class:`~simsparse.calibration.probes.PathProbe`. The cost depends on the
wire format:

* ``dense``: a :class:`~simsparse.ops.Dense` payload copied behind a prefix;
* ``split``: a large dense payload sent from its own memory (no copy);
* ``packed``: anything else (COO, quantized, bundles): a pickled header and a
  copy of every array.

Each is ``launch + bytes x per_byte`` per side (``PathCost``), times a
factor per half-decade of bytes where that line misses the measured band
by more than 15 % (:mod:`simsparse.size_scale`), measured *in situ*: around
every message of every algorithm that ``simsparse calibrate`` runs, between
kernels and waits, as the validation suite runs them. A tight
loop of messages understates it: on this host packing one COO block of 800 B
took 19.5 us back to back, 33 us after the core slept for 1 ms and 55 us after
a sleep and a 16 MB sweep (caches and branch history lost;
``benchmarks/bench_message_path.py``);
in the suite's TopkA of 1e4 the same pack took 38 us (median of 44), against
an 800 B transfer of 13 us.

The simulator charges the send side on the sender's cores before the message
is posted and the receive side on the receiver's cores after it arrived
(:mod:`simsparse.backends.events.sim`), for a profile that has measured them.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..ops import Dense
from ..size_scale import SizeScale, factor_at, log_table

#: the wire formats of :mod:`simsparse.backends.real.wire` (DNS1, DNS2, PKL1)
FORMATS = ("dense", "split", "packed")
#: a dense payload from this size on goes out without a copy (:data:`simsparse.backends.real.wire.SPLIT_MIN`)
SPLIT_MIN_B = 1 << 16


class PathCost(BaseModel):
    """One wire format's CPU per message, ``launch + bytes x per_byte`` on each side."""

    model_config = ConfigDict(extra="forbid")
    send_s: float = Field(ge=0, description="core-seconds to send one message: serialise it (and post it, where "
                                            "calibrated on the run's own transport)")
    send_per_byte_s: float = Field(0.0, ge=0, description="core-seconds to send per payload byte")
    recv_s: float = Field(ge=0, description="core-seconds to unpack one received message (and match and receive "
                                            "it, where calibrated on the run's own transport)")
    recv_per_byte_s: float = Field(0.0, ge=0, description="core-seconds to unpack per payload byte")
    send_scale: SizeScale | None = Field(None, description="[[bytes, factor], ...] on the send line, per size band")
    recv_scale: SizeScale | None = Field(None, description="[[bytes, factor], ...] on the receive line, per size band")


PathCosts = dict[Literal["dense", "split", "packed"], PathCost]


def wire_format(payload, nbytes: int, split: bool = True) -> str:
    """The format :func:`simsparse.backends.real.wire.pack` gives ``payload``."""
    if type(payload) is Dense:
        return "split" if split and nbytes >= SPLIT_MIN_B else "dense"
    return "packed"


class MessagePath:
    """The measured :class:`PathCost` (or its dict) per format, times ``scale`` (the host's slowdown
    against calibration); a format that was never measured (no large dense message where the transport
    sends everything copied, as the testbed does) costs like ``dense``."""

    __slots__ = ("send", "recv", "split")

    def __init__(self, costs: dict, scale: float = 1.0):
        if not costs:
            raise ValueError("message_path needs at least one wire format")
        costs = {f: c if isinstance(c, PathCost) else PathCost.model_validate(c) for f, c in costs.items()}
        fallback = costs.get("dense") or next(iter(costs.values()))
        each = {f: costs.get(f) or fallback for f in FORMATS}
        #: per format and side: (launch, per byte, factors per band as a log table)
        self.send = {f: (scale * c.send_s, scale * c.send_per_byte_s, log_table(c.send_scale))
                     for f, c in each.items()}
        self.recv = {f: (scale * c.recv_s, scale * c.recv_per_byte_s, log_table(c.recv_scale))
                     for f, c in each.items()}
        self.split = "split" in costs

    def send_s(self, payload, nbytes: int) -> float:
        launch, per, table = self.send[wire_format(payload, nbytes, self.split)]
        return (launch + per * nbytes) * factor_at(table, nbytes)

    def recv_s(self, payload, nbytes: int) -> float:
        launch, per, table = self.recv[wire_format(payload, nbytes, self.split)]
        return (launch + per * nbytes) * factor_at(table, nbytes)
