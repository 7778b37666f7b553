"""The environment the real backend's ranks start with (backends/real/rank_env.py)."""
import subprocess
import sys

from simsparse.backends.real.rank_env import RANK_ENV, rank_env

PROBE = """
import resource, numpy as np
a = np.ones(4_000_000, np.float32)
for _ in range(2):
    c = a + a; del c                       # warm: the heap grows once
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    c = a + a; del c
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def test_a_caching_heap_and_one_thread_unless_the_caller_says_otherwise():
    env = rank_env({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "1"
    assert env["MALLOC_MMAP_MAX_"] == "0" and int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 32
    mine = rank_env({"MALLOC_MMAP_MAX_": "65536", "OMP_NUM_THREADS": "4"})
    assert mine["MALLOC_MMAP_MAX_"] == "65536" and mine["OMP_NUM_THREADS"] == "4"
    assert set(RANK_ENV) <= set(mine)


def test_with_it_a_buffer_freed_in_one_iteration_is_reused_without_faulting():
    """16 MB outputs: glibc maps and unmaps each one by default (dynamic mmap threshold
    starts at 128 KiB); under RANK_ENV the freed block is reused and nothing faults."""
    def faults(env):
        return int(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                  check=True).stdout)

    base = {"PATH": "/usr/bin:/bin", "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}   # glibc's default start, fixed
    cached, fresh = faults(rank_env(base)), faults(base)
    assert cached < 5 <= fresh, (cached, fresh)   # numpy asks for huge pages: a fresh 16 MB is >= 8 faults


GROWTH = """
import resource, sys, numpy as np
from simsparse.backends.real.rank_env import heap_bytes, reserve_heap
a = np.ones(4_000_000, np.float32); del a        # the warm-up's heap: 16 MB
reserved = reserve_heap(1) if sys.argv[1] == "1" else 0
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
keep = np.ones(2_000_000, np.float32)            # a later request past the heap's top (fragmentation)
b = np.ones(3_000_000, np.float32)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
del keep, b
again = reserve_heap(1) if sys.argv[1] == "1" else 0   # the next point: the heap has not grown past the reserve
print(reserved, heap_bytes(), faults, again)
"""


def test_the_reserve_after_the_warm_up_takes_the_heaps_later_growth_without_faulting():
    """Growth past the warm-up's heap faults page by page; after reserve_heap (a block as large as the
    heap, touched and freed) the same growth finds resident pages, and a second reserve with no growth
    since touches nothing."""
    def run(reserve):
        out = subprocess.run([sys.executable, "-c", GROWTH, reserve], env=rank_env({"PATH": "/usr/bin:/bin"}),
                             capture_output=True, text=True, check=True).stdout.split()
        return [int(v) for v in out]

    (reserved, held, faults, again), (none, _, grown, _) = run("1"), run("0")
    assert none == 0 and reserved >= 16_000_000 and held >= reserved   # the block stays in the heap, free
    assert faults < 5 <= grown, (faults, grown)
    assert again == 0   # its pages are still resident: nothing is touched twice


def test_no_reserve_without_the_caching_heap(monkeypatch):
    from simsparse.backends.real import rank_env as re

    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")
    assert re.reserve_heap(4) == 0   # freed, the block would go back to the system


def test_the_reserve_can_be_turned_off(monkeypatch):
    from simsparse.backends.real import rank_env as re

    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    monkeypatch.setenv("SIMSPARSE_HEAP_RESERVE", "0")
    assert re.reserve_heap(4) == 0


RELEASE = """
import numpy as np
from simsparse.backends.real.rank_env import release_heap, reserve_heap

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))

a = np.ones(25_000_000, np.float32); del a       # a point's 100 MB, freed: the caching heap keeps it resident
reserve_heap(1)
held = rss()
release_heap()
print(held, rss(), reserve_heap(1))
"""


def test_releasing_the_heap_between_unlike_points_gives_its_pages_back_and_the_next_reserve_touches_again():
    """What calibration does between algorithms: a launch of many unlike points would otherwise keep
    every point's free fragments resident (a rank reached 3.7 GB at P = 8)."""
    out = subprocess.run([sys.executable, "-c", RELEASE], env=rank_env({"PATH": "/usr/bin:/bin"}),
                         capture_output=True, text=True, check=True).stdout.split()
    held, released, again = (int(v) for v in out)
    assert held - released >= 90_000_000, (held, released)   # the point's 100 MB, free in the heap
    assert again > 0   # forgotten: the next point's reserve is made again
