"""The one contract: payload types and the requests a rank program yields.

An algorithm's per-rank ``run(ctx, grad)`` is a generator. It posts
point-to-point operations on ``ctx`` (which return a :class:`Handle` at once),
and *yields* the requests that take time:

* ``ctx.waitall(handles)``  -> list with the received payload (or ``None`` for
  a send, the return value for a task) for each handle, in order;
* ``ctx.waitany(handles)``  -> ``(index, payload)`` of the first to complete;
* ``ctx.compute(kernel, *args, **kw)`` -> the kernel's result, its time
  accounted by the backend (simulated cost model or measured).

Concurrency inside a rank (a training iteration):

* ``ctx.spawn(program, stream=..., lane=...)`` starts a sub-program (a
  factory ``program(child_ctx) -> generator``) that runs concurrently and
  returns a :class:`Task` handle at once; ``yield ctx.waitall([task])`` joins
  it and gives its return value. The child runs at once until it first
  blocks, then the parent continues. Every spawned program gets its own *tag
  scope* (like an MPI sub-communicator): its messages only match messages of
  the program spawned at the same position on the peer rank. Tasks spawned on
  the same ``stream`` communicate one after another: a task's sends and
  receives are held back until the task before it on that stream has
  finished (Horovod's and NCCL's one communication stream; the OMGS paper's
  Eq. 8).
* Every rank has one *device*: ``compute``, ``forward`` and the backward work
  behind ``grad_ready`` run on it one after another, in the order they were
  issued, while messages move.
* ``yield ctx.forward()`` runs the model's forward pass; ``g = yield
  ctx.grad_ready(i)`` waits until the backward pass has produced the
  gradient of tensor ``i`` (registration order) and returns it (a flat,
  read-only vector). Schedules ask for tensors in backward order.

Payloads carry real data (numpy arrays in the simulator, torch tensors in the
real backend) and report their exact size in bytes; that size is what both
backends count as "bytes on the wire". Framing the real backend adds (a small
header per message) is an implementation detail and is not counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, NamedTuple, Sequence


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


class OneArray:
    """The fast paths of a payload whose one array is ``values`` (the
    simulator copies every payload it sends): its size and length."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.values)

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True, slots=True)
class Dense(OneArray, Payload):
    """A dense vector (or a small block of metadata such as counts)."""

    values: Any
    ARRAYS = ("values",)

    def map(self, fn) -> "Dense":
        return Dense(fn(self.values))


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

    def map(self, fn) -> "Quantized":
        return Quantized(fn(self.codes), fn(self.scales), self.n, self.bits, self.bucket)


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

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.values)

    def map(self, fn) -> "Scalars":
        return Scalars(fn(self.values))


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
    """A posted nonblocking send or receive, or a spawned task. ``done`` and
    ``value`` are set by the backend when the operation completes."""

    __slots__ = ("kind", "peer", "tag", "nbytes", "done", "value", "post_s", "phase", "lane", "_waiters")

    def __init__(self, kind: str, peer: int, tag: int, nbytes: int, post_s: float, phase: str, lane: str = "main"):
        self.kind = kind  # "send", "recv" or "task"
        self.peer = peer
        self.tag = tag
        self.nbytes = nbytes
        self.done = False
        self.value = None
        self.post_s = post_s
        self.phase = phase
        self.lane = lane
        self._waiters = None


class Task(Handle):
    """A spawned sub-program; its ``value`` is the program's return value."""

    __slots__ = ()

    def __init__(self, lane: str, post_s: float):
        super().__init__("task", -1, -1, 0, post_s, lane, lane)


class _HandleList(list):
    """A wait request is the list of its handles (built in C: no Python
    constructor on the hottest request); its type says which wait."""

    __slots__ = ()

    @property
    def handles(self) -> list:
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list.__repr__(self)})"


class Waitall(_HandleList):
    """Wait for all of these handles."""

    __slots__ = ()


class Waitany(_HandleList):
    """Wait for the first of these handles to complete."""

    __slots__ = ()


@dataclass(slots=True)
class Compute:
    kernel: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


class Collective:
    """A helper collective as one request (sendrecv, allgather, alltoall,
    bcast, the reduction of host metadata; :mod:`simsparse.algorithms.collectives`).
    Every rank of the program's scope yields collectives in the same order.
    ``expand(ctx)`` is its point-to-point implementation, a generator of the
    other requests: the real backend always runs it, the simulator runs it or
    evaluates the collective for all ranks at once (``bulk``)."""

    __slots__ = ()
    #: ``bulk(reqs, run)``: the collective for all ranks at once (every rank's
    #: request, a :class:`simsparse.backends.fast.bulk.BulkRun`), returning every
    #: rank's result; only where every rank's exit waits for every rank's
    #: entry. None: always expanded.
    bulk = None

    def expand(self, ctx):  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(slots=True)
class Delay:
    """Wait without occupying the device: until the next multiple of
    ``align`` seconds (0: at once), then ``seconds`` more -- a framework's
    timer and control messages (:mod:`simsparse.schedules.stack`)."""

    seconds: float
    align: float = 0.0


@dataclass(slots=True)
class Forward:
    """The model's forward pass (device work)."""


@dataclass(slots=True)
class GradReady:
    """Wait for the gradient of tensor ``index`` (registration order)."""

    index: int


@dataclass(slots=True)
class GradsReady:
    """Wait for the gradients of tensors ``end - 1`` down to ``first`` (the
    backward's order), returned in that order: what :class:`GradReady` of
    each in turn gives, where nothing else of the rank uses its device
    meanwhile (:meth:`ContextBase.grads_ready` asks only then)."""

    first: int
    end: int


class TraceRecord(NamedTuple):
    """One span of a rank's timeline, the same schema in both backends:
    ``lane`` is the program that issued it (``main``, or a spawned task's
    lane, e.g. ``comm/b3``), ``op`` is ``send``/``recv``, ``compute:<kernel>``,
    ``forward`` or ``backward``; ``peer`` is -1 for device work; ``bytes``: a
    message's payload, a kernel's bytes touched (its ``Work.bytes``, at full
    size), 0 for the rest."""

    rank: int
    phase: str
    op: str
    peer: int
    bytes: int
    start_s: float
    end_s: float
    lane: str = "main"


TRACE_FIELDS = TraceRecord._fields

#: bits of a message tag an algorithm may use; the rest encode the tag scope
TAG_BITS = 8
SCOPE_RADIX = 1024


def scope_id(path: tuple) -> int:
    """The integer of a tag scope: 0 for the rank's main program, and a
    mixed-radix number of the spawn positions for sub-programs (the same on
    every rank, since every rank spawns in the same order)."""
    sid, mult = 0, 1
    for i in path:
        if i >= SCOPE_RADIX - 1:
            raise ValueError(f"more than {SCOPE_RADIX - 2} sub-programs spawned by one program")
        sid += (i + 1) * mult
        mult *= SCOPE_RADIX
    return sid


def scoped_tag(tag: int, sid: int) -> int:
    """The wire tag of ``tag`` inside scope ``sid``."""
    if not 0 <= tag < (1 << TAG_BITS):
        raise ValueError(f"message tag {tag} outside 0..{(1 << TAG_BITS) - 1}")
    return (sid << TAG_BITS) | tag


class ContextBase:
    """What every backend's per-rank context offers a rank program.

    Subclasses implement ``isend``, ``irecv``, ``spawn`` and ``now``; the
    request constructors, the phase bookkeeping, the spawn state and the wire
    tag are shared. A spawned program gets a context of its own (same rank,
    its own tag scope ``scope``/``sid`` and lane).
    """

    __slots__ = ()   # a backend's context may keep its fields in slots
    rank: int
    size: int
    #: nominal bytes per carried byte: the simulator may carry data at a
    #: reduced dimension (``data_scale``); an algorithm that picks a protocol
    #: by message size multiplies the size it sees by this (1 in real runs)
    byte_scale: float = 1.0

    def __init__(self, rank: int, size: int, streams: dict, scope: tuple = (), sid: int = 0, lane: str = "main"):
        self.rank = rank
        self.size = size
        self._phase = "main"
        self.streams = streams          # the rank's communication streams (shared by its programs)
        #: the tag scope (spawn positions; ``sid`` its number) and the lane in traces ("main" or spawn()'s name)
        self.scope, self.sid, self.lane = scope, sid, lane
        self.spawned = 0                # programs this one has spawned (the next child's scope)
        self.program = None             # the driver's Program running on this context
        self.parent_program = None

    def wire_tag(self, tag: int) -> int:
        """The tag on the wire: ``tag`` inside this program's scope."""
        return tag if self.sid == 0 else scoped_tag(tag, self.sid)

    # -- posting (returns immediately) ------------------------------------
    def isend(self, dst: int, payload: Payload, tag: int = 0) -> Handle:  # pragma: no cover
        raise NotImplementedError

    def irecv(self, src: int, tag: int = 0) -> Handle:  # pragma: no cover
        raise NotImplementedError

    def sent_often(self, payload: Payload) -> Payload:
        """``payload`` as a collective that sends it in several messages
        holds it (MPI: a send buffer is not modified until the collective
        returns): here as it is; the simulator, which copies what a writable
        payload's sends carry, copies it once."""
        return payload

    def spawn(self, program: Callable[["ContextBase"], Any], stream: str | None = None,
              lane: str | None = None) -> Task:  # pragma: no cover
        """Start ``program(child_ctx)`` concurrently; returns its :class:`Task`."""
        raise NotImplementedError

    # -- requests (yield these) --------------------------------------------
    @staticmethod
    def waitall(handles: Sequence[Handle]) -> Waitall:
        return Waitall(handles)

    @staticmethod
    def waitany(handles: Sequence[Handle]) -> Waitany:
        return Waitany(handles)

    @staticmethod
    def compute(kernel: str, *args, **kwargs) -> Compute:
        return Compute(kernel, args, kwargs)

    @staticmethod
    def forward() -> Forward:
        return Forward()

    @staticmethod
    def delay(seconds: float, align: float = 0.0) -> Delay:
        return Delay(seconds, align)

    @staticmethod
    def grad_ready(index: int) -> GradReady:
        return GradReady(index)

    def grads_ready(self, first: int, end: int):
        """The gradients of tensors ``end - 1`` down to ``first``, in that
        order (``parts = yield from ctx.grads_ready(first, end)``): one
        :class:`GradsReady` where the backend answers it for the same times
        (:meth:`_grads_at_once`), else ``grad_ready`` of each in turn."""
        if self._grads_at_once():
            return (yield GradsReady(first, end))
        parts = []
        for i in range(end - 1, first - 1, -1):
            parts.append((yield GradReady(i)))
        return parts

    def _grads_at_once(self) -> bool:
        """Whether this backend answers :class:`GradsReady` now (the real one never does)."""
        return False

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
