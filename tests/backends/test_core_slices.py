"""Cores under round robin with the scheduler's time slice
(``compute.cores.SlicedCores``): closed forms, a rank that keeps its core
while it does not block, work conservation, and the simulator with a slice."""
import pytest
from hypothesis import given, settings, strategies as st

from simsparse.compute.cores import SharedCores, SlicedCores, core_pools
from simsparse.engine import HeapEngine


def run_jobs(cores, q, jobs):
    """jobs: (start, work, owner); returns each job's end time and the pool."""
    env = HeapEngine()
    pool = SlicedCores(env, cores, q)
    ends = {}
    for i, (start, work, owner) in enumerate(jobs):
        env.at(start, lambda i: pool.run(jobs[i][1], lambda k: ends.__setitem__(k, env.now), i, jobs[i][2]), i)
    env.run()
    return [ends[i] for i in range(len(jobs))], pool


def test_jobs_shorter_than_the_slice_run_one_after_another_at_full_speed():
    # four ranks on one core, 0.2 ms each, slice 1.5 ms: first come, first served
    ends, pool = run_jobs(1, 1.5e-3, [(0.0, 2e-4, r) for r in range(4)])
    assert ends == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4])
    assert pool.busy_s == pytest.approx(8e-4)
    assert pool.taken == 0 and not pool.queue and not pool.held


def test_long_jobs_take_turns_slice_by_slice():
    # A and B of 3 ms each, slice 1 ms: A 0-1, B 1-2, A 2-3, B 3-4, A 4-5 (ends), B 5-6 (ends)
    ends, pool = run_jobs(1, 1e-3, [(0.0, 3e-3, "a"), (0.0, 3e-3, "b")])
    assert ends == pytest.approx([5e-3, 6e-3])
    assert pool.busy_s == pytest.approx(6e-3)


def test_two_cores_serve_the_queue_in_order():
    ends, _ = run_jobs(2, 1.0, [(0.0, 0.5, r) for r in range(4)])
    assert ends == pytest.approx([0.5, 0.5, 1.0, 1.0])


def test_a_batch_takes_as_long_as_under_processor_sharing():
    """Work is conserved: the last of eight equal jobs on two cores ends
    when processor sharing ends them all (4 x the work)."""
    ends, pool = run_jobs(2, 3e-4, [(0.0, 1e-3, r) for r in range(8)])
    assert max(ends) == pytest.approx(4e-3)
    assert min(ends) < 4e-3   # but not all at once
    assert pool.busy_s == pytest.approx(8e-3)


def test_a_rank_that_goes_on_at_once_keeps_its_core_for_the_rest_of_its_slice():
    """Rank a's first piece ends at 1 ms and it issues its next piece at
    that instant (it did not block): it goes on before b, which has waited
    since 0. Once its slice is used up (2 ms), b gets the core."""
    env = HeapEngine()
    pool = SlicedCores(env, 1, 2e-3)
    ends = {}

    def a_next(_):
        ends["a1"] = env.now
        pool.run(1.5e-3, lambda _: ends.__setitem__("a2", env.now), None, "a")

    pool.run(1e-3, a_next, None, "a")
    pool.run(5e-4, lambda _: ends.__setitem__("b", env.now), None, "b")
    env.run()
    # a: 0-1 ms, then 1-2 ms (the rest of its slice), b 2-2.5 ms, a's last 0.5 ms 2.5-3 ms
    assert ends == pytest.approx({"a1": 1e-3, "b": 2.5e-3, "a2": 3e-3})


def test_a_rank_that_blocks_gives_its_core_to_the_next_and_takes_it_back_when_it_wakes():
    """Rank a issues its next piece later (it waited for a message): b gets
    the core at once; when a wakes, it preempts b, which goes on after it."""
    env = HeapEngine()
    pool = SlicedCores(env, 1, 2e-3)
    ends = {}

    def a_next(_):
        env.at(1e-4, lambda _: pool.run(5e-4, lambda _: ends.__setitem__("a2", env.now), None, "a"))

    pool.run(1e-3, a_next, None, "a")
    pool.run(5e-4, lambda _: ends.__setitem__("b", env.now), None, "b")
    env.run()
    # a 0-1 ms, b from 1 ms, a2 preempts it at 1.1 ms and ends at 1.6, b's last 0.4 ms 1.6-2.0
    assert ends == pytest.approx({"a2": 1.6e-3, "b": 2e-3})


@pytest.mark.parametrize("wake_s, b_work, a2_end, b_end", [
    (1.2e-3, 5e-4, 1.8e-3, 1.5e-3),     # b took the core 0.2 ms ago: protected, a runs when b is done
    (3.0e-3, 2.3e-3, 3.3e-3, 3.6e-3),   # b has run 2 ms, past its protection: a preempts it
])
def test_a_rank_that_just_took_its_core_is_protected_from_a_waking_one(wake_s, b_work, a2_end, b_end):
    """EEVDF's RUN_TO_PARITY: a woken rank preempts only a rank that has run
    at least the protection since it took its core; else it runs next."""
    env = HeapEngine()
    pool = SlicedCores(env, 1, 4e-3, protect_s=1.5e-3)
    ends = {}

    def a_next(_):
        env.at(wake_s - 1e-3, lambda _: pool.run(3e-4, lambda _: ends.__setitem__("a2", env.now), None, "a"))

    pool.run(1e-3, a_next, None, "a")
    pool.run(b_work, lambda _: ends.__setitem__("b", env.now), None, "b")
    env.run()
    assert ends == pytest.approx({"a2": a2_end, "b": b_end})


def test_ranks_that_start_together_still_queue_in_order_under_protection():
    env = HeapEngine()
    pool = SlicedCores(env, 1, 4e-3, protect_s=1.5e-3)
    ends = {}
    for r in range(4):
        pool.run(2e-4, lambda r: ends.__setitem__(r, env.now), r, r)
    env.run()
    assert [ends[r] for r in range(4)] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4])


def test_the_protection_is_the_kernels_base_slice_scaled_by_cpus():
    from simsparse.compute.cores import protection
    assert [protection(c) for c in (1, 2, 4, 8, 64)] == pytest.approx([0.75e-3, 1.5e-3, 2.25e-3, 3e-3, 3e-3])
    env = HeapEngine()
    assert core_pools(env, 2, 8, "block", 4e-3)[0].protect == pytest.approx(1.5e-3)
    assert core_pools(env, 2, 8, "block", 1e-3)[0].protect == pytest.approx(1e-3)   # never past the slice


def test_a_woken_rank_preempts_the_one_that_has_run_longest():
    """Two cores: x since 0, y since 0.5 ms; z wakes at 1 ms and takes x's
    core; x goes on when the first core is free (z's, at 2 ms)."""
    env = HeapEngine()
    pool = SlicedCores(env, 2, 1.0)
    ends = {}

    def job(name, work):
        return lambda _: pool.run(work, lambda _: ends.__setitem__(name, env.now), None, name)

    env.at(0.0, job("x", 3e-3))
    env.at(5e-4, job("y", 2e-3))
    env.at(1e-3, job("z", 1e-3))
    env.run()
    # z 1-2 ms on x's core; y ends at 2.5; x ran 1 ms, has 2 ms left: from 2 ms (z's core) to 4 ms
    assert ends == pytest.approx({"z": 2e-3, "y": 2.5e-3, "x": 4e-3})
    assert pool.busy_s == pytest.approx(6e-3)


def test_slices_need_whole_cores():
    from simsparse.compute.devices import DeviceProfile

    with pytest.raises(ValueError, match="whole number"):
        SlicedCores(HeapEngine(), 1.5, 1e-3)
    with pytest.raises(ValueError, match="core_slice_s"):
        DeviceProfile(mem_bandwidth_Bps=1e9, shared_cores=1.5, core_slice_s=1e-3)
    env = HeapEngine()
    assert type(core_pools(env, 2, 8, "block", 1e-3)[0]) is SlicedCores
    assert type(core_pools(env, 2, 8, "block")[0]) is SharedCores


def test_ranks_with_slices_finish_short_kernels_unstretched_in_the_simulator():
    """Eight ranks on two cores (bound in blocks): under processor sharing
    every kernel's record is 4x its work; with a slice longer than the
    kernels each record is the kernel's own time and the iteration is no
    longer than under sharing (ranks that finish first send first)."""
    from tests.helpers import make_point
    from simsparse.experiments.run.runner import simulate_point

    # (the program's own Python before each kernel: the kernel then starts on the core its rank has, as measured)
    prof = {"name": "cpu", "mem_bandwidth_Bps": 1e9, "launch_s": 1e-4, "shared_cores": 2, "core_binding": "block",
            "program_cpu_s": 2e-5}
    args = dict(n=8000, alpha=1e-5, bw=1e9)
    ps = simulate_point(make_point("topka", 8, compute=prof, **args), trace=True)
    rr = simulate_point(make_point("topka", 8, compute={**prof, "core_slice_s": 1e-2}, **args), trace=True)
    assert rr.row["correct"] is True
    assert rr.row["time_s"] <= ps.row["time_s"] * (1 + 1e-9)
    assert rr.row["cpu_s"] == pytest.approx(ps.row["cpu_s"], rel=1e-9)   # the same work is charged

    def kernel_s(out):
        return [r["end_s"] - r["start_s"] for r in out.trace if r["peer"] == -1 and r["op"].startswith("compute:")]

    own, stretched = kernel_s(rr), kernel_s(ps)
    assert own and max(own) < min(stretched)


def test_a_slice_ends_where_another_task_runs_not_at_an_interrupt():
    """Two tasks take 4 ms turns; an interrupt stops the first for 0.2 ms
    inside its second turn and the hypervisor for 3 ms inside its third.
    Each turn is still one slice of 4 ms of running (splitting at every gap
    gave 1 and 3 ms pieces)."""
    from simsparse.calibration.slice_probe import slices

    ms = 1e-3
    a = [(0, 4 * ms), (8 * ms, 9 * ms), (9.2 * ms, 12.2 * ms), (16.2 * ms, 18.2 * ms), (21.2 * ms, 23.2 * ms),
         (27.2 * ms, 31.2 * ms)]
    b = [(4 * ms, 8 * ms), (12.2 * ms, 16.2 * ms), (23.2 * ms, 27.2 * ms), (31.2 * ms, 35.2 * ms)]
    got = slices([a, b])   # first and last turn of each task left out
    assert got == pytest.approx([4 * ms] * 4)


def test_the_calibration_measures_the_slice_and_the_profile_carries_it():
    """``calibrate`` times the runs spinning processes get on one core (here
    the tick ends them: about 4 ms at HZ = 250); the profile's compute takes
    the median as ``core_slice_s`` and keeps the quantiles in its fits."""
    from simsparse.calibration import build_profile
    from simsparse.calibration.slice_probe import time_slice
    from tests.backends.test_calibration import synthetic_raw

    got = time_slice(2, seconds=0.3)
    if got is None:
        pytest.skip("processes cannot be bound to a core here")
    assert 1e-4 < got["p10_s"] <= got["median_s"] <= got["p90_s"] < 0.1 and got["runs"] >= 8
    raw = {**synthetic_raw(), "shared_cores": 2, "core_slice": got}
    prof = build_profile(raw, 8, "cpu", "test")
    assert prof["compute"]["core_slice_s"] == got["median_s"] and prof["fits"]["core_slice"] == got
    assert "core_slice_s" not in build_profile(synthetic_raw(), 2, "cpu", "test")["compute"]


def test_a_job_queued_behind_protected_ranks_is_not_lost_when_its_rank_ends_another_meanwhile():
    # b and d take both cores; a wakes while both are protected and queues two jobs; b's end gives a its first;
    # at 1.5 a's first and d's end together: d's core takes a's second while a still holds its own (it may go on
    # at that instant), so a runs it there. It was lost before (4 ranks on 2 cores: the calibration deadlocked)
    env = HeapEngine()
    pool = SlicedCores(env, 2, 4.0, 1.5)
    ends = {}
    jobs = [(0.0, 1.0, "b"), (0.0, 1.5, "d"), (0.5, 0.5, "a"), (0.5, 0.5, "a")]
    for i, (t, _, _) in enumerate(jobs):
        env.at(t, lambda i: pool.run(jobs[i][1], lambda k: ends.__setitem__(k, env.now), i, jobs[i][2]), i)
    env.run()
    assert ends == {0: 1.0, 1: 1.5, 2: 1.5, 3: 2.0}
    assert pool.busy_s == pytest.approx(3.5) and pool.taken == 0 and not pool.own


@settings(max_examples=200, deadline=None)
@given(cores=st.integers(1, 3), protect=st.sampled_from([0.0, 1.5]),
       jobs=st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.sampled_from([0.25, 0.5, 1.0, 1.5, 6.0]),
                               st.integers(0, 4), st.integers(0, 2)), min_size=1, max_size=14))
def test_every_job_ends_and_the_cores_do_all_the_work(cores, protect, jobs):
    # jobs: (issued at, work, owner, how many more it issues at once as each ends: a rank going on without
    # blocking), in units of a 4-unit slice; ties of ends and starts at one instant are where jobs were lost
    env = HeapEngine()
    pool = SlicedCores(env, cores, 4.0, protect)
    issued, ended = [0.0], []

    def start(job):
        _, work, owner, more = job
        issued[0] += work
        pool.run(work, lambda m: (ended.append(env.now), m and start((0.0, work / 2, owner, m - 1))), more, owner)

    for job in jobs:
        env.at(job[0], start, job)
    env.run()
    assert len(ended) == sum(1 + j[3] for j in jobs)
    assert pool.busy_s == pytest.approx(issued[0])
    assert pool.taken == 0 and not pool.queue and not pool.held and not pool.own
