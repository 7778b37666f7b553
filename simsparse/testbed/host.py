"""Bring a :class:`~.plan.Plan` up on this Linux host, and always down again.

Safety, in the order it is enforced:

* **Only our own names.** Every namespace is ``simsparse-tb-<name>-<key>``
  (:data:`~.plan.PREFIX`); every interface is created *inside* one of them
  (``ip -n NS link add ... peer ... netns NS2``), never in the host's own
  namespace, and dies with it. Nothing outside the prefix is read-modified.
* **Nothing routed out.** The namespaces hold only the testbed's veths and
  their loopback: no default route, ``ip_forward`` 0, IPv6 off, addresses
  from 198.18.0.0/15. (TCP's small-queue limit is set per namespace too,
  :data:`TSQ_B`, and the description's congestion control on each host's
  route to that range.) There is no link to any real interface, so traffic can
  only flow between the testbed's own namespaces.
* **Always torn down.** A state file (``/run/simsparse/testbed/<name>.json``)
  is written *before* anything is created, naming the namespaces and the
  owning process (pid and start time). :func:`down` kills what still runs
  inside the namespaces, deletes them and the file. :class:`Testbed` tears
  down on exit and on SIGTERM/SIGINT/SIGHUP; a run killed with SIGKILL is
  cleaned up by the next :func:`up` or :func:`cleanup_stale`, which removes
  every testbed whose owner is gone (and any namespace with our prefix that
  no state file claims).

Queues (see :mod:`.plan`): ``tbf`` (token bucket) with ``rate`` the line
rate, ``burst`` the description's ``shaper_burst_B`` and at least two full
frames (:func:`~.plan.burst_of`), ``limit`` the queue in bytes (a switch port's buffer; tail
drop beyond it), and a size table adding the 24 bytes per frame Linux does
not see. GSO is limited to one segment per packet so that every frame is
charged its own framing. A link latency above zero needs ``netem`` as the
parent of the ``tbf``; a kernel without ``sch_netem`` refuses such a link.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .plan import PREFIX, WIRE_EXTRA_B, Plan

STATE_DIR = Path(os.environ.get("SIMSPARSE_TESTBED_STATE", "/run/simsparse/testbed"))
#: TCP Small Queues: the bytes one socket may keep in its host's transmit queue. Linux 6.6 raised the
#: default to 4 MiB for 100 Gb/s NICs; at 100 Mb/s that is 320 ms of queue, through which the ACKs of the
#: other direction wait (an exchange lost up to 20 % of its goodput). A real host's queue is kept short by
#: its qdisc (fq_codel, 5 ms target), which this kernel lacks; the testbed restores TSQ's original default
#: (128 KiB, Linux 3.6, commit 46d3ceab "tcp: TCP Small Queues"), 10 ms at 100 Mb/s.
TSQ_B = 131072
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


class TestbedError(Exception):
    """The testbed cannot be built here (one clear sentence)."""

    __test__ = False  # not a pytest class


# -- can it run here? -----------------------------------------------------------------------
def _caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def why_not() -> str | None:
    """Why no testbed can be built here, in one sentence; None if it can."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed needs iproute2's `{tool}` command, which is not on PATH"
    caps = _caps()
    if os.geteuid() != 0 and not (caps >> CAP_NET_ADMIN & 1 and caps >> CAP_SYS_ADMIN & 1):
        return ("the testbed needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces, "
                "and this process has neither")
    return None


def require() -> None:
    reason = why_not()
    if reason:
        raise TestbedError(reason)


# -- commands -------------------------------------------------------------------------------
def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip()[:300]}")
    return proc


def existing_namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ns_pids(ns: str) -> list[int]:
    out = _run("ip", "netns", "pids", ns, check=False).stdout
    return [int(x) for x in out.split() if x.isdigit()]


def _delete_ns(ns: str) -> None:
    if not ns.startswith(PREFIX):  # never anything we did not name
        raise AssertionError(f"refusing to delete namespace {ns!r}")
    for _ in range(3):
        pids = _ns_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    _run("ip", "netns", "delete", ns, check=False)


# -- state files ----------------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _state_path(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def _write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def read_state(name: str) -> dict | None:
    try:
        return json.loads(_state_path(name).read_text())
    except (OSError, ValueError):
        return None


def _alive(state: dict) -> bool:
    owner = state.get("owner")
    if owner is None:  # made by `simsparse testbed up`: it lives until `testbed down`
        return True
    return _start_time(owner["pid"]) == owner["start"]


def states() -> list[dict]:
    out = []
    for p in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []:
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def cleanup_stale() -> list[str]:
    """Tear down every testbed whose owner process is gone, and every
    namespace with our prefix that no live state file claims. Returns the
    names of the testbeds removed."""
    removed, claimed = [], set()
    for st in states():
        if _alive(st):
            claimed.update(st["namespaces"])
        else:
            down(st["name"])
            removed.append(st["name"])
    for ns in existing_namespaces():
        if ns.startswith(PREFIX) and ns not in claimed:
            _delete_ns(ns)
    return removed


# -- up, down ------------------------------------------------------------------------------
def up(pl: Plan, persistent: bool = False) -> dict:
    """Create the testbed of ``pl``; returns its state. A live testbed of
    the same name is refused; a stale one is removed first."""
    require()
    cleanup_stale()
    old = read_state(pl.name)
    if old is not None:
        raise TestbedError(f"a testbed named {pl.name!r} is already up (P = {old['P']}); take it down with "
                           f"`simsparse testbed down {old.get('spec_path') or pl.name}`")
    me = os.getpid()
    state = {"name": pl.name, "P": pl.P, "namespaces": pl.namespaces(), "spec": pl.spec,
             "ranks": [pl.rank_netns(r) for r in range(pl.P)],
             "addresses": [pl.rank_address(r) for r in range(pl.P)],
             "queues": [q.__dict__ for q in pl.queues], "created": time.time(),
             "owner": None if persistent else {"pid": me, "start": _start_time(me)}}
    _write_state(_state_path(pl.name), state)   # before anything exists: a kill from here on is cleaned up
    try:
        _build(pl)
    except BaseException:
        down(pl.name)
        raise
    return state


def down(name: str) -> bool:
    """Remove the testbed ``name`` (its namespaces, what runs in them, its
    state file). Whether there was one."""
    st = read_state(name)
    namespaces = st["namespaces"] if st else []
    present = set(existing_namespaces())
    for ns in namespaces:
        if ns in present:
            _delete_ns(ns)
    for ns in present:  # a build killed before its state listed everything
        if ns.startswith(f"{PREFIX}{name}-"):
            _delete_ns(ns)
    try:
        _state_path(name).unlink()
    except FileNotFoundError:
        return bool(namespaces)
    return True


def _build(pl: Plan) -> None:
    fab = pl.netns("fabric")
    for ns in pl.namespaces():
        _run("ip", "netns", "add", ns)
        _sysctl(ns, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                "net.ipv4.ip_forward=0", f"net.ipv4.tcp_limit_output_bytes={TSQ_B}")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
    for br in pl.bridges:
        _run("ip", "-n", fab, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _run("ip", "-n", fab, "link", "set", br, "mtu", str(pl.mtu), "up")
    for v in pl.veths:
        a, b = pl.netns(v.a_ns), pl.netns(v.b_ns)
        _run("ip", "-n", a, "link", "add", v.a_dev, "mtu", str(pl.mtu), "type", "veth", "peer", "name", v.b_dev,
             "mtu", str(pl.mtu), "netns", b)
        for ns, dev, br in ((a, v.a_dev, v.a_bridge), (b, v.b_dev, v.b_bridge)):
            _run("ip", "-n", ns, "link", "set", dev, "gso_max_segs", "1")
            if br:
                _run("ip", "-n", ns, "link", "set", dev, "master", br)
            _run("ip", "-n", ns, "link", "set", dev, "up")
    cc = pl.spec.get("congestion_control", "cubic")
    for key, addr in pl.hosts.items():
        _run("ip", "-n", pl.netns(key), "addr", "add", addr, "dev", "eth0")
        _congestion_control(pl.netns(key), addr, cc)
    for q in pl.queues:
        _shape(pl.netns(q.ns), q, pl.mtu, pl.burst_B)
    for ns in pl.namespaces():  # the promise of the module docstring, checked
        if _run("ip", "-n", ns, "route", "show", "default").stdout.strip():
            raise TestbedError(f"namespace {ns} has a default route; refusing to run")


def _congestion_control(ns: str, addr: str, cc: str) -> None:
    """Every connection of the host in ``ns`` runs ``cc``: set on the route to the testbed's subnet
    (``congctl``), because a namespace other than the host's may only make an unrestricted algorithm its
    default (``tcp_allowed_congestion_control``: here reno and bbr), and the host's own setting is not ours
    to change."""
    iface = ipaddress.ip_interface(addr)
    try:
        _run("ip", "-n", ns, "route", "replace", str(iface.network), "dev", "eth0", "proto", "kernel",
             "scope", "link", "src", str(iface.ip), "congctl", cc)
    except TestbedError:
        avail = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
        have = avail.read_text().split() if avail.is_file() else []
        raise TestbedError(f"the testbed description's congestion_control: {cc} cannot be set in this kernel "
                           f"(available: {', '.join(have) or 'unknown'})") from None


def _sysctl(ns: str, *settings: str) -> None:
    for s in settings:
        _run("ip", "netns", "exec", ns, "sysctl", "-qw", s, check=not s.startswith("net.ipv6"))


def _shape(ns: str, q, mtu: int, burst: int) -> None:
    frame = mtu + 14 + WIRE_EXTRA_B
    tbf = ["tbf", "rate", f"{q.rate_Bps * 8:.0f}bit", "burst", str(burst), "limit", str(max(q.limit_B, frame))]
    stab = ["stab", "overhead", str(WIRE_EXTRA_B), "linklayer", "ethernet"]
    if q.latency_s > 0:
        proc = _run("tc", "-n", ns, "qdisc", "add", "dev", q.dev, "root", "handle", "1:", *stab, "netem", "delay",
                    f"{q.latency_s * 1e6:.3f}us", "limit", "1000000", check=False)
        if proc.returncode != 0:
            raise TestbedError(f"this kernel cannot delay packets (tc netem: {proc.stderr.strip()[:120]}); links "
                               f"with a latency cannot be emulated: set link_latency_s: 0")
        _run("tc", "-n", ns, "qdisc", "add", "dev", q.dev, "parent", "1:", "handle", "2:", *tbf)
    else:
        _run("tc", "-n", ns, "qdisc", "add", "dev", q.dev, "root", "handle", "1:", *stab, *tbf)


# -- what crossed the links --------------------------------------------------------------------
def counters(state: dict) -> list[dict]:
    """Per queue of a live testbed: bytes, packets and drops since it was built."""
    out, cache = [], {}
    for q in state["queues"]:
        ns = f"{PREFIX}{state['name']}-{q['ns']}"
        if ns not in cache:
            raw = _run("tc", "-n", ns, "-s", "-j", "qdisc", "show").stdout
            cache[ns] = json.loads(raw or "[]")
        stats = [d for d in cache[ns] if d.get("dev") == q["dev"] and d.get("kind") == "tbf"]
        s = stats[0] if stats else {}
        out.append({**q, "bytes": s.get("bytes", 0), "packets": s.get("packets", 0), "drops": s.get("drops", 0)})
    return out
