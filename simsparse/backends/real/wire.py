"""Payloads on the wire: their serialisation into MPI messages, and a rank's
messages in flight (:class:`Mailbox`, the real backend's transport).

Every message starts with a 16-byte prefix: a 4-byte kind, a 4-byte numpy
dtype string and a 64-bit length. Kinds:

* ``DNS1``: a :class:`Dense` payload; its array's bytes follow the prefix;
* ``DNS2``: a large :class:`Dense` payload (at least :data:`SPLIT_MIN`
  bytes) sent without copying: the prefix travels alone and the array itself
  is the *next* message of the same source and tag (MPI's non-overtaking rule
  keeps the two together as long as the receiver posts the data receive
  before matching anything else of that source and tag);
* ``PKL1``: any other payload: a pickled header (type, metadata, dtype and
  length of each array) of the given length, then each array, every section
  aligned to 8 bytes.

Only the arrays count as bytes on the wire (the same count the simulator
uses); prefixes and headers are framing.
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import time

import numpy as np
from numpy.lib.array_utils import byte_bounds

from ...ops import PAYLOAD_TYPES, Bundle, Dense, Handle, Payload

_ALIGN = 8
PREFIX = struct.Struct("<4s4sQ")
#: Dense payloads from this size on are sent without copying (two messages);
#: ``SIMSPARSE_SPLIT=off`` sends every payload as one message (the testbed
#: does: over TCP the data message waits for the prefix to be matched, which
#: cost a ring at P = 8 7 % of its time, while the copy it saves takes 0.4 ms
#: per 2 MB against 160 ms on a 100 Mb/s link)
SPLIT_MIN = 1 << 16 if os.environ.get("SIMSPARSE_SPLIT", "on") != "off" else float("inf")
#: messages up to this size are received at once (``MPI_Mrecv``) when matched
SMALL_MSG = 4096
_DTYPES: dict[bytes, np.dtype] = {}


def _pad(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def _dtype(code: bytes) -> np.dtype:
    dt = _DTYPES.get(code)
    if dt is None:
        dt = _DTYPES[code] = np.dtype(code.rstrip(b"\0").decode())
    return dt


def _describe(p: Payload):
    if isinstance(p, Bundle):
        return ("Bundle", [_describe(q) for q in p.parts])
    return (type(p).__name__, p.meta())


def pack(payload: Payload, to_numpy, split: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Payload -> (first message, second message or None). ``to_numpy`` turns
    an array/tensor into host numpy; a second message (only if ``split``) is
    that array itself, not a copy: it must not change until the send completes."""
    if type(payload) is Dense:
        a = to_numpy(payload.values)
        code = a.dtype.str.encode()
        if len(code) <= 4:
            a = np.ascontiguousarray(a).reshape(-1)
            if split and a.nbytes >= SPLIT_MIN:
                return np.frombuffer(PREFIX.pack(b"DNS2", code, a.nbytes), np.uint8), a
            buf = np.empty(PREFIX.size + a.nbytes, dtype=np.uint8)
            PREFIX.pack_into(buf, 0, b"DNS1", code, a.nbytes)
            buf[PREFIX.size:] = a.view(np.uint8)
            return buf, None
    arrays = [np.ascontiguousarray(to_numpy(a)) for a in payload.arrays()]
    header = pickle.dumps((_describe(payload), [(a.dtype.str, a.size) for a in arrays]), protocol=5)
    off = PREFIX.size + _pad(len(header))
    buf = np.empty(off + sum(_pad(a.nbytes) for a in arrays), dtype=np.uint8)
    PREFIX.pack_into(buf, 0, b"PKL1", b"", len(header))
    buf[PREFIX.size:PREFIX.size + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for a in arrays:
        buf[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
        off += _pad(a.nbytes)
    return buf, None


def split_size(buf: np.ndarray) -> int | None:
    """The byte count of the data message that follows ``buf``, if ``buf`` is
    the prefix of a payload sent in two messages; else None."""
    if len(buf) == PREFIX.size and bytes(buf[:4]) == b"DNS2":
        return PREFIX.unpack_from(buf)[2]
    return None


def unpack(buf: np.ndarray, from_numpy, data: np.ndarray | None = None) -> Payload:
    """Message(s) -> payload, viewing the received buffers (no copy);
    ``from_numpy`` turns each array into the backend's array type (e.g. a
    torch tensor on the right device); ``data`` is the second message, if any."""
    kind, code, length = PREFIX.unpack_from(buf)
    if kind == b"DNS1":
        return Dense(from_numpy(buf[PREFIX.size:PREFIX.size + length].view(_dtype(code))))
    if kind == b"DNS2":
        return Dense(from_numpy(data.view(_dtype(code))))
    desc, specs = pickle.loads(buf[PREFIX.size:PREFIX.size + length].tobytes())
    off = PREFIX.size + _pad(length)
    arrays = []
    for dtype, count in specs:
        dt = np.dtype(dtype)
        arrays.append(buf[off:off + count * dt.itemsize].view(dt))
        off += _pad(count * dt.itemsize)
    return _build(desc, iter(arrays), from_numpy)


def _build(desc, it, from_numpy) -> Payload:
    kind, meta = desc
    if kind == "Bundle":
        return Bundle(tuple(_build(d, it, from_numpy) for d in meta))
    cls = PAYLOAD_TYPES[kind]
    conv = np.copy if cls.HOST else from_numpy
    return cls(**meta, **{f: conv(next(it)) for f in cls.ARRAYS})


def spans(obj):
    """Host memory ranges [lo, hi) of the numpy arrays and CPU tensors in
    ``obj`` (payloads, nested tuples, lists and dicts): what a zero-copy send
    must not see overwritten."""
    if isinstance(obj, np.ndarray):
        if obj.size:
            yield byte_bounds(obj)
    elif hasattr(obj, "data_ptr"):  # a torch tensor
        if obj.device.type == "cpu" and obj.numel():
            if obj.is_contiguous():
                lo = obj.data_ptr()
                yield lo, lo + obj.numel() * obj.element_size()
            else:  # the whole storage: an upper bound
                st = obj.untyped_storage()
                yield st.data_ptr(), st.data_ptr() + st.nbytes()
    elif isinstance(obj, Payload):
        for a in obj.arrays():
            yield from spans(a)
    elif isinstance(obj, (list, tuple)):
        for a in obj:
            yield from spans(a)
    elif isinstance(obj, dict):
        for a in obj.values():
            yield from spans(a)


def overlaps(obj, arrays) -> bool:
    """Whether the arrays and tensors in ``obj`` share memory with ``arrays``."""
    taken = list(spans(arrays))
    return bool(taken) and any(lo < t_hi and t_lo < hi for lo, hi in spans(obj) for t_lo, t_hi in taken)


class Message(Handle):
    """A send or receive handle of the real backend."""

    __slots__ = ("buf", "data", "wtag", "pending")

    def __init__(self, *a):
        super().__init__(*a)
        self.buf = self.data = None  # the message, and the data message of a split payload
        self.wtag = 0
        self.pending = None  # MPI requests in flight (None: not posted or not matched yet)


class Mailbox:
    """One rank's messages in flight: posted receives not matched yet (matched
    with ``MPI_Improbe`` in posting order per (source, tag) -- sizes are not
    known in advance), MPI requests and the handles they complete, and sends
    whose data message is the sender's memory, not a copy. ``on_done(h)`` is
    called when a handle completes (a receive's ``value`` is its payload, on
    the device by ``from_host``)."""

    def __init__(self, comm, from_host, on_done):
        from mpi4py import MPI

        self.MPI, self.comm, self.from_host, self.on_done = MPI, comm, from_host, on_done
        local = os.environ.get("MPI_LOCALNRANKS", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", comm.Get_size()))
        #: how a rank with nothing to do waits (:meth:`block`)
        self.wait = wait_mode(int(local))
        self.sleeper = SocketSleep() if self.wait == "poll" else None
        self.reset()

    def reset(self):
        self.unmatched, self.reqs, self.owners, self.uncopied = [], [], [], []

    def pack(self, h: Message, payload: Payload, to_numpy, split: bool) -> None:
        h.buf, h.data = pack(payload, to_numpy, split)
        if h.data is not None:
            self.uncopied.append(h)

    def post_send(self, h: Message) -> None:
        BYTE, comm = self.MPI.BYTE, self.comm
        reqs = [comm.Isend([h.buf, BYTE], h.peer, h.wtag)]
        if h.data is not None:  # the next message of (dst, tag): MPI keeps the order
            reqs.append(comm.Isend([h.data, BYTE], h.peer, h.wtag))
        self._track(h, reqs)

    def post_recv(self, h: Message) -> None:
        self.unmatched.append(h)

    def overlaps(self, obj) -> bool:
        """Whether the arrays in ``obj`` share memory with an uncopied send in flight."""
        if not self.uncopied:
            return False
        self.uncopied = [h for h in self.uncopied if not h.done]
        return overlaps(obj, [h.data for h in self.uncopied])

    def progress(self) -> None:
        """Match what has arrived, complete what has finished; never blocks."""
        n = len(self.unmatched) + len(self.reqs)
        if self.unmatched:
            self._match()
        if self.reqs:
            done = self.MPI.Request.Testsome(self.reqs)
            if done:
                self._retire(done)
        if self.sleeper is not None and len(self.unmatched) + len(self.reqs) != n:
            self.sleeper.woke()

    def block(self, probe: bool) -> None:
        """Nothing can run until MPI completes something. ``spin``: wait inside
        MPI, where transfers progress at MPI's speed (for any request in
        flight if no receive is unmatched; else, with ``probe`` -- only a
        message for an unmatched receive can matter -- for such a message).
        ``yield``: give the core away once. ``poll``: sleep until a socket
        has data or a short timeout (:class:`SocketSleep`)."""
        MPI = self.MPI
        if self.wait == "poll":
            self.sleeper.sleep()
        elif self.wait == "yield":
            os.sched_yield()
        elif not self.unmatched and self.reqs:
            self._retire(MPI.Request.Waitsome(self.reqs) or ())
        elif self.unmatched and probe:
            status = MPI.Status()
            if len(self.unmatched) == 1:
                h = self.unmatched.pop()
                self._take(h, self.comm.Mprobe(h.peer, h.wtag, status), status)
                return
            self.comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            src, tag = status.Get_source(), status.Get_tag()
            if not any(h.peer == src and h.wtag == tag for h in self.unmatched):
                os.sched_yield()  # a message for a receive not posted yet
        else:
            os.sched_yield()

    def quiet_wait(self, req) -> None:
        """Complete one MPI request (a barrier) without spinning where the wait mode allows."""
        if self.wait == "spin":
            req.Wait()
            return
        while not req.Test():
            if self.sleeper is not None:
                self.sleeper.sleep()
            else:
                os.sched_yield()
        if self.sleeper is not None:
            self.sleeper.woke()

    def _track(self, h: Message, reqs: list) -> None:
        h.pending = len(reqs)
        self.reqs += reqs
        self.owners += [h] * len(reqs)

    def _retire(self, idx) -> None:
        """Requests ``idx`` of ``reqs`` completed."""
        gone = set(idx)
        for i in gone:
            h = self.owners[i]
            h.pending -= 1
            if not h.pending:
                self._complete(h)
        keep = [i for i in range(len(self.reqs)) if i not in gone]
        self.reqs, self.owners = [self.reqs[i] for i in keep], [self.owners[i] for i in keep]

    def _match(self) -> None:
        still, waiting, status = [], None, self.MPI.Status()
        for h in self.unmatched:
            key = (h.peer, h.wtag)
            if waiting and key in waiting:  # an earlier receive of (source, tag) has no message yet
                still.append(h)
                continue
            msg = self.comm.Improbe(h.peer, h.wtag, status)
            if msg is None:
                still.append(h)
                waiting = (waiting or set()) | {key}
            else:
                self._take(h, msg, status)
        self.unmatched = still

    def _take(self, h: Message, msg, status) -> None:
        """Receive ``msg`` for ``h`` (at once if small); the data message of a
        split payload is posted for before anything else can match it."""
        BYTE = self.MPI.BYTE
        h.buf = np.empty(status.Get_count(BYTE), dtype=np.uint8)
        if len(h.buf) > SMALL_MSG:
            self._track(h, [msg.Irecv([h.buf, BYTE])])
            return
        msg.Recv([h.buf, BYTE])
        size = split_size(h.buf)
        if size is None:
            self._complete(h)
        else:
            h.data = np.empty(size, dtype=np.uint8)
            self._track(h, [self.comm.Irecv([h.data, BYTE], h.peer, h.wtag)])

    def _complete(self, h: Message) -> None:
        h.done, h.pending = True, 0
        if h.kind == "recv":
            h.value = unpack(h.buf, self.from_host, h.data)
            h.nbytes = h.value.nbytes
        h.buf = h.data = None
        self.on_done(h)


#: ``SIMSPARSE_WAIT``: how a rank with nothing to do waits (``spin``, ``yield`` or ``poll``)
WAIT_MODES = ("spin", "yield", "poll")


def wait_mode(local_ranks: int) -> str:
    """``SIMSPARSE_WAIT`` if set (the testbed sets ``poll``); else ``spin``
    inside MPI, or ``yield`` with more ranks than cores (spinning would keep
    a core from the rank it waits for)."""
    mode = os.environ.get("SIMSPARSE_WAIT", "")
    if mode:
        if mode not in WAIT_MODES:
            raise ValueError(f"SIMSPARSE_WAIT={mode!r}; allowed: {', '.join(WAIT_MODES)}")
        return mode
    return "yield" if local_ranks > len(os.sched_getaffinity(0)) else "spin"


class SocketSleep:
    """Waiting without spinning when MPI runs over TCP sockets (the
    testbed). For :attr:`SPIN_S` after the last progress the rank only
    yields its core (a send completes, a reply comes within tens of
    microseconds); then it sleeps in ``select`` on this process's sockets
    until one has data to read -- an arriving message, a rendezvous reply --
    or a timeout. Data restarts the yielding phase: MPI may need several
    progress calls to complete what arrived. The timeout covers what no read signals: room freed in a
    socket's send buffer, which the kernel keeps draining onto the link
    meanwhile (a send buffer holds milliseconds at the testbed's rates), and
    completions of sends. It starts at :attr:`MIN_S` and doubles up to
    :attr:`MAX_S` while nothing happens; :meth:`woke` resets it. Sockets that
    stay readable without progress (data for a receive not posted yet, a
    closed peer) are slept on by time alone after :attr:`BLIND_AFTER` such
    wake-ups."""

    SPIN_S, MIN_S, MAX_S = 300e-6, 50e-6, 2e-3
    BLIND_AFTER = 3
    #: libfabric connects to a peer on its first message: after a timeout, look for new sockets
    #: if the last look is older than this (listing /proc/self/fd costs tens of microseconds)
    RESCAN_S = 5e-3

    @classmethod
    def polling_after(cls) -> float:
        """Seconds from a wait's last progress to the first timeout of :attr:`MAX_S`: the yielding,
        then each shorter timeout (3.45 ms); from then on a waiting rank wakes every :attr:`MAX_S`."""
        t, total = cls.MIN_S, cls.SPIN_S
        while t < cls.MAX_S:
            total, t = total + t, 2 * t
        return total

    def __init__(self):
        self.fds: list[int] = []
        self.scanned = -1.0
        self.timed_out = True   # a select that saw nothing: maybe a socket it does not know
        self.woke()

    def _scan(self) -> None:
        now = time.monotonic()
        if now - self.scanned < self.RESCAN_S or (self.fds and not self.timed_out):
            return
        self.scanned = now
        fds = []
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    fds.append(int(name))
            except OSError:
                continue
        self.fds = [fd for fd in fds if fd < 1024]   # select's limit; libfabric's sockets come early

    def sleep(self) -> None:
        now = time.perf_counter()
        if self.since is None:
            self.since = now
        if now - self.since < self.SPIN_S:
            os.sched_yield()
            return
        self._scan()
        if self.fruitless >= self.BLIND_AFTER or not self.fds:
            time.sleep(self.t)
        else:
            try:
                ready, _, _ = select.select(self.fds, [], [], self.t)
            except (OSError, ValueError):   # a socket closed since the scan
                self.scanned = -1.0
                ready = []
            self.fruitless = self.fruitless + 1 if ready else 0
            self.timed_out = not ready
            if ready:   # data arrived: MPI may need a few progress calls to complete it; poll again first
                self.since = None
                return
        self.t = min(2 * self.t, self.MAX_S)

    def woke(self) -> None:
        self.t, self.since, self.fruitless = self.MIN_S, None, 0
