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
"""
from __future__ import annotations

import os

RANK_ENV = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def rank_env(environ=None) -> dict:
    """``environ`` (default: this process's) with :data:`RANK_ENV` filled in where unset."""
    env = dict(os.environ if environ is None else environ)
    for k, v in RANK_ENV.items():
        env.setdefault(k, v)
    return env
