"""Processor sharing of a host's cores: closed forms for simultaneous and
staggered jobs, and work conservation."""
import pytest

from simsparse.compute.cores import SharedCores
from simsparse.engine import HeapEngine


def run_jobs(cores, jobs):
    """jobs: (start, work); returns each job's end time."""
    env = HeapEngine()
    pool = SharedCores(env, cores)
    ends = {}
    for i, (start, work) in enumerate(jobs):
        env.at(start, lambda i: pool.run(jobs[i][1], lambda k: ends.__setitem__(k, env.now), i), i)
    env.run()
    return [ends[i] for i in range(len(jobs))], pool


def one_message(spec, profile, M: int, **sim) -> tuple[dict, list]:
    """Rank 0 sends M bytes to rank 1 (``Simulator`` keywords ``sim``): when each rank's request
    ended, and each rank's CPU seconds."""
    import numpy as np

    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import ParametricDevice
    from simsparse.ops import Dense

    x = np.zeros(M // 4, np.float32)
    ends = {}

    def rank0(ctx):
        yield ctx.waitall([ctx.isend(1, Dense(x))])
        ends[0] = ctx.now()

    def rank1(ctx):
        yield ctx.waitall([ctx.irecv(0)])
        ends[1] = ctx.now()

    st = Simulator(spec.build(), ParametricDevice(profile), **sim).run([rank0, rank1])
    return ends, [b["cpu"] for b in st.busy]


def test_fewer_jobs_than_cores_run_at_full_speed():
    ends, _ = run_jobs(2, [(0.0, 1.0), (0.0, 2.0)])
    assert ends == pytest.approx([1.0, 2.0])


def test_eight_equal_jobs_on_two_cores_take_four_times_as_long():
    ends, pool = run_jobs(2, [(0.0, 0.5)] * 8)
    assert ends == pytest.approx([2.0] * 8)
    assert pool.busy_s == pytest.approx(4.0)


def test_staggered_jobs_are_re_rated_when_the_set_changes():
    # one core: job A (2 s of work) alone for 1 s, then shares with B (0.5 s of work):
    # both at 1/2 until B ends at 1 + 1 = 2 (A then has 0.5 left), A alone ends at 2.5
    ends, pool = run_jobs(1, [(0.0, 2.0), (1.0, 0.5)])
    assert ends == pytest.approx([2.5, 2.0])
    assert pool.busy_s == pytest.approx(2.5)   # work is conserved


def test_zero_work_ends_at_once():
    ends, _ = run_jobs(2, [(0.5, 0.0)])
    assert ends == [0.5]


def test_ranks_sharing_cores_stretch_their_kernels_in_the_simulator():
    """Eight ranks whose kernels run at once on two shared cores take four
    times as long as with a device each; the result rows say so in time and
    in device-busy time (which stays the kernels' own work)."""
    from tests.helpers import make_point
    from simsparse.experiments.run.runner import simulate_point

    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-3}
    own = simulate_point(make_point("ring", 8, n=8000, compute=prof, alpha=0.0, bw=1e15))
    shared = simulate_point(make_point("ring", 8, n=8000, compute={**prof, "shared_cores": 2}, alpha=0.0, bw=1e15))
    four = simulate_point(make_point("ring", 8, n=8000, compute={**prof, "shared_cores": 8}, alpha=0.0, bw=1e15))
    assert four.row["time_s"] == pytest.approx(own.row["time_s"], rel=1e-9)   # a core each: unchanged
    assert shared.row["time_s"] == pytest.approx(4 * own.row["time_s"], rel=1e-6)
    assert shared.row["t_compute_s"] == pytest.approx(own.row["t_compute_s"], rel=1e-9)
    assert shared.row["correct"] is True


def _exchange(m, reps):
    """Ranks r and r xor 1 exchange m bytes, reps times (a collective's step)."""
    from simsparse.calibration import patterns
    from simsparse.ops import Dense
    import numpy as np

    a = np.zeros(m // 4, np.float32)
    return lambda ctx: patterns.exchange(ctx, lambda: Dense(a), reps)


@pytest.mark.parametrize("P", [4, 8])
def test_requests_cost_cpu_on_shared_cores_beside_the_wire(P):
    """With message_cpu_s c, P ranks exchanging small messages on 2 cores are
    CPU-bound (2P requests of c over 2 cores: P c per exchange), large ones
    wire-bound (the CPU work overlaps the wire's); with a core per rank, or
    c = 0, nothing changes."""
    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import EthernetSpec

    c, B = 100e-6, 1.25e7
    spec = EthernetSpec(topology="star", link_bw_Bps=B)

    def time(m, reps=3, **prof):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, **prof))
        return max(Simulator(spec.build(), dev).run([_exchange(m, reps)] * P).finish_s) / reps

    assert time(4, shared_cores=2, message_cpu_s=c) == pytest.approx(P * c, rel=1e-6)
    assert time(4) == pytest.approx(4 / B, rel=1e-6)                     # no cores shared: the wire alone
    assert time(4, shared_cores=P, message_cpu_s=c) == pytest.approx(2 * c, rel=1e-6)   # a core each
    big = 1 << 16
    assert time(big, shared_cores=2, message_cpu_s=c) == pytest.approx(big / B, rel=1e-6)


@pytest.mark.parametrize("P", [4, 8])
def test_a_runs_start_costs_cpu_on_shared_cores_once(P):
    """start_cpu_s s: every rank runs s core-seconds before its program, on
    its share of the cores (P s / 2 on 2 cores), once per run: an exchange of
    n steps takes P s / 2 + n P c, whatever n; without shared cores nothing."""
    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import EthernetSpec

    c, s = 100e-6, 300e-6
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e7)

    def span(reps, **prof):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, **prof))
        return max(Simulator(spec.build(), dev).run([_exchange(4, reps)] * P).finish_s)

    for reps in (3, 24):
        assert span(reps, shared_cores=2, message_cpu_s=c, start_cpu_s=s) == \
            pytest.approx(P * s / 2 + reps * P * c, rel=1e-6)
    assert span(3, start_cpu_s=s) == pytest.approx(span(3), rel=1e-12)


def test_the_programs_own_cpu_is_charged_before_every_kernel():
    """program_cpu_s c: each kernel call of a rank costs c more core-seconds
    (the real driver's step and the program's Python before it); a ring of
    P = 4 calls 7 kernels per rank (a copy, 3 sums, 3 copies); on 2 shared
    cores the 4 ranks' kernels take twice as long; without shared_cores
    nothing is charged."""
    from tests.helpers import make_point
    from simsparse.experiments.run.runner import simulate_point

    c = 1e-3
    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e15, "launch_s": 0.0}

    def t(**extra):
        return simulate_point(make_point("ring", 4, n=8000, compute={**prof, **extra}, alpha=0.0, bw=1e15)).row["time_s"]

    base = t(shared_cores=4)
    assert t(shared_cores=4, program_cpu_s=c) == pytest.approx(base + 7 * c, rel=1e-6)
    assert t(shared_cores=2, program_cpu_s=c) == pytest.approx(2 * (base + 7 * c), rel=1e-6)
    assert t(program_cpu_s=c) == pytest.approx(t(), rel=1e-12)


def test_the_programs_own_cpu_stays_outside_the_kernels_records():
    """The real backend's trace times a kernel alone, and its device-busy time
    is the kernels': in the simulator program_cpu_s runs on the cores before
    each kernel, but neither a kernel's record nor ``t_compute_s`` holds it;
    ``cpu_s`` (every core-second charged) does, 7 kernels' worth."""
    from tests.helpers import make_point
    from simsparse.experiments.run.runner import simulate_point

    c = 1e-3
    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-4, "shared_cores": 4}

    def run(**extra):
        return simulate_point(make_point("ring", 4, n=8000, compute={**prof, **extra}, alpha=0.0, bw=1e15),
                              trace=True)

    with_c, without = run(program_cpu_s=c), run()

    def kernel_s(o):
        return sorted(t["end_s"] - t["start_s"] for t in o.trace if t["op"].startswith("compute:"))

    assert kernel_s(with_c) == pytest.approx(kernel_s(without), rel=1e-9)
    assert with_c.row["t_compute_s"] == pytest.approx(without.row["t_compute_s"], rel=1e-9)
    assert with_c.row["cpu_s"] == pytest.approx(without.row["cpu_s"] + 7 * c, rel=1e-9)


def bound_ends(binding, P, cores, busy):
    """Ranks ``busy`` each run 1 s of work at 0 on ``cores`` cores bound as ``binding``; their ends."""
    from simsparse.compute.cores import core_pools

    env = HeapEngine()
    pools = core_pools(env, cores, P, binding)
    ends = {}
    for r in busy:
        env.at(0.0, lambda r: pools[r].run(1.0, lambda k: ends.__setitem__(k, env.now), r), r)
    env.run()
    return [ends[r] for r in busy]


def test_ranks_bound_in_blocks_share_only_their_own_core():
    # P = 4 on 2 cores: ranks 0, 1 on core 0 and 2, 3 on core 1
    assert bound_ends("block", 4, 2, [0, 1]) == pytest.approx([2.0, 2.0])   # one core for both
    assert bound_ends("none", 4, 2, [0, 1]) == pytest.approx([1.0, 1.0])    # one pool: a core each
    assert bound_ends("block", 4, 2, [0, 2]) == pytest.approx([1.0, 1.0])
    assert bound_ends("block", 4, 2, [0, 1, 2, 3]) == pytest.approx(bound_ends("none", 4, 2, [0, 1, 2, 3]))
    assert bound_ends("block", 8, 2, [0, 1, 2, 3, 4]) == pytest.approx([4.0] * 4 + [1.0])
    assert bound_ends("block", 2, 4, [0, 1]) == pytest.approx([1.0, 1.0])   # fewer ranks than cores


def test_binding_needs_whole_cores_and_a_known_name():
    from pydantic import ValidationError

    from simsparse.compute.cores import core_pools
    from simsparse.compute.devices import DeviceProfile

    with pytest.raises(ValidationError, match="whole number"):
        DeviceProfile(mem_bandwidth_Bps=1e9, shared_cores=1.5, core_binding="block")
    with pytest.raises(ValueError, match="must be one of"):
        core_pools(HeapEngine(), 2, 4, "scatter")


def test_bound_ranks_in_the_simulator():
    """A gather's root reduces alone: bound or not, the same time when every
    rank works at once (an allreduce's kernels), and never faster bound."""
    from tests.helpers import make_point
    from simsparse.experiments.run.runner import simulate_point

    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-3, "shared_cores": 2}
    pool = simulate_point(make_point("ring", 4, n=8000, compute=prof, alpha=0.0, bw=1e15))
    bound = simulate_point(make_point("ring", 4, n=8000, compute={**prof, "core_binding": "block"},
                                      alpha=0.0, bw=1e15))
    assert bound.row["time_s"] == pytest.approx(pool.row["time_s"], rel=1e-9)
    gt_pool = simulate_point(make_point("gtopk", 4, n=8000, compute=prof, alpha=0.0, bw=1e15))
    gt_bound = simulate_point(make_point("gtopk", 4, n=8000, compute={**prof, "core_binding": "block"},
                                         alpha=0.0, bw=1e15))
    assert gt_bound.row["time_s"] >= gt_pool.row["time_s"] * (1 - 1e-9)
    assert gt_bound.row["correct"] is True


@pytest.mark.parametrize("P", [4, 8])
def test_a_wake_up_costs_its_rank_cpu_once_per_blocking_wait(P):
    """wait_cpu_s w: a rank whose wait blocked spends w core-seconds waking
    before its program goes on, however many requests the wait completes: n
    exchange steps of P ranks on 2 cores take n P (2c + w) / 2; an
    all-to-all step (2(P - 1) requests) n P (2(P - 1) c + w) / 2; without
    shared cores nothing."""
    from simsparse.backends.events.sim import Simulator
    from simsparse.calibration import patterns
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import EthernetSpec
    from simsparse.ops import Dense

    c, w, n = 20e-6, 150e-6, 6
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)
    one = __import__("numpy").zeros(1, "float32")

    def span(pattern, **prof):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, **prof))
        progs = [lambda ctx: pattern(ctx, lambda: Dense(one), n)] * P
        return max(Simulator(spec.build(), dev).run(progs).finish_s)

    kw = dict(shared_cores=2, message_cpu_s=c, wait_cpu_s=w)
    assert span(patterns.exchange, **kw) == pytest.approx(n * P * (2 * c + w) / 2, rel=0.02)
    assert span(patterns.alltoall, **kw) == pytest.approx(n * P * (2 * (P - 1) * c + w) / 2, rel=0.02)
    assert span(patterns.exchange, wait_cpu_s=w) == pytest.approx(span(patterns.exchange), rel=1e-12)


def test_the_cpu_a_rank_is_charged_is_reported_per_iteration():
    """``cpu_s`` is the mean over ranks of the core-seconds the model charged
    a rank in an iteration: a run's start, its requests, its wake-ups and its
    kernels; P ranks of an exchange of n steps on 2 cores are charged
    s + n (2c + w) each, so (the exchange being CPU-bound) P cpu_s / 2 is
    the span. Without shared cores the model charges no CPU: no ``cpu_s``."""
    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.experiments.run.loop import _collective_breakdown
    from simsparse.network.spec import EthernetSpec

    c, w, s, n, P = 20e-6, 150e-6, 300e-6, 6, 8
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)

    def stats(**prof):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, **prof))
        return Simulator(spec.build(), dev).run([_exchange(4, n)] * P)

    st = stats(shared_cores=2, message_cpu_s=c, wait_cpu_s=w, start_cpu_s=s)
    cpu = _collective_breakdown(st.finish_s, st.busy)["cpu_s"]
    assert cpu == pytest.approx(s + n * (2 * c + w), rel=0.02)
    assert max(st.finish_s) == pytest.approx(P * cpu / 2, rel=0.02)
    plain = stats()
    assert "cpu_s" not in _collective_breakdown(plain.finish_s, plain.busy)
    # a host running at 1/k of its calibrated speed (DeviceProfile.slowdown) charges k times every core-second
    k = 1.4
    slow = stats(shared_cores=2, message_cpu_s=c, wait_cpu_s=w, start_cpu_s=s, slowdown=k)
    assert _collective_breakdown(slow.finish_s, slow.busy)["cpu_s"] == pytest.approx(k * cpu, rel=1e-9)
    assert max(slow.finish_s) == pytest.approx(k * max(st.finish_s), rel=0.02)
    # cpu_slowdown, where given, is what the ranks' CPU takes; the kernels keep slowdown
    split = stats(shared_cores=2, message_cpu_s=c, wait_cpu_s=w, start_cpu_s=s, slowdown=2.0, cpu_slowdown=k)
    assert _collective_breakdown(split.finish_s, split.busy)["cpu_s"] == pytest.approx(k * cpu, rel=1e-9)


def test_a_rank_blocked_past_the_backoff_polls_and_takes_cpu_from_its_core_mate():
    """wait_poll_s q after wait_poll_after_s a: a rank blocked in a wait wakes at a, a + q, ... and
    spends wait_cpu_s w each time, as the real backend's SocketSleep does on a testbed. Rank 1 waits
    for rank 0, whose kernel of D seconds shares their one core: the kernel ends after D plus every
    poll begun before its end (processor sharing conserves work), and rank 1 is charged those polls
    beside its wake-up. Without wait_poll_s (or waits shorter than a) nothing changes."""
    import numpy as np

    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import EthernetSpec
    from simsparse.ops import Dense

    D, w, q, a = 0.05, 100e-6, 2e-3, 3.45e-3
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)
    x = np.zeros(4, np.float32)

    def rank0(ctx):
        yield ctx.compute("add", x, x)
        yield ctx.waitall([ctx.isend(1, Dense(x))])

    def rank1(ctx):
        yield ctx.waitall([ctx.irecv(0)])

    def run(**prof):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=1, wait_cpu_s=w,
                                             kernels={"add": {"launch_s": D, "per_elem_s": 0.0}}, **prof))
        st = Simulator(spec.build(), dev).run([rank0, rank1])
        return st.finish_s, [b["cpu"] for b in st.busy]

    (f0, _), cpu0 = run()
    (f1, _), cpu1 = run(wait_poll_s=q, wait_poll_after_s=a)
    end = D
    while True:   # the polls begun before the kernel's end, which each of them moves on by w
        polls = int(np.floor((end - a) / q)) + 1
        if D + polls * w <= end:
            break
        end = D + polls * w
    assert f1 - f0 == pytest.approx(polls * w, rel=1e-6) and polls == 25
    assert cpu1[1] - cpu0[1] == pytest.approx(polls * w, rel=1e-9) and cpu1[0] == cpu0[0]
    (g0, _), _ = run(wait_poll_s=q, wait_poll_after_s=1.0)   # the wait ends before the first poll
    assert g0 == pytest.approx(f0, rel=1e-12)


def test_a_message_record_ends_when_its_ranks_driver_learns_of_it():
    """With shared cores the real backend's trace ends a message where its rank's one thread runs MPI's
    progress after the completion, and the simulator's records end there too: a send that completes
    during its rank's own kernel ends with the kernel (D); one whose wait completes while the core-mate
    computes ends once the rank has woken (its wait_cpu_s w at half the core: 2 w after the wire). The
    times of the run do not move."""
    import numpy as np

    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import EthernetSpec
    from simsparse.ops import Dense

    D, w = 0.05, 1e-3
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)
    x = np.zeros(4, np.float32)

    def sends_during_kernel(ctx):   # rank 0
        h = ctx.isend(1, Dense(x))
        yield ctx.compute("add", x, x)
        yield ctx.waitall([h])

    def sends_then_waits(ctx):      # rank 0
        yield ctx.waitall([ctx.isend(1, Dense(x))])

    def computes_then_receives(ctx):   # rank 1
        yield ctx.compute("add", x, x)
        yield ctx.waitall([ctx.irecv(0)])

    def run(rank0, cores, trace=True, wait=w):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=cores, wait_cpu_s=wait,
                                             kernels={"add": {"launch_s": D, "per_elem_s": 0.0}}))
        st = Simulator(spec.build(), dev, trace=trace).run([rank0, computes_then_receives])
        send = next(t for t in st.trace if t.rank == 0 and t.op == "send") if trace else None
        return send, st.finish_s

    send, _ = run(sends_during_kernel, 2)
    assert send.end_s == pytest.approx(D, rel=1e-9)
    woken, finish = run(sends_then_waits, 1)
    wire, _ = run(sends_then_waits, 1, wait=0.0)
    assert wire.end_s < 1e-5
    assert woken.end_s - wire.end_s == pytest.approx(2 * w, rel=1e-6)
    assert run(sends_then_waits, 1, trace=False)[1] == finish


def test_the_network_stack_takes_cpu_from_the_senders_cores_as_the_bytes_move():
    """network_stack c per byte at pace r: a message of M bytes costs its sender's cores M c core-seconds in
    pieces while it moves (M / r), outside any rank's cpu_s. Rank 0 sends M bytes while rank 1, on the same
    processor-shared core, runs a kernel of D: the core never idles, so the kernel ends at D + M c. Without
    the profile's network_stack, or without shared cores, nothing changes."""
    import numpy as np

    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, ParametricDevice
    from simsparse.network.spec import EthernetSpec
    from simsparse.ops import Dense

    D, M, c, r = 0.05, 1 << 20, 1e-8, 1e9
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)
    x = np.zeros(M // 4, np.float32)
    ends = {}

    def rank0(ctx):
        yield ctx.waitall([ctx.isend(1, Dense(x))])

    def rank1(ctx):
        yield ctx.compute("add", x[:4], x[:4])
        ends["kernel"] = ctx.now()
        yield ctx.waitall([ctx.irecv(0)])

    def run(cores=1, **prof):
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=cores,
                                             kernels={"add": {"launch_s": D, "per_elem_s": 0.0}}, **prof))
        st = Simulator(spec.build(), dev, eager_threshold_B=M).run([rank0, rank1])   # it moves at once
        return ends["kernel"], [b["cpu"] for b in st.busy]

    k0, cpu0 = run()
    k1, cpu1 = run(network_stack={"cpu_per_byte_s": c, "rate_Bps": r})
    assert k0 == pytest.approx(D, rel=1e-12)
    assert k1 == pytest.approx(D + M * c, rel=1e-9)   # every piece began by M / r = 1 ms, before the kernel's end
    assert cpu1 == cpu0                               # no rank's CPU clock counts the kernel's packet work
    k2, _ = run(cores=2, network_stack={"cpu_per_byte_s": c, "rate_Bps": r})
    assert k2 == pytest.approx(D, rel=1e-12)          # a second core takes it



def test_a_message_ends_once_its_ends_tcp_calls_have_run():
    """network_stack send_cpu_per_byte_s and recv_cpu_per_byte_s: the kernel's TCP work inside each end's
    own calls, M c core-seconds a side in pieces while the message moves, on that rank's cores and in its
    cpu_s; the send and the receive end only once their side has run. Rank 0 sends M bytes to rank 1 on a
    fast link (M / bandwidth: 0.84 ms): on one shared core both sides' 2 M c must run first, on two each
    side takes its own core (M c), and without them the wire decides."""
    from simsparse.compute.devices import DeviceProfile
    from simsparse.network.spec import EthernetSpec

    M, c, r = 1 << 20, 1e-8, 1e12
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)

    def run(cores, **calls):
        stack = {"cpu_per_byte_s": 1e-15, "rate_Bps": r, **calls}
        prof = DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=cores, kernels={}, network_stack=stack)
        return one_message(spec, prof, M, eager_threshold_B=M)   # it moves at once

    wire, cpu0 = run(1)
    assert wire[0] == pytest.approx(wire[1]) and wire[1] < 1e-3
    one, cpu1 = run(1, send_cpu_per_byte_s=c, recv_cpu_per_byte_s=c)
    assert one[0] == pytest.approx(2 * M * c, rel=1e-3) and one[1] == pytest.approx(2 * M * c, rel=1e-3)
    assert cpu1[0] - cpu0[0] == pytest.approx(M * c) and cpu1[1] - cpu0[1] == pytest.approx(M * c)
    two, _ = run(2, send_cpu_per_byte_s=c, recv_cpu_per_byte_s=c)
    assert two[0] == pytest.approx(M * c, rel=1e-3) and two[1] == pytest.approx(M * c, rel=1e-3)
    only_send, _ = run(2, send_cpu_per_byte_s=c)
    assert only_send[0] == pytest.approx(M * c, rel=1e-3) and only_send[1] == pytest.approx(wire[1])


def test_the_bytes_a_shaped_link_lets_pass_at_once_are_carried_at_once():
    """On a shaped link (a token bucket of b payload bytes, the testbed's tbf) a message's first b bytes leave
    at once: their TCP work in each end's calls is due at once too, not at the stack's pace. A message of
    16 KB within the bucket at a pace of 12.4 MB/s ends in its CPU, not at 0.65 ms (its one piece half-way
    through at the pace); the rest of a larger message stays paced."""
    from simsparse.backends.events.cpu import _pieces
    from simsparse.compute.devices import DeviceProfile
    from simsparse.network.spec import EthernetSpec

    assert _pieces(20_000, 0.1, 1e6) == ([0.1 + 10_000 / 1e6], 20_000)
    assert _pieces(20_000, 0.1, 1e6, burst=18_000) == ([0.1], 20_000)
    due, piece = _pieces(1 << 20, 0.0, 1e6, burst=1 << 18)
    assert piece == 1 << 16 and due[:3] == [0.0] * 3 and due[-1] == pytest.approx(((1 << 20) - (1 << 15) - (1 << 18)) / 1e6)

    M, r, c = 16_000, 12.4e6, 1e-9

    def run(burst):
        spec = EthernetSpec(topology="star", link_bw_Bps=1.25e7, mtu_B=9000, shaper_burst_B=burst)
        stack = {"cpu_per_byte_s": 1e-15, "rate_Bps": r, "send_cpu_per_byte_s": c, "recv_cpu_per_byte_s": c}
        prof = DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=2, kernels={}, network_stack=stack)
        return one_message(spec, prof, M)[0]

    shaped = run(18_076)
    assert shaped[0] == pytest.approx(M * c, rel=1e-3) and shaped[1] == pytest.approx(M * c, rel=1e-3)
    wire = run(0)   # no bucket: the wire takes M / B and the TCP work is paced through it
    assert wire[1] == pytest.approx(M / (1.25e7 * EthernetSpec(mtu_B=9000).payload_efficiency()), rel=0.01)


def test_a_kernel_right_after_a_long_wait_or_the_start_pays_its_idle_excess():
    """idle_excess (calibrate's idle_grid): a kernel run as its rank wakes
    from idling takes its line plus what the idle added there, linear in log
    idle and log size; nothing below the shortest idle. In the simulator the
    idle is the rank's last polled wait (rank 1 waits for rank 0's kernel of
    D seconds, then adds: on two cores its add pays the excess at D), or the
    run's start (``start_idle_s``, with shared cores: the first kernel of
    each rank); without either it pays its line."""
    import numpy as np

    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, KernelCost, ParametricDevice
    from simsparse.compute.kernels import Work
    from simsparse.network.spec import EthernetSpec
    from simsparse.ops import Dense

    rows = [[1e-3, [[1e4, 2e-6], [1e6, 4e-4]]], [1e-2, [[1e4, 8e-6], [1e6, 1e-3]]]]
    kc = KernelCost(launch_s=1e-6, per_elem_s=1e-10, idle_excess=rows)
    assert kc.idle_extra(1e5, 5e-4) == 0.0
    assert kc.idle_extra(1e4, 1e-3) == pytest.approx(2e-6) and kc.idle_extra(1e6, 0.5) == pytest.approx(1e-3)
    assert kc.idle_extra(1e5, 1e-3) == pytest.approx((2e-6 + 4e-4) / 2)   # linear in log size
    assert kc.idle_extra(2e6, 1e-2) == pytest.approx(1e-3)   # the largest size's beyond it
    assert kc.idle_extra(1e3, 1e-3) == pytest.approx(2e-7)   # in proportion below the smallest
    mid = kc.idle_extra(1e4, np.sqrt(1e-3 * 1e-2))
    assert mid == pytest.approx((2e-6 + 8e-6) / 2)   # linear in log idle
    prof = DeviceProfile(mem_bandwidth_Bps=1e12, kernels={"add_into": kc})
    line = ParametricDevice(prof).cost("add_into", Work(1e4, 1.2e5))
    assert line == pytest.approx(2e-6) and ParametricDevice(prof).cost("add_into", Work(1e4, 1.2e5), 1e-2) == \
        pytest.approx(2e-6 + 8e-6)

    D, n = 0.02, 10_000
    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)
    x, acc = np.zeros(4, np.float32), np.zeros(n, np.float32)

    def rank0(ctx):
        yield ctx.compute("add", x, x)
        yield ctx.waitall([ctx.isend(1, Dense(x))])

    def rank1(ctx):
        yield ctx.waitall([ctx.irecv(0)])
        yield ctx.compute("add_into", acc, acc)

    def first(ctx):
        yield ctx.compute("add_into", acc, acc)
        yield ctx.compute("add_into", acc, acc)

    def add_times(programs, excess, **prof):
        kernels = {"add": {"launch_s": D, "per_elem_s": 0.0},
                   "add_into": {"launch_s": 1e-6, "per_elem_s": 1e-10, "idle_excess": excess}}
        dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, kernels=kernels, **prof))
        st = Simulator(spec.build(), dev, trace=True).run(programs)
        return [t.end_s - t.start_s for t in st.trace if t.rank == 1 and t.op == "compute:add_into"]

    cores = {"shared_cores": 2, "wait_cpu_s": 1e-6}
    polled = {**cores, "wait_poll_s": 2e-3, "wait_poll_after_s": 3.45e-3}
    assert add_times([rank0, rank1], rows, **polled) == pytest.approx([2e-6 + 8e-6], rel=1e-6)   # idled about D
    assert add_times([rank0, rank1], None, **polled) == pytest.approx([2e-6], rel=1e-6)      # no excess: the line
    assert add_times([rank0, rank1], rows, **cores) == pytest.approx([2e-6], rel=1e-6)       # no polled wait
    # the run's start: the first kernel of each rank pays the excess at start_idle_s, the next its line
    assert add_times([first, first], rows, start_idle_s=1e-2, **cores) == pytest.approx([1e-5, 2e-6], rel=1e-6)
    assert add_times([first, first], rows, start_idle_s=1e-2) == pytest.approx([2e-6, 2e-6], rel=1e-6)   # own cores


def test_a_call_right_after_a_call_of_the_same_kernel_takes_its_back_to_back_factor():
    """back_to_back_scale (calibrate: an algorithm run's back-to-back calls
    over its first ones): a kernel called again by its rank with no message,
    wait or layer between takes its line times the factor at its size
    (interpolated in log size as size_scale); after a message, another
    kernel or a wait it takes its line. The bulk and round evaluators
    decline such a profile."""
    import numpy as np

    from simsparse.backends.evaluators import Situation
    from simsparse.backends.events.sim import Simulator
    from simsparse.compute.devices import DeviceProfile, KernelCost, ParametricDevice
    from simsparse.compute.kernels import Work
    from simsparse.network.spec import EthernetSpec
    from simsparse.ops import Dense

    kc = KernelCost(launch_s=1e-6, per_elem_s=1e-9, back_to_back_scale=[[1000, 0.25], [100_000, 0.5]])
    assert kc.back_to_back(10_000) == pytest.approx(0.375) and kc.back_to_back(10) == 0.25
    dev = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, kernels={"count_above": kc}))
    line = dev.cost("count_above", Work(1000, 4000))
    assert line == pytest.approx(2e-6) and dev.cost("count_above", Work(1000, 4000), back_to_back=True) == \
        pytest.approx(0.5e-6)

    x = np.ones(1000, np.float32)

    def rank0(ctx):
        yield ctx.compute("count_above", x, 0.5)
        yield ctx.compute("count_above", x, 0.5)   # back to back
        yield ctx.compute("count_above", x, 0.5)   # again
        h = ctx.isend(1, Dense(x[:4]))
        yield ctx.compute("count_above", x, 0.5)   # a message between: its line
        yield ctx.compute("copy", x)
        yield ctx.compute("count_above", x, 0.5)   # another kernel between
        yield ctx.waitall([h])
        yield ctx.compute("count_above", x, 0.5)   # a wait between

    def rank1(ctx):
        yield ctx.waitall([ctx.irecv(0)])

    spec = EthernetSpec(topology="star", link_bw_Bps=1.25e9)
    st = Simulator(spec.build(), dev, trace=True).run([rank0, rank1])
    got = [t.end_s - t.start_s for t in st.trace if t.rank == 0 and t.op == "compute:count_above"]
    assert got == pytest.approx([line, line / 4, line / 4, line, line, line], rel=1e-9)
    why = Situation(P=2, kernel_history=True).gathers()
    assert why and "back_to_back_scale" in why
