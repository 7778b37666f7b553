"""A cache bounded by the bytes it holds, least recently used out first, with
a mode for keys read in sweeps (:mod:`simsparse.workload`'s gradient sets
and AR(1) noise states)."""
from __future__ import annotations


class LRU:
    """Keeps recently generated gradient sets (consecutive points of a sweep
    usually share them), bounded by total bytes.

    ``sweeps``: keys are (stream..., rank), read rank after rank, over and
    over (the AR(1) noise states: each iteration reads every rank's). An LRU
    smaller than one sweep then misses every time: it drops the state the
    sweep reads next. Such a cache makes room by dropping other streams'
    entries, least recent first; when the newcomer's own stream fills it,
    it keeps what it holds and turns the newcomer away (a held state is
    still replaced by its next iteration's): the ranks it holds hit, the
    others draw their noise from iteration 0. Ok-Topk's BERT at P = 256
    (the paper's Fig. 12 config, data_scale 0.01: 256 states of 5.3 MB
    against 1 GiB) drew 10 noise vectors per rank over its 4 iterations
    with the plain LRU, 45 of its 90 s."""

    def __init__(self, max_bytes: int, sweeps: bool = False):
        self.max_bytes, self.sweeps = max_bytes, sweeps
        self.items: dict = {}
        self.size = 0

    def get(self, key):
        val = self.items.pop(key, None)
        if val is not None:
            self.items[key] = val  # most recent last
            return val[0]
        return None

    def put(self, key, val, nbytes: int) -> None:
        old = self.items.pop(key, None)
        if old is not None:
            self.size -= old[1]
        if nbytes > self.max_bytes:
            return
        while self.sweeps and self.size + nbytes > self.max_bytes:
            other = next((k for k in self.items if k[:-1] != key[:-1]), None)
            if other is None:   # this stream's sweep fills the cache
                return
            self.size -= self.items.pop(other)[1]
        while self.items and self.size + nbytes > self.max_bytes:
            oldest = next(iter(self.items))
            self.size -= self.items.pop(oldest)[1]
        self.items[key] = (val, nbytes)
        self.size += nbytes

    def resize(self, max_bytes: int) -> None:
        """A new bound; the least recent entries go until the cache fits it."""
        self.max_bytes = max_bytes
        while self.items and self.size > max_bytes:
            self.size -= self.items.pop(next(iter(self.items)))[1]
