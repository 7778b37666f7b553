"""The environment every real-backend rank starts with (``simsparse measure``
and ``simsparse calibrate`` launch them with it).

* one OpenMP/torch intra-op thread per rank (the model gives a rank one core);
* a caching heap: glibc's ``malloc`` never maps a block of its own
  (``MALLOC_MMAP_MAX_=0``) and never gives the heap's top back
  (``MALLOC_TRIM_THRESHOLD_``), so a buffer freed in one iteration is reused
  by the next instead of being unmapped and faulted in again page by page.
  This is what a GPU run gets from PyTorch's caching allocator, and what the
  model assumes: it charges a kernel its memory traffic, not the kernel's
  page faults. With glibc's defaults every buffer above the (dynamic, at most
  32 MiB) mmap threshold is a fresh mapping: on the development VM a first
  touch costs about 2.7 us per 4 KiB page (``benchmarks/bench_page_faults.py``),
  and ``simsparse measure`` of ring, Top-k and QSGD at 10^5..10^7 elements ran
  1.2x to 3.4x slower, its system time 6x larger (docs/validation.md, "What
  the host model had to learn").

A variable already set in the caller's environment wins, so a user can measure
with glibc's defaults (e.g. ``MALLOC_MMAP_MAX_=65536``).

The caching heap still grows after the warm-up: buffers of varying sizes
fragment it, and a request that fits no hole extends the heap's top into
fresh pages. On the testbed in TernGrad at P = 4, n = 1e7, every slow
dequantize call had faulted 20 k to 78 k pages (0.6 to 1.8 s against 0.18 s
steady), up to the 51st call. So after its warm-up each rank touches and
frees a block as large as its heap (:func:`reserve_heap`): the heap's top
then holds that many resident pages, which later growth reuses without a
fault (the same run: quantize's p90 3.0 -> 0.63 s, 75 -> 49 s in all).
"""
from __future__ import annotations

import ctypes
import os
import sys

RANK_ENV = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def rank_env(environ=None) -> dict:
    """``environ`` (default: this process's) with :data:`RANK_ENV` filled in where unset."""
    env = dict(os.environ if environ is None else environ)
    for k, v in RANK_ENV.items():
        env.setdefault(k, v)
    return env


def as_a_rank() -> None:
    """Start this script again with :data:`RANK_ENV` where its environment differs (glibc reads its
    allocator settings as a process starts): what a benchmark timing kernels as a rank runs them calls
    first."""
    if any(os.environ.get(k) != v for k, v in RANK_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **RANK_ENV})


class _MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_bytes() -> int | None:
    """Bytes glibc's ``malloc`` holds from the system (``mallinfo2``: the heap and its own mappings);
    None where there is no glibc 2.33 or later."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    return int(m.arena + m.hblkhd)


def host_cores() -> int:
    """Cores this process may run on (what the ranks of a launch share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def meminfo_bytes(key: str) -> int | None:
    """The host's /proc/meminfo ``key`` (``MemTotal``, ``MemAvailable``) in bytes; None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


#: the heap's bytes right after this process's last reserve (what it holds resident, in use or free)
_reserved_to = 0


def reserve_heap(ranks_here: int, share: float = 0.5) -> int:
    """Touch and free a block as large as this process's heap, at most ``share`` of the host's
    available memory over ``ranks_here`` (the ranks that reserve at once), so that the heap's top
    holds resident pages for its later growth (module docstring). Once per growth: where the heap
    holds no more than it did after the last reserve (the next point of one launch), those pages
    are still resident and nothing is touched again (each point had doubled the heap and touched
    all of it: 10 of the 15 s that 17 small points took at P = 4). Returns the bytes touched
    (0 where glibc does not say its heap, where :data:`RANK_ENV`'s caching heap is off: freed,
    the block would go back to the system, or where ``SIMSPARSE_HEAP_RESERVE=0`` turns it off)."""
    import numpy as np

    global _reserved_to
    held, free = heap_bytes(), meminfo_bytes("MemAvailable")
    if not held or os.environ.get("MALLOC_MMAP_MAX_") != "0" or os.environ.get("SIMSPARSE_HEAP_RESERVE") == "0":
        return 0
    if held <= _reserved_to:
        return 0
    size = int(min(held, share * free / max(1, ranks_here))) if free else held
    if size <= 0:
        return 0
    block = np.ones(size, np.uint8)   # every page written: resident
    del block
    _reserved_to = heap_bytes() or 0
    return size


def release_heap() -> None:
    """Give the caching heap's free pages back to the system (glibc's ``malloc_trim``, which also
    releases free pages inside the heap) and forget the last reserve, so that the next point's
    :func:`reserve_heap` touches again what it then needs: what one launch of many unlike points
    (calibration's every algorithm at 1.2e7 elements) does between them, where each point's
    fragments otherwise stay resident after it (a rank held 3.7 GB at P = 8)."""
    global _reserved_to
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return
    _reserved_to = 0
