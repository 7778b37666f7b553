"""The one contract: payload types and the requests a rank program yields.

An algorithm's per-rank ``run(ctx, grad)`` is a generator. It posts
point-to-point operations on ``ctx`` (which return a :class:`Handle` at once),
and *yields* the requests that take time:

* ``ctx.waitall(handles)``  -> list with the received payload (or ``None`` for
  a send) for each handle, in order;
* ``ctx.waitany(handles)``  -> ``(index, payload)`` of the first to complete;
* ``ctx.compute(kernel, *args, **kw)`` -> the kernel's result, its time
  accounted by the backend (simulated cost model or measured).

Payloads carry real data (numpy arrays in the simulator, torch tensors in the
real backend) and report their exact size in bytes; that size is what both
backends count as "bytes on the wire". Framing the real backend adds (a small
header per message) is an implementation detail and is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Sequence


def nbytes_of(a: Any) -> int:
    """Exact size in bytes of a numpy array or torch tensor."""
    nb = getattr(a, "nbytes", None)
    if nb is not None:
        return int(nb)
    return int(a.numel() * a.element_size())  # older torch


PAYLOAD_TYPES: dict[str, type] = {}


class Payload:
    """Base class: something that travels in one message.

    A payload is a frozen dataclass whose fields listed in ``ARRAYS`` hold
    arrays and whose other fields hold small metadata (ints, floats,
    strings). That split is all the backends need to copy, convert
    (numpy <-> torch) and serialise any payload type.
    """

    __slots__ = ()
    ARRAYS: tuple = ()
    #: arrays stay host numpy in every backend (small metadata)
    HOST = False

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        PAYLOAD_TYPES[cls.__name__] = cls

    @property
    def nbytes(self) -> int:
        return sum(nbytes_of(getattr(self, f)) for f in self.ARRAYS)

    def arrays(self) -> list:
        """The arrays this payload consists of, in a fixed order."""
        return [getattr(self, f) for f in self.ARRAYS]

    def meta(self) -> dict:
        """The non-array fields."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.ARRAYS}

    def map(self, fn) -> "Payload":
        """The same payload with ``fn`` applied to every array."""
        return type(self)(**self.meta(), **{f: fn(getattr(self, f)) for f in self.ARRAYS})


@dataclass(frozen=True, slots=True)
class Dense(Payload):
    """A dense vector (or a small block of metadata such as counts)."""

    values: Any
    ARRAYS = ("values",)

    # fast paths (the simulator copies every payload it sends)
    @property
    def nbytes(self) -> int:
        return nbytes_of(self.values)

    def map(self, fn) -> "Dense":
        return Dense(fn(self.values))

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True, slots=True)
class COO(Payload):
    """Sparse vector in coordinate format: ``indices`` (int32) and ``values``
    of a vector of logical length ``n``. Size = idx bytes + value bytes (the
    paper's "2k words" for k nonzeros); ``n`` is metadata, not counted."""

    indices: Any
    values: Any
    n: int
    ARRAYS = ("indices", "values")

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.indices) + nbytes_of(self.values)

    def map(self, fn) -> "COO":
        return COO(fn(self.indices), fn(self.values), self.n)

    @property
    def nnz(self) -> int:
        return len(self.values)


@dataclass(frozen=True, slots=True)
class Quantized(Payload):
    """A dense vector quantized bucket-wise (QSGD, SparCML section 5.4): ``codes``
    packs ``bits`` bits per entry into uint8, ``scales`` holds one float32
    scaling factor per bucket of ``bucket`` entries; ``n`` entries in all.
    Size = packed codes + scales (e.g. 4 bits: n/2 bytes + 4 n/bucket)."""

    codes: Any
    scales: Any
    n: int
    bits: int
    bucket: int
    ARRAYS = ("codes", "scales")

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True, slots=True)
class Scalars(Payload):
    """Small host-side metadata (counts, boundaries, thresholds) as a numpy
    array in *both* backends: algorithms build and read it with plain numpy;
    it is never a device tensor. Its bytes count like any payload's."""

    values: Any
    ARRAYS = ("values",)
    HOST = True

    @classmethod
    def of(cls, values, dtype="int64") -> "Scalars":
        import numpy as np

        return cls(np.asarray(values, dtype=dtype).reshape(-1))

    def tolist(self) -> list:
        return self.values.tolist()


@dataclass(frozen=True, slots=True)
class Bundle(Payload):
    """Several payloads sent as one message (e.g. the blocks gathered so far
    in a recursive-doubling allgather). Size = sum of the parts."""

    parts: tuple

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def arrays(self) -> list:
        return [a for p in self.parts for a in p.arrays()]

    def meta(self) -> dict:
        return {"parts": [(type(p).__name__, p.meta()) for p in self.parts]}

    def map(self, fn) -> "Bundle":
        return Bundle(tuple(p.map(fn) for p in self.parts))

    def __len__(self) -> int:
        return len(self.parts)

    def __iter__(self):
        return iter(self.parts)

    def __getitem__(self, i):
        return self.parts[i]


# --------------------------------------------------------------------------
# Requests and handles. Backends subclass Handle; algorithms only pass them
# back to waitall/waitany.


class Handle:
    """A posted nonblocking send or receive. ``done`` and ``value`` are set by
    the backend when the operation completes."""

    __slots__ = ("kind", "peer", "tag", "nbytes", "done", "value", "post_s", "phase", "_waiters")

    def __init__(self, kind: str, peer: int, tag: int, nbytes: int, post_s: float, phase: str):
        self.kind = kind  # "send" or "recv"
        self.peer = peer
        self.tag = tag
        self.nbytes = nbytes
        self.done = False
        self.value = None
        self.post_s = post_s
        self.phase = phase
        self._waiters = None


@dataclass(slots=True)
class Waitall:
    handles: Sequence[Handle]


@dataclass(slots=True)
class Waitany:
    handles: Sequence[Handle]


@dataclass(slots=True)
class Compute:
    kernel: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


class ContextBase:
    """What every backend's per-rank context offers an algorithm.

    Subclasses implement ``isend``, ``irecv`` and ``now``; the request
    constructors and the phase bookkeeping are shared.
    """

    rank: int
    size: int
    #: nominal bytes per carried byte: the simulator may carry data at a
    #: reduced dimension (``data_scale``); an algorithm that picks a protocol
    #: by message size multiplies the size it sees by this (1 in real runs)
    byte_scale: float = 1.0

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size
        self._phase = "main"

    # -- posting (returns immediately) ------------------------------------
    def isend(self, dst: int, payload: Payload, tag: int = 0) -> Handle:  # pragma: no cover
        raise NotImplementedError

    def irecv(self, src: int, tag: int = 0) -> Handle:  # pragma: no cover
        raise NotImplementedError

    # -- requests (yield these) --------------------------------------------
    @staticmethod
    def waitall(handles: Sequence[Handle]) -> Waitall:
        return Waitall(list(handles))

    @staticmethod
    def waitany(handles: Sequence[Handle]) -> Waitany:
        return Waitany(list(handles))

    @staticmethod
    def compute(kernel: str, *args, **kwargs) -> Compute:
        return Compute(kernel, args, kwargs)

    # -- phases -----------------------------------------------------------
    def phase(self, name: str):
        """Context manager labelling the operations posted inside it. Phases
        nest: inside ``split_reduce`` a helper's ``allgather`` is labelled
        ``split_reduce/allgather``."""
        return _Phase(self, name)

    def _check_peer(self, peer: int) -> None:
        if not (0 <= peer < self.size) or peer == self.rank:
            raise ValueError(f"rank {self.rank}: invalid peer {peer} (P={self.size}; self-messages are not allowed)")


class _Phase:
    __slots__ = ("ctx", "name", "prev")

    def __init__(self, ctx: ContextBase, name: str):
        self.ctx, self.name = ctx, name

    def __enter__(self):
        self.prev = self.ctx._phase
        self.ctx._phase = self.name if self.prev == "main" else f"{self.prev}/{self.name}"
        return self

    def __exit__(self, *exc):
        self.ctx._phase = self.prev
        return False
