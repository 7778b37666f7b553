"""The emulated cluster: its plan is the simulator's machine, it refuses
clearly where it cannot run, it comes up and always goes down (also after
SIGKILL), rank i runs in host namespace i with its traffic through the
shaped links, and every algorithm measured on it is correct with the
simulator's bytes."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from simsparse.algorithms import ALGORITHMS
from simsparse.network.spec import EthernetSpec, FatTreeSpec
from simsparse.testbed import Testbed, host, plan
from simsparse.testbed.plan import PREFIX, WIRE_EXTRA_B, PlanError

from tests.helpers import HAVE_MPI, make_point


@pytest.fixture(autouse=True)
def one_testbed_test_at_a_time(tmp_path_factory):
    """The testbeds are host-wide (namespaces by name): across the suite's workers, this file's
    tests take a lock and run one after another."""
    import fcntl

    lock = tmp_path_factory.getbasetemp().parent / "testbed-tests.lock"   # (shared by the workers)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield

RATE = 12.5e6
STAR = dict(name="t-star", topology="star", link_bw_Bps=RATE, framing="tcp", mtu_B=9000)
TREE = dict(name="t-tree", topology="leafspine", link_bw_Bps=RATE, framing="tcp", mtu_B=9000, switch_ports=8,
            hosts_per_leaf=2, oversubscription=2)

reason = host.why_not()
needs_testbed = pytest.mark.skipif(reason is not None, reason=reason or "")


def _ours() -> set[str]:
    return {ns for ns in host.existing_namespaces() if ns.startswith(PREFIX)}


# -- the plan: the simulator's machine, one to one ------------------------------------------
def test_star_plan_is_the_simulators_star():
    spec = EthernetSpec(**STAR)
    pl = plan(spec, 4)
    assert pl.namespaces() == [pl.netns("fabric")] + [pl.netns(f"h{e}") for e in range(4)]
    assert len(pl.bridges) == 1 and len(pl.veths) == 4
    assert [pl.rank_netns(r) for r in range(4)] == [pl.netns(f"h{r}") for r in range(4)]
    # every directed link of the machine is one queue: a host's transmit queue and the switch's output port
    machine, _ = spec.machine(4)
    assert sorted(q.link for q in pl.queues) == list(range(machine.topo.n_links))
    assert {q.role for q in pl.queues} == {"host", "port"}
    for q in pl.queues:   # shaped to the line rate: the simulator's payload rate over the framing efficiency
        assert q.rate_Bps == pytest.approx(RATE)
        assert q.limit_B == (spec.port_buffer_B if q.role == "port" else q.limit_B)
    assert len({a.split("/")[0] for a in pl.hosts.values()}) == 4
    assert all(a.startswith("198.18.") for a in pl.hosts.values())


def test_tree_plan_has_one_uplink_per_leaf_at_the_oversubscribed_rate():
    pl = plan(EthernetSpec(**TREE), 8)
    assert len(pl.bridges) == 5   # 4 leaves, 1 spine
    up = [q for q in pl.queues if q.dev.startswith("s")]
    assert len(up) == 8   # 4 uplinks, each way
    for q in up:          # 2 hosts per leaf at 2:1: the uplink carries one host link's rate
        assert q.rate_Bps == pytest.approx(RATE)


def test_payload_rate_is_line_rate_times_tcp_framing():
    spec = EthernetSpec(**STAR)
    assert spec.payload_rate() == pytest.approx(RATE * (9000 - 52) / (9000 + 38))
    assert EthernetSpec(**{**STAR, "mtu_B": 1500}).payload_efficiency() == pytest.approx(1448 / 1538)
    # framing none: link_bw_Bps is already the payload rate; the testbed shapes the wire faster by the framing
    none = EthernetSpec(**{**STAR, "framing": "none"})
    assert none.payload_rate() == RATE
    assert plan(none, 2).queues[0].rate_Bps == pytest.approx(RATE / none.payload_efficiency())
    assert WIRE_EXTRA_B == 24


@pytest.mark.parametrize("spec, P, words", [
    (FatTreeSpec(radix=4), 4, "not Ethernet"),
    (EthernetSpec(**{**STAR, "gpus_per_node": 2}), 4, "one rank in each host"),
    (EthernetSpec(**{**TREE, "hosts_per_leaf": 4}), 8, "loop-free tree"),
])
def test_machines_it_cannot_build_are_refused_in_one_sentence(spec, P, words):
    with pytest.raises(PlanError, match=words):
        plan(spec, P)


def test_a_congestion_control_this_kernel_cannot_set_is_refused_naming_the_key(monkeypatch):
    def fail(*args, check=True):
        raise host.TestbedError("`ip route replace` failed: No such file or directory")

    monkeypatch.setattr(host, "_run", fail)
    with pytest.raises(host.TestbedError, match="congestion_control: reno cannot be set"):
        host._congestion_control("ns", "198.18.0.1/15", "reno")
    with pytest.raises(ValueError, match="congestion_control"):
        EthernetSpec(**{**STAR, "congestion_control": "vegas"})


def test_a_bad_description_names_its_file_and_key(tmp_path):
    from simsparse.experiments.config.errors import ConfigError
    from simsparse.testbed import load_spec

    bad = tmp_path / "tb.yaml"
    bad.write_text("model: ethernet\ncongestion_control: vegas\n")
    with pytest.raises(ConfigError, match=r"tb\.yaml: network\.congestion_control = 'vegas' is not allowed.*'cubic'"):
        load_spec(str(bad))


def test_without_privileges_or_iproute2_it_refuses_with_one_sentence(monkeypatch):
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(host, "_caps", lambda: 0)
    msg = host.why_not()
    assert "needs root" in msg and "\n" not in msg
    with pytest.raises(host.TestbedError, match="needs root"):
        host.require()
    monkeypatch.setattr(host.shutil, "which", lambda tool: None)
    assert "iproute2" in host.why_not()


# -- up and down ----------------------------------------------------------------------------
@needs_testbed
def test_up_and_down_leave_nothing_behind():
    before = _ours()
    with Testbed(EthernetSpec(**TREE), 4) as tb:
        made = set(tb.state["namespaces"])
        assert made <= _ours() and not made & before
        fab = tb.plan.netns("fabric")
        links = host._run("ip", "-n", fab, "-o", "link", "show").stdout
        assert "br" in links and "s" in links
        qd = host._run("tc", "-n", fab, "qdisc", "show").stdout
        assert qd.count("tbf") == sum(q.ns == "fabric" for q in tb.plan.queues)
        for ns in made:   # no route out: no default route, forwarding off
            assert host._run("ip", "-n", ns, "route", "show", "default").stdout.strip() == ""
        for key in tb.plan.hosts:   # every host's connections run the description's TCP
            assert "congctl cubic" in host._run("ip", "-n", tb.plan.netns(key), "route", "show").stdout
            fwd = host._run("ip", "netns", "exec", ns, "sysctl", "-n", "net.ipv4.ip_forward").stdout.strip()
            assert fwd == "0"
    # only ours are checked: a stale testbed of a dead run may have been cleaned meanwhile
    assert not made & _ours() and _ours() <= before
    assert host.read_state(tb.plan.name) is None


@needs_testbed
def test_a_killed_run_is_cleaned_up_by_the_next_start(tmp_path):
    code = textwrap.dedent(f"""
        import time
        from simsparse.network.spec import EthernetSpec
        from simsparse.testbed import Testbed
        with Testbed(EthernetSpec(**{STAR!r}), 3):
            print("up", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    name = plan(EthernetSpec(**STAR), 3).name
    assert any(ns.startswith(f"{PREFIX}{name}-") for ns in _ours())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert host.read_state(name) is not None   # left behind ...
    assert name in host.cleanup_stale()        # ... and removed by the next start
    assert not any(ns.startswith(f"{PREFIX}{name}-") for ns in _ours())


@needs_testbed
def test_sigterm_tears_down():
    code = textwrap.dedent(f"""
        import time
        from simsparse.network.spec import EthernetSpec
        from simsparse.testbed import Testbed
        with Testbed(EthernetSpec(**{STAR!r}), 2):
            print("up", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    name = plan(EthernetSpec(**STAR), 2).name
    assert host.read_state(name) is None and not any(ns.startswith(f"{PREFIX}{name}-") for ns in _ours())


# -- ranks in their namespaces, traffic through the links -----------------------------------
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs the [mpi] extra (mpi4py, torch, mpiexec)")


@needs_testbed
@needs_mpi
@pytest.mark.mpi
def test_rank_i_runs_in_namespace_i_and_its_bytes_cross_the_links(tmp_path):
    from simsparse.experiments.run.measure import find_mpiexec

    script = tmp_path / "who.py"
    script.write_text(textwrap.dedent("""
        import json, os, subprocess, sys
        import numpy as np
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        r = comm.Get_rank()
        addr = subprocess.run(["ip", "-o", "-4", "addr", "show", "eth0"], capture_output=True, text=True).stdout
        buf = np.full(1 << 20, r, np.uint8)
        got = np.empty_like(buf)
        comm.Sendrecv(buf, (r + 1) % comm.size, recvbuf=got, source=(r - 1) % comm.size)
        out = comm.gather({"rank": r, "netns": os.path.realpath("/proc/self/ns/net"), "addr": addr,
                           "got": int(got[0])}, root=0)
        if r == 0:
            json.dump(out, open(sys.argv[1], "w"))
    """))
    P, res = 3, tmp_path / "out.json"
    with Testbed(EthernetSpec(**STAR), P) as tb:
        before = {(c["ns"], c["dev"]): c["bytes"] for c in tb.counters()}
        proc = subprocess.run([find_mpiexec(), "-n", str(P), *tb.wrap([sys.executable, str(script), str(res)])],
                              env={**os.environ, **tb.env}, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        after = tb.counters()
        ranks = json.loads(res.read_text())
        for r in ranks:
            assert tb.state["addresses"][r["rank"]] in r["addr"]     # its own host's eth0
            assert r["got"] == (r["rank"] - 1) % P                    # and the data arrived
        for c in after:   # each host sent and received 1 MiB through its shaped link
            moved = c["bytes"] - before[(c["ns"], c["dev"])]
            assert moved >= 1 << 20, c
            assert c["drops"] == 0


@pytest.mark.slow
@needs_testbed
@needs_mpi
@pytest.mark.mpi
def test_every_algorithm_on_the_testbed_is_correct_with_the_simulators_bytes():
    from simsparse.experiments.run.measure import measure_points
    from simsparse.experiments.run.runner import simulate_point

    P = 4
    points = []
    for name, cls in sorted(ALGORITHMS.items()):
        p = make_point(name, P, n=3000, density=0.02, iterations=1, warmup=0, seed=3)
        if not cls.check_setup(P, 3000, p.params_model()):
            points.append(p)
    t0 = time.time()
    with Testbed(EthernetSpec(**STAR), P) as tb:
        measured = measure_points(points, device="cpu", testbed=tb, timeout_s=120)
        moved = sum(c["bytes"] for c in tb.counters() if c["role"] == "host")
    assert len(measured) == len(points) >= 12
    for point, m in zip(points, measured):
        s = simulate_point(point)
        assert m.row["correct"] is True, point.algorithm
        assert m.row["network"] == tb.label
        assert m.row["start_late_s"] >= 0   # timed from a common start (the testbed's default)
        for col in ("bytes_total", "bytes_sent_max", "msgs_total"):
            assert m.row[col] == s.row[col], (point.algorithm, col)
    assert moved >= sum(m.row["bytes_total"] for m in measured)   # every payload byte crossed a host link
    assert time.time() - t0 < 300


def test_testbed_ranks_start_at_one_instant_unless_told_otherwise(monkeypatch):
    """The testbed times every rank from one common start, as the simulator's
    ranks start; SIMSPARSE_START in the environment still chooses."""
    from simsparse.testbed import rank_env

    monkeypatch.delenv("SIMSPARSE_START", raising=False)
    assert rank_env()["SIMSPARSE_START"] == "common"
    monkeypatch.setenv("SIMSPARSE_START", "barrier")
    assert rank_env()["SIMSPARSE_START"] == "barrier"


def test_cli_refuses_without_privileges_with_exit_2(monkeypatch, capsys, tmp_path):
    from simsparse import cli

    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(host, "_caps", lambda: 0)
    spec = tmp_path / "star.yaml"
    spec.write_text("\n".join(f"{k}: {v}" for k, v in STAR.items()) + "\nmodel: ethernet\n")
    for argv in (["testbed", "up", str(spec)], ["measure", "configs/validate_testbed.yaml", "--testbed", str(spec)],
                 ["calibrate", "--testbed", str(spec)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "needs root" in err and "Traceback" not in err, argv
    assert cli.main(["testbed", "up"]) == 2
    assert "needs SPEC" in capsys.readouterr().err


def test_cli_names_a_machine_it_cannot_build(capsys, tmp_path):
    from simsparse import cli

    spec = tmp_path / "loop.yaml"
    spec.write_text("\n".join(f"{k}: {v}" for k, v in {**TREE, "hosts_per_leaf": 4}.items()) + "\nmodel: ethernet\n")
    if reason is None:
        assert cli.main(["testbed", "up", str(spec), "-P", "8"]) == 2
        assert "loop-free tree" in capsys.readouterr().err
    with pytest.raises(PlanError, match="loop-free"):
        plan(EthernetSpec(**{**TREE, "hosts_per_leaf": 4}), 8)
