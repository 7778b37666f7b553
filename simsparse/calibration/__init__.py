"""``simsparse calibrate``: microbenchmarks of this machine -> a machine profile.

:func:`calibrate` launches :mod:`.worker` under ``mpiexec -n RANKS`` (the
real backend's own send/receive path, kernels and torch models), fits the
cost models (:mod:`.fit`, least squares, residuals reported) and writes one
YAML file that ``run`` accepts both as ``network:`` and as ``compute:``::

    kind: machine
    provenance: {host, date, command, versions, ranks, device, wall time}
    network:  {model: alphabeta, alpha_s, bandwidth_Bps, eager_threshold_B, rendezvous_rtt_s, ...}
    compute:  {launch_s, mem_bandwidth_Bps, peak_flops, compute_efficiency, kernels: {...}, models: {...}}
    fits:     every fit's parameters and residuals, LogGP o and g, concurrency checks

The profile describes ``RANKS`` processes on this host with the thread count
``measure`` gives them (cores / RANKS): calibrate with the rank count you
will measure.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import yaml

from ..backends.real.rank_env import host_cores, meminfo_bytes, rank_env
from ..compute import speed_probe
from . import fit
from .probes import back_to_back
from .stack_probe import profile_entry

#: where a profile for R ranks goes by default; configs name it with {P} (resolved per point)
DEFAULT_OUT = "results/calibration/local-{ranks}r.yaml"
#: every algorithm runs at these n, and its kernels are timed: past the largest n of the validation suites
#: (1e7, not itself a calibration size), since a kernel's cost per element changes across memory regimes
#: (calibration.fit.size_scale). (8e5 was tried, where a rank's blocks leave the caches: its runs gave the path's
#: 32 KB band the cost of messages sent after a large kernel, which the suite's ring at 1e4 does not pay;
#: docs/history/validation-journal.md, fifth session)
KERNEL_SIZES = [3000, 30000, 300000, 3000000, 12000000]
#: likewise for a testbed: its name, then the rank count
TESTBED_OUT = "results/calibration/testbed-{name}-{ranks}r.yaml"


class CalibrationError(Exception):
    pass


def pingpong_sizes(quick: bool = False) -> list[int]:
    """The ping-pong's sizes: powers of two from 4 B to 4 MiB (every third in a quick calibration),
    and between 32 and 128 KiB, where MPI libraries switch from eager to rendezvous, a quarter
    octave apart: the step is placed at the largest size below it (:func:`.fit.fit_step`), and on a
    testbed the sizes within twice the token bucket tell nothing of it (the bucket's level decides
    them), so with powers of two alone a switch anywhere up to 64 KiB read as 32 KiB (an exchange of
    40 KB on the star, eager, was predicted with the handshake: 3.4 ms against 1.9 measured)."""
    sizes = [4 << i for i in range(0, 21, 3 if quick else 1)]
    if not quick:
        sizes += [int(m * f) for m in (1 << 15, 1 << 16) for f in (1.25, 1.5, 1.75)]
    return sorted(sizes)


def calibrate(device: str = "cpu", ranks: int = 2, out: str | Path | None = None, quick: bool = False,
              models=("resnet20_cifar10",), batch_size: int = 8, timeout_s: float = 3600,
              command: str = "", testbed=None) -> Path:
    """Run the microbenchmarks and write the profile; returns its path.
    ``testbed``: an Ethernet description (:class:`~simsparse.network.spec.EthernetSpec`)
    to calibrate on its emulated cluster (:mod:`simsparse.testbed`) instead of this host. The raw
    timings are written beside ``out`` (:func:`raw_out`) before the fit and removed once the profile is."""
    from ..experiments.run.measure import MeasureError, check_prerequisites

    try:
        mpiexec = check_prerequisites()
    except MeasureError as e:
        raise CalibrationError(str(e)) from None
    if ranks < 2:
        raise CalibrationError("--ranks must be at least 2 (point-to-point benchmarks need a partner)")
    default = DEFAULT_OUT if testbed is None else TESTBED_OUT.replace("{name}", _testbed_name(testbed))
    out = Path(str(out or default).replace("{ranks}", str(ranks)))
    spec = {"device": device, "quick": quick, "models": list(models), "batch_size": batch_size,
            "p2p_sizes": pingpong_sizes(quick),
            "reps": 20 if quick else 100,
            "kernel_sizes": [3000, 30000, 300000] if quick else KERNEL_SIZES,
            "layer_reps": 2 if quick else layer_reps(ranks),
            # the send and receive path with the MPI calls in place where the algorithms run on the profile's own
            # transport (this host); serialisation alone for a testbed, whose transport fits keep their calls
            "path_calls": testbed is None}
    if testbed is None:   # both directions at once: small ones (CPU per request), up to the suite's largest message
        spec["exchange_sizes"] = [4, 1 << 8, 1 << 10] + [1 << i for i in range(12, 27, 4 if quick else 2)]
    else:                 # the bandwidth is the description's; these check it, and the sharing
        spec["exchange_sizes"] = [4, 1 << 8, 1 << 10, 1 << 13, 1 << 16, 1 << 20, 1 << 22]   # small: CPU per request
        spec["concurrency_sizes"] = [1 << 18, 1 << 21]
        spec["p2p_sizes"] = [s for s in spec["p2p_sizes"] if s <= 1 << 22]
        # receives posted after the message had time to cross (1.5 m / B + 50 ms): the unexpected window
        B = testbed.payload_rate()
        spec["late_sizes"] = [(m, 1.5 * m / B + 0.05) for m in (1 << 20, 1 << 22, 1 << 24)]
        spec["stack"] = True   # TCP through the host's kernel: its CPU beside the ranks' (stack_probe)
    # Kernels and layers are timed as a run does them: every rank resident and busy (they share the memory bus).
    # With more ranks than cores (the testbed's 4 and 8 ranks on a small host) a call is timed by its process's CPU
    # clock: the core-seconds it costs its rank while the others thrash the same caches, TLBs and page allocator,
    # which the simulator then shares among the ranks (shared_cores, simsparse.compute.cores). A wall
    # clock would count the other ranks' time slices; one rank per core would miss what they do to each other.
    cores = host_cores()
    shared = ranks > cores
    cpu_clock = compute_clock(device, ranks) == "cpu"
    if testbed is None and not shared:
        raw = _launch(mpiexec, spec, ranks, None, timeout_s)
    else:
        net = _launch(mpiexec, {**spec, "parts": ["p2p"]}, ranks, testbed, timeout_s)
        comp_spec = {**spec, "parts": ["kernels", "layers"], "clock": "cpu" if cpu_clock else "wall"}
        # the algorithms run where the profile's runs will: on a testbed through its sockets, with its wire formats,
        # wait mode and common start (testbed.MPI_ENV), so a kernel meets the caches a measured run leaves it.
        # Through shared memory the same kernels in the same runs took 1.0x to 2.7x less than on the star at
        # P = 2 (the ring's copy_into of 200 KB 19 us against 47, its add_into 20 against 53; with spinning ranks
        # on the testbed alike: the sockets' path, not the sleeps; benchmarks/bench_kernels_in_place.py --spin)
        comp = _launch(mpiexec, comp_spec, ranks if cpu_clock else max(min(ranks, cores), 2), testbed, timeout_s)
        raw = {**net, **comp, "wall_s": net["wall_s"] + comp["wall_s"],
               "stage_s": {**net.get("stage_s", {}), **comp.get("stage_s", {})}}
    raw["compute_clock"] = "cpu" if cpu_clock else "wall"
    # The ranks' driver and MPI progress run on this host's cores: on the CPU device their kernels and each
    # request's CPU share those cores (round robin with the slice measured below, or processor sharing; with a core
    # per rank each runs at full speed).
    raw["shared_cores"] = cores if shared or device == "cpu" else None
    if shared:   # several ranks per core: how long one keeps its core while the others wait (compute.cores)
        from .slice_probe import time_slice

        raw["core_slice"] = time_slice(max(2, ranks // cores))
    # the measurements are kept until the profile is written: a fit that fails (a bug, a model the measurements
    # break) must not lose minutes of them
    raw_path = raw_out(out)
    write_raw(raw, raw_path)
    try:
        profile = build_profile(raw, ranks, device, command or " ".join(sys.argv), testbed)
    except Exception as e:
        why = str(e) if isinstance(e, CalibrationError) else f"fitting the measurements failed ({type(e).__name__}: {e})"
        raise CalibrationError(f"{why}; the measurements are kept in {raw_path} (calibration.build_profile refits "
                               "them)") from e
    write_profile(profile, out)
    raw_path.unlink()
    return out


def raw_out(out: Path) -> Path:
    """Where the raw timings of the profile ``out`` are kept (beside it)."""
    return out.with_name(out.name.removesuffix(".yaml") + ".raw.json")


def write_raw(raw: dict, path: Path) -> None:
    from ..files import atomic_write

    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(_plain(raw), f, default=lambda o: o.tolist() if hasattr(o, "tolist") else repr(o))

    atomic_write(path, dump)


def _launch(mpiexec: str, spec: dict, ranks: int, testbed, timeout_s: float) -> dict:
    """One ``mpiexec`` of the worker (on a testbed if given); its raw timings."""
    with tempfile.TemporaryDirectory(prefix="simsparse-cal-") as td:
        sp, rp = os.path.join(td, "spec.json"), os.path.join(td, "raw.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        cmd = [sys.executable, "-m", "simsparse.calibration.worker", sp, rp]
        env = rank_env()
        with _launcher(testbed, ranks) as tb:
            if tb is not None:
                cmd = tb.wrap(cmd)
                env.update(tb.env)
            try:
                proc = subprocess.run([mpiexec, "-n", str(ranks), *cmd], capture_output=True, text=True,
                                      timeout=timeout_s, env=env)
            except subprocess.TimeoutExpired:
                raise CalibrationError(f"calibration timed out after {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not os.path.exists(rp):
            raise CalibrationError(_failure(proc.returncode, proc.stderr or proc.stdout or "", ranks))
        with open(rp) as f:
            return json.load(f)


#: a calibration rank's peak memory seen here at P = 8: 3.3 GB on the tree (22.4 GB for the 8 ranks at once), and
#: the largest process of the star's whole validate run 3.7 GB; every algorithm at n = 1.2e7 on the caching heap of
#: simsparse.backends.real.rank_env, released between algorithms (worker.kernels; before, the heap kept what each one
#: grew to: 3.8 to 4.4 GB on the star, and out of memory on the tree)
RANK_PEAK_GB = 3.7


def _failure(code: int, output: str, ranks: int) -> str:
    """Why the worker's ``mpiexec`` failed: its exit and the output's tail,
    and, where a rank was killed by SIGKILL, what most likely did it."""
    tail = "\n".join(output.strip().splitlines()[-15:])
    why = f"the calibration run failed (exit {code}):\n{tail}"
    if code in (9, 137, -9) or "signal 9" in output:
        total = meminfo_bytes("MemTotal")
        have = f"; this host has {total / 2**30:.0f} GB" if total else ""
        why += (f"\nA rank was killed by SIGKILL, most likely by the kernel's out-of-memory killer (see dmesg): a "
                f"calibration rank holds up to about {RANK_PEAK_GB:g} GB, {ranks * RANK_PEAK_GB:.0f} GB for "
                f"{ranks} ranks{have}. Calibrate fewer ranks, or stop what else holds memory.")
    return why


def _testbed_name(spec) -> str:
    from ..testbed.plan import testbed_name

    return testbed_name(spec)


def _launcher(testbed, ranks: int):
    if testbed is None:
        return contextlib.nullcontext()
    from ..testbed import Testbed, TestbedError

    try:
        return Testbed(testbed, ranks)
    except (TestbedError, ValueError) as e:
        raise CalibrationError(str(e)) from None


def build_profile(raw: dict, ranks: int, device: str, command: str, testbed=None) -> dict:
    """Fit every cost model to the raw timings of :mod:`.worker`; with
    ``testbed`` (its Ethernet description) the network is that description
    with the measured per-message costs (:mod:`.network`)."""
    from . import network as netfit

    host = socket.gethostname()
    p2p = raw["p2p"]
    # the send and receive path around every message (compute.message_path; on a testbed serialisation alone, on
    # this host with the MPI calls in place: calibration.probes.PathProbe): in the algorithms' runs, what the suite
    # pays; in the back-to-back patterns, what their times hold beside the transport, which is fitted beyond it
    path, path_fits = fit.fit_message_path(raw.get("message_path") or [])
    hot, hot_fits = fit.fit_message_path(p2p.get("path") or []) if path else ({}, {})
    if testbed is None:
        name = f"local-{device}-{ranks}r"
        network, net_fits = netfit.host_network(p2p, name, f"simsparse calibrate on {host} through the real backend",
                                                hot)
    else:
        name = f"testbed-{_testbed_name(testbed)}-{ranks}r"
        network, net_fits = netfit.testbed_network(p2p, testbed, name, f"simsparse calibrate --testbed on {host}",
                                                   hot)
    loggp = {"o_send_s": p2p["window"][0][2], "g_s": p2p["window"][0][1],
             "window": [{"bytes": m, "per_message_s": g, "post_s": o} for m, g, o in p2p["window"]]}
    # the testbed's launcher binds each rank to a core (simsparse.testbed.launch): the model binds them alike
    binding = "block" if testbed is not None and raw.get("shared_cores") else "none"
    cpu, wake = netfit.request_cpu(p2p, ranks, raw.get("shared_cores"), hot)
    start = netfit.start_cpu(p2p, ranks, raw.get("shared_cores")) if cpu else None
    slice_s = (raw.get("core_slice") or {}).get("median_s") if raw.get("shared_cores") else None
    checks = (raw.get("shared_cores"), cpu, binding, hot, start, wake, slice_s)
    if testbed is not None:
        eff = netfit.fit_ack_queue(p2p, network, ranks, *checks)
        net_fits["ack_queue_efficiency"] = eff
        if eff is not None and eff < 1.0:
            network["ack_queue_efficiency"] = eff
            network["source"] += "; ack_queue_efficiency from the crossing pattern"
    concurrency = netfit.check_patterns(p2p, network, ranks, *checks)
    if testbed is None:
        network, concurrency = netfit.exchange_scale(p2p, network, concurrency, ranks, raw.get("shared_cores"), cpu,
                                                     binding, path=hot, start=start, wait=wake, slice_s=slice_s)
        if "size_scale" in network:
            net_fits["exchange_scale"] = network["size_scale"]

    kernels, kfits = _kernels(raw["kernels"])
    _select_scales(kernels, kfits, raw["kernels"], raw.get("sparse_grid") or [])
    _idle_excess(kernels, kfits, raw.get("idle_grid") or [])
    noise, noise_fits = fit.fit_kernel_noise(steady_calls(raw["kernels"])[0])
    mem = _memory_roofline(raw["kernels"])
    # one eager op issued behind others (worker.op_launch): the per-op term of a model's roofline and of a kernel
    # that has no fit of its own; the roofline's intercept over every kernel call stays in the fits
    launch = (raw.get("op_launch") or {}).get("issue_s") or mem["launch_s"]
    partners = f", {raw['cpu_partners']} partner ranks on the CPU" if raw.get("cpu_partners") else ""
    compute = {"name": name, "source": f"simsparse calibrate on {host} ({raw['device']}, {raw['torch_threads']} "
                                       f"torch threads per rank, {ranks} ranks{partners})",
               "launch_s": launch, "mem_bandwidth_Bps": mem["mem_bandwidth_Bps"], "kernels": kernels}
    if raw.get("shared_cores"):
        compute["shared_cores"] = raw["shared_cores"]
        compute["core_binding"] = binding
        if slice_s:
            compute["core_slice_s"] = slice_s
        if cpu:
            compute["message_cpu_s"] = cpu
        if wake:
            compute["wait_cpu_s"] = wake
            if testbed is not None:   # its ranks wait in poll mode (testbed.MPI_ENV): a long wait wakes periodically
                from ..backends.real.start import MIN_MARGIN_S
                from ..backends.real.wire import SocketSleep

                compute["wait_poll_s"] = SocketSleep.MAX_S
                compute["wait_poll_after_s"] = SocketSleep.polling_after()
                compute["start_idle_s"] = MIN_MARGIN_S   # (testbed.MPI_ENV's common start)
        if start:
            compute["start_cpu_s"] = start
        if p2p.get("stack"):
            compute["network_stack"] = profile_entry(p2p["stack"], compute.get("wait_cpu_s"), compute.get("wait_poll_s"))
        if path:
            compute["message_path"] = path
        step = program_cpu(raw.get("steps"))
        if step:
            compute["program_cpu_s"] = step
    if testbed is not None:   # every run begins after testbed.MPI_ENV's common start: the network idles that long
        from ..backends.real.start import MIN_MARGIN_S

        compute["start_pause_s"] = MIN_MARGIN_S
    if noise:
        compute["kernel_noise"] = noise
    clock = raw.get("compute_clock", "wall")
    probes = raw.get("speed_probe") or []
    if probes:   # the host's speed as the kernels were timed: what validate compares a measured point's probe with
        compute["speed_probe_s"] = float(np.median([p[f"{clock}_s"] for p in probes]))
        compute["speed_probe_clock"] = clock
        calls = [speed_probe.calls_of(p, clock) for p in probes]
        if all(calls):
            compute["speed_probe_calls_s"] = {c: float(np.median([got[c] for got in calls])) for c in calls[0]}
    layer_fits, models = layer_times(raw["layers"])
    if layer_fits:
        best = max(layer_fits.values(), key=lambda f: f["residuals"]["points"])
        compute["peak_flops"] = best["flops_per_s"]
        compute["compute_efficiency"] = 1.0
    compute["models"] = models
    prov = _provenance(command, ranks, raw)
    if testbed is not None:
        prov["testbed"] = testbed.model_dump()
    return {"kind": "machine", "name": name,
            "provenance": prov,
            "network": network, "compute": compute,
            "fits": {"network": net_fits, "loggp": loggp,
                     "message_path": {"algorithms": path_fits, "patterns": {"costs": hot, "fits": hot_fits}},
                     "patterns": concurrency, "kernels": kfits, "kernel_noise": noise_fits, "memory": mem,
                     "op_launch": raw.get("op_launch"), "core_slice": raw.get("core_slice"),
                     "speed_probe": raw.get("speed_probe"),
                     "layers": layer_fits},
            "measurements": {"pingpong": [{"bytes": m, "half_rtt_s": t} for m, t in p2p["pingpong"]]}}


def steady_calls(calls) -> tuple[list, int]:
    """The kernel calls of steady state: a call that page-faulted (5th field, the
    minor faults while it ran) is left out where a call of the same kernel and size
    ran without faults -- it paid for growing the heap once, which a measured
    iteration on the caching heap does not (:mod:`simsparse.backends.real.rank_env`).
    Returns (the calls kept, how many were left out)."""
    clean = {(c[0], c[1]) for c in calls if len(c) < 5 or not c[4]}
    kept = [c for c in calls if len(c) < 5 or not c[4] or (c[0], c[1]) not in clean]
    return kept, len(calls) - len(kept)


def _fitted_as(name: str) -> set:
    """The fits a call of ``name`` counts for: a path's call (``"kernel/path"``) also the kernel's."""
    return {name, name.split("/")[0]}


#: calls a size needs on each side, back to back and after something else, before it gets a factor
BACK_TO_BACK_MIN_CALLS = 3


def _kernels(calls) -> tuple[dict, dict]:
    """Per kernel, the fit of its calls' median time per (elements, parts)
    (:func:`.fit.fit_kernel`), and what it was fitted from. A call is
    ``(name, elems, bytes, seconds[, faults[, parts[, select[, back to back]]]][, rank])``: the rank is
    appended by :func:`.worker.every_rank` after the probe's fields. A call
    of one path of a kernel (``"name/path"``) counts for the path and for the
    kernel (the fallback for a path the calibration never took). The line
    is fitted from the calls that follow something else (a message, a wait,
    another kernel), where a size has any; its calls back to back
    (:func:`back_to_back`) give, per size, their median over theirs
    (``back_to_back_scale``): top-k's count runs in a loop that moves the
    threshold, and at a density where that loop turns often the median of
    every call was the loop's hot one."""
    kept, _ = steady_calls(calls)
    left_out = (Counter(k for c in calls for k in _fitted_as(c[0]))
                - Counter(k for c in kept for k in _fitted_as(c[0])))
    by, ranks = defaultdict(lambda: defaultdict(list)), defaultdict(set)
    for c in kept:
        name, elems, _nbytes, dt, *more = c
        parts = more[1] if len(more) > 2 else 1.0
        for key in _fitted_as(name):
            by[key][(elems, parts)].append((dt, back_to_back(c)))
            ranks[key].add(more[-1] if len(more) > 1 else 0)   # every rank's calls since 2026-11-27
    kernels, fits = {}, {}
    for name, pts in sorted(by.items()):
        keys = sorted(pts)
        times = [float(np.median([dt for dt, rep in pts[k] if not rep] or [dt for dt, _ in pts[k]])) for k in keys]
        if len(keys) < 2 or min(times) <= 0:
            continue
        f = fit.fit_kernel([e for e, _ in keys], times, [p for _, p in keys])
        kernels[name] = {k: f[k] for k in ("launch_s", "per_elem_s", "per_part_s", "complexity", "size_scale")
                         if k in f}
        fits[name] = {**f, "sizes": len(keys), "calls": sum(len(v) for v in pts.values()),
                      "ranks": len(ranks[name]), "calls_left_out_for_faults": left_out[name]}
        if "per_part_s" in f:   # what a size band's factor cannot give back: its sizes' part counts
            fits[name]["medians"] = [[float(e), float(p), t] for (e, p), t in zip(keys, times)]
        scale = _back_to_back_scale(pts)
        if scale:
            kernels[name]["back_to_back_scale"] = scale
            fits[name]["back_to_back_calls"] = sum(rep for v in pts.values() for _, rep in v)
    return kernels, fits


def _back_to_back_scale(pts: dict) -> list | None:
    """Per size with :data:`BACK_TO_BACK_MIN_CALLS` calls each way, the median of its calls back to back over
    that of the others (``pts``: (elements, parts) -> [(seconds, back to back)])."""
    by: dict = defaultdict(lambda: ([], []))
    for (elems, _parts), v in pts.items():
        for dt, rep in v:
            by[int(elems)][rep].append(dt)
    scale = [[e, float(np.median(reps) / np.median(firsts))] for e, (firsts, reps) in sorted(by.items())
             if len(reps) >= BACK_TO_BACK_MIN_CALLS and len(firsts) >= BACK_TO_BACK_MIN_CALLS and min(firsts) > 0]
    return scale or None


def _select_scales(kernels: dict, fits: dict, calls: list, grid: list) -> None:
    """Each sparse kernel's factor over size and density (``select_scale``,
    :func:`.fit.fit_select_scale`) from its calls on its own
    (:func:`.worker.sparse_grid`), 1 at the median density (``Work.select``
    over ``Work.elems``) of the algorithm runs' calls its line was fitted from.
    The factor is what the line misses: each grid call's time over the line's
    at that call's elements (a scatter-add's line counts its n + nnz), where
    the grid kept them: ``(name, n, density, seconds, elements, rank)``
    (kept before: without ``elements``). Where it kept them, the time over
    the line at the reference density is also the share of the line that
    moves with the density (``own_share``)."""
    from ..compute.devices import DeviceProfile, ParametricDevice
    from ..compute.kernels import Work

    kept, _ = steady_calls(calls)
    for name in sorted({g[0] for g in grid} & set(kernels)):
        dens = [c[6] / c[1] for c in kept if c[0] == name and len(c) > 7 and c[6] > 0 and c[1] > 0]
        if not dens:
            continue
        ref = float(np.median(dens))
        line = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1.0, kernels={name: kernels[name]}))
        mine = [g for g in grid if g[0] == name]
        over_line = all(len(g) > 5 for g in mine)
        scale = fit.fit_select_scale([(n, d, dt / line.cost(name, Work(rest[0], 0.0)) if over_line else dt)
                                      for _, n, d, dt, *rest in mine], ref, over_line)
        if scale:
            kernels[name]["select_scale"] = scale
            fits[name]["select_scale_calls"] = sum(g[0] == name for g in grid)


def _idle_excess(kernels: dict, fits: dict, grid: list) -> None:
    """What an idle adds to each kernel's call (``idle_excess``) from its
    calls on their own (:func:`.worker.idle_grid`): per idle and size, the
    median over every rank's medians less that of the same calls back to
    back (idle 0), at least 0. ``grid``: ``(name, n, idle_s, seconds, rank)``."""
    for name in sorted({g[0] for g in grid} & set(kernels)):
        def at(d, n, name=name):
            return float(np.median([g[3] for g in grid if g[0] == name and g[2] == d and g[1] == n]))

        sizes = sorted({g[1] for g in grid if g[0] == name and g[2] == 0})
        kernels[name]["idle_excess"] = [[float(d), [[int(n), max(0.0, at(d, n) - at(0, n))] for n in sizes]]
                                        for d in sorted({g[2] for g in grid if g[0] == name and g[2] > 0})]
        fits[name]["idle_calls"] = sum(g[0] == name for g in grid)


def program_cpu(steps: dict | None) -> float | None:
    """Core-seconds a rank program and the real driver spend between two
    requests, charged per kernel call (``program_cpu_s``): the median of the
    driver's steps, less the messages posted and kernels run inside them, times
    the steps per kernel call, over every algorithm at every calibration size
    (:class:`~.probes.StepProbe`; the median leaves out the first steps' one-off
    costs: connections, first pages)."""
    if not steps or not steps.get("steps") or not steps.get("kernel_calls"):
        return None
    return max(0.0, steps["median_s"]) * steps["steps"] / steps["kernel_calls"]


def _memory_roofline(calls) -> dict:
    """launch + bytes / bandwidth over every kernel call (the default for kernels without a fit of their own)."""
    calls, _ = steady_calls(calls)
    nb = np.array([c[2] for c in calls], float)
    t = np.array([c[3] for c in calls], float)
    keep = (t > 0) & (nb > 0)
    f = fit.fit_alpha_beta(nb[keep], t[keep])
    return {"launch_s": f["alpha_s"], "mem_bandwidth_Bps": f["bandwidth_Bps"], "residuals": f["residuals"]}


def compute_clock(device: str, ranks: int) -> str:
    """The clock kernels and layers are timed with on ``ranks`` ranks of this host: ``cpu`` (each
    process's CPU seconds) where more ranks than cores share the CPU device, which the simulator
    then shares among them (``shared_cores``), else ``wall`` (:func:`calibrate`'s comment)."""
    return "cpu" if device == "cpu" and ranks > host_cores() else "wall"


def layer_reps(ranks: int) -> int:
    """Repetitions of a model's layers on each of ``ranks``: 5, or enough that all ranks together time
    the whole forward as often as a noise band needs (``fit.NOISE_MIN_SAMPLES``): its decade holds
    no other piece, so too few and it joins the pieces' band, which spreads three times as far."""
    return max(5, -(-fit.NOISE_MIN_SAMPLES // ranks))


def time_layers(device: str, models: list, batch_size: int, reps: int, ranks: int = 1) -> dict:
    """:func:`.worker.layers` of ``models``: on this process's ``device`` alone (no MPI), or on ``ranks``
    ranks at once under mpiexec (each with its share of the cores, as measure's ranks run; rank 0's
    times), by the clock :func:`calibrate` uses (:func:`compute_clock`: with more ranks than cores,
    the CPU seconds a pass costs its rank; a wall clock would count the others' time slices too, and
    the simulator's shared cores would count them again)."""
    if ranks == 1:
        import torch

        from .worker import layers

        class Solo:   # one rank: the barriers of a calibration run are no-ops, its gathers its own
            def Barrier(self):
                pass

            def Get_rank(self):
                return 0

            def gather(self, mine, root=0):
                return [mine]

        return layers(Solo(), torch.device(device), models, batch_size, reps)
    from ..experiments.run.measure import check_prerequisites

    spec = {"device": device, "parts": ["layers"], "models": list(models), "batch_size": batch_size, "layer_reps": reps,
            "clock": compute_clock(device, ranks)}
    return _launch(check_prerequisites(), spec, ranks, None, timeout_s=600 + 60 * reps)["layers"]


def layer_times(raw_layers) -> tuple[dict, dict]:
    """(roofline fit, measured times) per model: each tensor's measured backward interval, and the measured
    forward total split like a roofline fitted to the backward intervals (the per-tensor forward is not
    observable: no hook fires per tensor in the forward pass); where the repetitions were kept, the
    spread of the pieces around their medians (``noise``)."""
    from ..compute.models import model_table

    fits, models = {}, {}
    for name, m in raw_layers.items():
        table = model_table(name)["tensors"]
        bs = m["batch_size"]
        ops = [e["bwd_ops"] for e in table]
        flops = [e["bwd_flops"] * bs for e in table]
        mm = [e["bwd_mm_bytes"] * bs + 8 * e["size"] for e in table]
        other = [e["bwd_bytes"] * bs - e["bwd_mm_bytes"] * bs for e in table]
        t_bwd = m["backward_s"]
        # one point per tensor that does work (a module's other tensors are ready at the same moment)
        work = [i for i, e in enumerate(table) if e["bwd_ops"] > 0]
        f = fit.fit_roofline([ops[i] for i in work], [flops[i] for i in work], [mm[i] for i in work],
                             [other[i] for i in work], [t_bwd[i] for i in work])
        fwd_pred = fit.roofline_time(f["launch_s"], f["flops_per_s"], f["mem_bandwidth_Bps"],
                                     np.array([e["fwd_ops"] for e in table], float),
                                     np.array([e["fwd_flops"] * bs for e in table], float),
                                     np.array([e["fwd_mm_bytes"] * bs + 4 * e["size"] for e in table], float),
                                     np.array([(e["fwd_bytes"] - e["fwd_mm_bytes"]) * bs for e in table], float))
        f["forward_measured_s"] = m["forward_s"]
        f["forward_fit_s"] = float(fwd_pred.sum())
        fits[name] = f
        scale = m["forward_s"] / max(float(fwd_pred.sum()), 1e-30)   # measured total, split like the roofline
        models[name] = {"batch_size": bs, "t_fwd": (fwd_pred * scale).tolist(), "t_bwd": list(t_bwd)}
        # the pieces' spread, banded as kernel calls are: every timed rank's repetitions of the whole forward
        # (one piece in the simulator, as timed: a sum of a hundred operations spreads a third as much as
        # one of them, 0.03 against 0.09 for ResNet-32 at batch 16, benchmarks/bench_layer_noise.py) and of
        # each tensor's backward interval
        noise = fit.fit_kernel_noise(m.get("reps") or [])[0]
        if noise:
            models[name]["noise"] = noise
    return fits, models


def _provenance(command: str, ranks: int, raw: dict) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def v(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    git = None
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[2], timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"host": socket.gethostname(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": command, "ranks": ranks, "device": raw["device"], "torch_threads": raw["torch_threads"],
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "simsparse": v("simsparse"), "git": git,
            "numpy": v("numpy"), "torch": v("torch"), "mpi4py": v("mpi4py"), "mpich": v("mpich"),
            "wall_s": raw["wall_s"],
            "stage_s": {stage: round(s, 3) for stage, s in raw.get("stage_s", {}).items()},
            "compute_clock": {"cpu": f"kernels and layers in CPU seconds of each of {ranks} resident ranks",
                              "wall": "kernels and layers in wall seconds, one rank per core"}[
                raw.get("compute_clock", "wall")]}


def write_profile(profile: dict, out: Path) -> None:
    from ..files import atomic_write

    def dump(tmp):
        with open(tmp, "w") as f:
            f.write("# Machine profile written by `simsparse calibrate`; use it as `network:` and as `compute:`.\n")
            yaml.safe_dump(_plain(profile), f, sort_keys=False, width=120)

    atomic_write(Path(out), dump)


def _plain(o):
    """numpy scalars and tuples -> plain YAML types."""
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, np.generic):
        return o.item()
    return o
