"""Serialisation of payloads into one contiguous byte buffer per message.

Layout: an 8-byte header length, a pickled header (payload type, its
metadata, dtype and length of each array), then each array's bytes, every
section aligned to 8 bytes. Only the arrays count as bytes on the wire (the
same count the simulator uses); the header is framing.
"""
from __future__ import annotations

import pickle

import numpy as np

from ..ops import PAYLOAD_TYPES, Bundle, Payload

_ALIGN = 8


def _pad(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def _describe(p: Payload):
    if isinstance(p, Bundle):
        return ("Bundle", [_describe(q) for q in p.parts])
    return (type(p).__name__, p.meta())


def pack(payload: Payload, to_numpy) -> np.ndarray:
    """Payload -> uint8 buffer. ``to_numpy`` turns an array/tensor into host numpy."""
    arrays = [np.ascontiguousarray(to_numpy(a)) for a in payload.arrays()]
    header = pickle.dumps((_describe(payload), [(a.dtype.str, a.size) for a in arrays]), protocol=5)
    size = _ALIGN + _pad(len(header)) + sum(_pad(a.nbytes) for a in arrays)
    buf = np.empty(size, dtype=np.uint8)
    buf[:_ALIGN].view(np.uint64)[0] = len(header)
    buf[_ALIGN:_ALIGN + len(header)] = np.frombuffer(header, dtype=np.uint8)
    off = _ALIGN + _pad(len(header))
    for a in arrays:
        buf[off:off + a.nbytes] = a.view(np.uint8).reshape(-1)
        off += _pad(a.nbytes)
    return buf


def unpack(buf: np.ndarray, from_numpy) -> Payload:
    """uint8 buffer -> payload; ``from_numpy`` turns each numpy array into the
    backend's array type (e.g. a torch tensor on the right device)."""
    hlen = int(buf[:_ALIGN].view(np.uint64)[0])
    desc, specs = pickle.loads(buf[_ALIGN:_ALIGN + hlen].tobytes())
    off = _ALIGN + _pad(hlen)
    arrays = []
    for dtype, count in specs:
        dt = np.dtype(dtype)
        arrays.append(buf[off:off + count * dt.itemsize].view(dt))
        off += _pad(count * dt.itemsize)
    it = iter(arrays)
    return _build(desc, it, from_numpy)


def _build(desc, it, from_numpy) -> Payload:
    kind, meta = desc
    if kind == "Bundle":
        return Bundle(tuple(_build(d, it, from_numpy) for d in meta))
    cls = PAYLOAD_TYPES[kind]
    conv = np.copy if cls.HOST else from_numpy
    return cls(**meta, **{f: conv(next(it)) for f in cls.ARRAYS})
