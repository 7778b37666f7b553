"""How a real-backend rank waits: the mode by setting and by cores, and the
socket sleeper that lets ranks on a testbed wait without spinning."""
import os
import socket
import time

import pytest

from simsparse.backends.real import wire


def test_wait_mode_follows_the_setting_then_the_cores(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("SIMSPARSE_WAIT", raising=False)
    assert wire.wait_mode(cores) == "spin"
    assert wire.wait_mode(cores + 1) == "yield"
    monkeypatch.setenv("SIMSPARSE_WAIT", "poll")
    assert wire.wait_mode(cores + 1) == "poll"
    monkeypatch.setenv("SIMSPARSE_WAIT", "busy")
    with pytest.raises(ValueError, match="spin, yield, poll"):
        wire.wait_mode(1)


def test_socket_sleep_yields_first_then_backs_off_and_wakes_on_data():
    s = wire.SocketSleep()
    a, b = socket.socketpair()
    try:
        # as if the scan had found libfabric's socket; never rescan, so that other sockets of the
        # test process (a readable one would count as data) cannot enter, however slow the host
        s.scanned, s.fds, s.RESCAN_S = time.monotonic(), [a.fileno()], float("inf")
        s.sleep()                                           # the first wait only yields (no progress for 0 s)
        assert s.since is not None and s.t == s.MIN_S
        waits = []
        for _ in range(8):                                  # then select() with a doubling timeout
            s.since = time.perf_counter() - s.SPIN_S        # SPIN_S past the last progress, without racing the clock
            t1 = time.perf_counter()
            s.sleep()
            waits.append(time.perf_counter() - t1)
        assert s.t == s.MAX_S and waits[-1] >= s.MAX_S / 2 * 0.9
        b.send(b"x")                                        # data wakes it at once ...
        t1 = time.perf_counter()
        s.sleep()
        assert time.perf_counter() - t1 < s.MAX_S   # not the timeout it would have slept
        assert s.since is None and s.fruitless == 1         # ... and it polls MPI again before sleeping
        for _ in range(s.BLIND_AFTER - 1):                  # readable without progress: after a few, by time alone
            s.since = time.perf_counter() - s.SPIN_S
            s.sleep()
        assert s.fruitless >= s.BLIND_AFTER
        s.since = time.perf_counter() - s.SPIN_S
        t1 = time.perf_counter()
        s.sleep()                                           # blind: sleeps its timeout although data is there
        assert time.perf_counter() - t1 >= s.t / 2 * 0.9
        s.woke()
        assert (s.t, s.since, s.fruitless) == (s.MIN_S, None, 0)
    finally:
        a.close()
        b.close()
