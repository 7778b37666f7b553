"""The network part of a machine profile, fitted from the patterns of
:mod:`.patterns`, and every pattern's measurement beside the model's time.

* **This host** (:func:`host_network`): the alpha-beta model. Alpha is the
  eager segment of the ping-pong (Hockney, split where MPI changes
  protocol). The bandwidth comes from the *exchange* -- both directions at
  once, as every step of a ring or recursive doubling moves them -- up to
  the largest message of the validation suite, because on one host both
  directions and both ranks share one memory bus (a ping-pong of small
  messages moves one direction at a time, in cache).
* **A testbed** (:func:`testbed_network`): its own Ethernet description
  (star or tree, line rates, framing), so the prediction runs on the same
  machine the testbed built. The link rates are not fitted: the payload rate
  is the line rate times the TCP framing efficiency
  (:meth:`~simsparse.network.spec.EthernetSpec.payload_efficiency`), and the
  profile reports the measured goodput beside it. What is fitted is what the
  description cannot know, the software's cost per message: LogGP ``o`` (the
  ping-pong's time beyond the wire, m / B; split into the sender's posting
  time, measured, and the rest at the receiver), ``g`` (the per-message time
  of back-to-back small messages) and the rendezvous handshake (a step in
  that residual where MPI changes protocol).
"""
from __future__ import annotations

import numpy as np

from ..compute.message_path import MessagePath
from ..ops import Dense
from . import fit, patterns
from .patterns import EXCHANGE_STEPS, STEADY_STEPS


def host_network(p2p: dict, name: str, source: str, path: dict | None = None) -> tuple[dict, dict]:
    """The alpha-beta line; with ``path`` (the send and receive path of these
    back-to-back messages, :func:`.fit.fit_message_path`) it is fitted to
    the time beyond that path, which the simulator charges on its own
    (:mod:`simsparse.compute.message_path`)."""
    beyond = _beyond_path(path)
    sizes, times = zip(*p2p["pingpong"])
    pp = fit.fit_eager_switch(sizes, [beyond(m, t) for m, t in p2p["pingpong"]])
    bw = pp.get("rendezvous_bandwidth_Bps", pp["bandwidth_Bps"])
    fits = {"pingpong": pp}
    big = [(m, beyond(m, t)) for m, t in p2p.get("exchange", []) if m >= 1 << 20]
    if len(big) >= 2:
        ex = fit.fit_alpha_beta(*zip(*big))
        fits["exchange"] = ex
        bw = ex["bandwidth_Bps"]
        how = "bandwidth from exchanges (both directions at once) of 1 MiB and more"
    else:
        how = "bandwidth from the large ping-pong messages"
    if path:
        how += ", both beyond the send and receive path timed around their messages"
    net = {"name": name, "model": "alphabeta",
           "source": f"{source}: alpha from the ping-pong's eager segment (Hockney), {how}",
           "alpha_s": pp["alpha_s"], "bandwidth_Bps": bw, "eager_threshold_B": pp["eager_threshold_B"],
           "rendezvous_rtt_s": pp["rendezvous_rtt_s"]}
    return net, fits


def _beyond_path(path: dict | None, count: int = 1):
    """(bytes, seconds) -> the seconds beyond ``count`` dense messages' send and
    receive paths (``path``: costs per format), at least a tenth of them."""
    if not path:
        return lambda m, t: t
    mp = MessagePath(path)
    return lambda m, t: max(t - count * (mp.send_s(Dense(None), m) + mp.recv_s(Dense(None), m)), 0.1 * t)


def exchange_scale(p2p: dict, network: dict, checks: list, P: int, cores=None, cpu=None,
                   binding: str = "none", rounds: int = 3, path: dict | None = None,
                   start=None, wait=None, slice_s=None) -> tuple[dict, list]:
    """The host's alpha-beta line with SMPI-style factors per size band
    (``size_scale``, :func:`.fit.size_scale`: half-decades of bytes, each
    the median of measured over modelled exchange time), where the line
    misses a band by more than 15 %: one line cannot follow a transfer
    through shared memory across MPI's eager copies, the caches and fresh
    receive buffers (here 16 KiB exchanged at 1.3 to 2.4 times the line,
    1 MiB at 0.66 to 0.86, 16 MiB at 1.4 to 1.5, over four calibrations). The factors
    scale the whole message time, so they are refined a few rounds, each
    by the ratio the last one left. Returns the network and its checks."""
    def ratios(checks):
        return {c["bytes"]: c["measured_s"] / c["model_s"] for c in checks
                if c["pattern"] == "exchange" and c["bytes"] > SMALL_EXCHANGE_B and c["measured_s"] > 0
                and c["model_s"] > 0}

    r = ratios(checks)
    scale = fit.size_scale(list(r), list(r.values()))
    if not scale:
        return network, checks
    net = dict(network)
    # the line holds up to the small exchanges, which measured the CPU per request (message_cpu)
    anchor = [[SMALL_EXCHANGE_B, 1.0]]
    for _ in range(rounds):
        net["size_scale"] = anchor + [[int(m), float(f)] for m, f in scale]
        r = ratios(check_patterns(p2p, net, P, cores, cpu, binding, path, start, wait, slice_s))
        left = fit.band_ratio(list(r), list(r.values()), [m for m, _ in scale])
        scale = [[m, f * q] for (m, f), q in zip(scale, left)]
    net["size_scale"] = anchor + [[int(m), float(f)] for m, f in scale]
    net["source"] += "; per size band, the exchanges' measured over modelled time (size_scale)"
    return net, check_patterns(p2p, net, P, cores, cpu, binding, path, start, wait, slice_s)


def testbed_network(p2p: dict, spec, name: str, source: str, path: dict | None = None) -> tuple[dict, dict]:
    """The testbed's description with the per-message costs it cannot know;
    with ``path`` (the send and receive path of the ping-pong's and the
    window's own messages) those are what is left beyond it, as the
    simulator charges the path on its own (:mod:`simsparse.compute.message_path`)."""
    B = spec.payload_rate()
    beyond = _beyond_path(path)
    sizes = np.asarray([m for m, _ in p2p["pingpong"]], float)
    times = np.asarray([beyond(m, t) for m, t in p2p["pingpong"]], float)
    from ..testbed.plan import burst_of

    b = burst_of(spec) * spec.payload_efficiency()
    kept, resid = _beyond_the_wire(sizes, times, B, b)
    step = fit.fit_step(kept, resid)
    gap = sizes[~np.isin(sizes, kept) & (sizes > step["threshold_B"])]
    if step["high_s"] > step["low_s"] and len(gap):   # the switch lies in the sizes left out: at their top
        step["threshold_B"] = int(gap.max())
    alpha = step["low_s"]
    post = float(p2p["window"][0][2])   # the isend of a small message: its send path, where that is charged apart
    if path:
        post = max(0.0, post - MessagePath(path).send_s(Dense(None), p2p["window"][0][0]))
    o_s = min(post, alpha)
    gap = float(p2p["window"][0][1])
    large = [(m, t) for m, t in p2p["pingpong"] if m >= 1 << 20]
    goodput = {"model_Bps": B, "line_rate_Bps": spec.link_bw_Bps if spec.framing == "tcp" else B
               / spec.payload_efficiency(),
               "measured_Bps": float(np.median([(m - b) / max(t - step["high_s"], 1e-12) for m, t in large]))
               if large else None}
    if goodput["measured_Bps"]:
        goodput["ratio"] = goodput["measured_Bps"] / B

    net = {**spec.model_dump(exclude={"name", "source"}), "name": name, "shaper_burst_B": burst_of(spec),
           "source": f"{source}: the testbed's own description; per-message costs fitted from ping-pong time beyond "
                     f"bytes / payload rate, gap from back-to-back small messages",
           "send_overhead_s": o_s, "recv_overhead_s": max(0.0, alpha - o_s), "gap_s": gap,
           "eager_threshold_B": step["threshold_B"], "rendezvous_rtt_s": step["high_s"] - step["low_s"]}
    late = unexpected_window(p2p.get("late", []), B)
    if late["window_B"] is not None:
        net["unexpected_window_B"] = late["window_B"]
    return net, {"overheads": step, "goodput": goodput, "late_receiver": late}


def unexpected_window(late, B: float) -> dict:
    """The ``unexpected_window_B`` from receives posted late
    (:func:`~simsparse.calibration.worker.late_receiver`): the bytes that
    crossed before the post are m - t B, t the receive's time from its
    post; the window is the largest size of which at least 90 % had
    crossed. None if no size did (the transport waits for the receive)."""
    rows = [{"bytes": int(m), "late_s": float(d), "receive_s": float(t),
             "crossed_before_B": float(max(0.0, m - t * B))} for m, d, t in late if t is not None]
    whole = [r["bytes"] for r in rows if r["crossed_before_B"] >= 0.9 * r["bytes"]]
    return {"window_B": max(whole) if whole else None, "sizes": rows}


def _beyond_the_wire(sizes, times, B, burst):
    """Ping-pong time beyond the wire's, at the sizes where the wire's is
    known: those a token bucket of ``burst`` payload bytes lets pass at once
    (m <= burst / 16: the bucket refills within the reply's round trip) and
    those past twice its depth (each message finds the bucket full after the
    reply's m / B and pays (m - burst) / B). Between them the
    bucket's level depends on the round trip itself (a series of 16 KiB
    ping-pongs reads m / 2B, not 0 nor m / B), so they are left out. No
    bucket: every size, t - m / B."""
    if burst <= 0:
        return sizes, times - sizes / B
    keep = (sizes <= burst / 16) | (sizes >= 2 * burst)
    wire = np.where(sizes <= burst / 16, 0.0, np.maximum(sizes - burst, 0.0) / B)
    return sizes[keep], (times - wire)[keep]


#: exchanges up to this size measure the CPU per request (the wire's time is negligible within a token bucket)
SMALL_EXCHANGE_B = 1024


def request_cpu(p2p: dict, P: int, cores, path: dict | None = None) -> tuple[float | None, float]:
    """Core-seconds per posted send or receive (``message_cpu_s``) and per
    wake-up from a blocking wait (``wait_cpu_s``) when P ranks share
    ``cores`` cores. An exchange of small messages with every rank busy is
    CPU-bound: a step costs each rank t x min(P, cores) / P core-seconds
    (t with a core per rank), its two requests and the one wake-up that
    completes them. The all-to-all puts 2(P - 1) requests behind one wake-up:
    the difference of the two steps is 2(P - 2) requests, the rest of the
    exchange's step the wake-up (the driver's poll or sleep returning, MPI's
    progress, the program resuming). On the star at P = 8, 4 B: 194 us a step
    for 2 requests, 400 us for 14 (17 us a request, 160 us a wake-up), where
    2 x 97 us per request would charge the all-to-all 1.36 ms. Both are
    steady steps (:func:`start_cpu`) beyond the send and receive path timed
    around the messages (``path``, charged on its own); the medians over the
    small sizes. Without an all-to-all (P = 2, older profiles) everything is
    per request. (None, 0) without cores or small exchanges."""
    rows = p2p.get("exchange_steady") or p2p.get("exchange", [])
    one, many = _beyond_path(path), _beyond_path(path, P - 1)
    ex = {m: one(m, t) for m, t in rows if m <= SMALL_EXCHANGE_B}
    if not cores or not ex:
        return None, 0.0
    share = min(P, cores) / P
    a2a = {m: many(m, t) for m, t in p2p.get("alltoall_steady", []) if m in ex}
    if not a2a or P <= 2:
        return float(np.median(list(ex.values()))) * share / 2, 0.0
    per_req = {m: max((t - ex[m]) * share / (2 * (P - 2)), 0.0) for m, t in a2a.items()}
    per_wake = [max(ex[m] * share - 2 * r, 0.0) for m, r in per_req.items()]
    return float(np.median(list(per_req.values()))), float(np.median(per_wake))


def start_cpu(p2p: dict, P: int, cores) -> float | None:
    """Core-seconds each rank spends on a run's first steps beyond the
    steady per-request cost (``start_cpu_s``): ranks leave the common start
    together, each from a sleep, with caches the other ranks' Python took
    over. The short exchange of EXCHANGE_STEPS steps (as the suite's
    collectives run) takes E x t_short, the long one's steps t_steady each;
    the excess E x (t_short - t_steady) of a CPU-bound run is
    P / min(P, cores) ranks' start each (at P = 8 on 2 cores here 0.6 to
    3 ms a run, at P = 4 0.1 to 0.7 ms). The median over the small sizes;
    None without cores or a long exchange."""
    short = dict(p2p.get("exchange", []))
    excess = [EXCHANGE_STEPS * (short[m] - t) for m, t in p2p.get("exchange_steady", [])
              if m <= SMALL_EXCHANGE_B and m in short]
    if not cores or not excess:
        return None
    return max(float(np.median(excess)), 0.0) * min(P, cores) / P


#: the efficiencies ``fit_ack_queue`` searches between, and how many halvings it takes
ACK_QUEUE_RANGE, ACK_QUEUE_STEPS = (0.3, 1.0), 12


def fit_ack_queue(p2p: dict, network: dict, P: int, *args) -> float | None:
    """``ack_queue_efficiency`` (:mod:`simsparse.network.ack_queue`) from the
    crossing pattern: per size, the efficiency at which the model's crossing
    takes the measured time (bisection), the median over sizes; None where
    the pattern puts no acknowledgements behind a full port (a star: every
    flow has its own ports), and 1 where the model is already as slow as
    the measurement. ``args`` are :func:`check_patterns`'s after P."""
    rows = p2p.get("crossing", [])
    if not rows or network.get("model") != "ethernet":
        return None

    def model_s(m, t, e):
        only = {"pingpong": [], "pairs": [], "incast": [], "crossing": [(m, t)]}
        return check_patterns(only, {**network, "ack_queue_efficiency": e}, P, *args)[0]["model_s"]

    lo_e, hi_e = ACK_QUEUE_RANGE
    got = []
    for m, t in rows:
        ideal = model_s(m, t, hi_e)
        if model_s(m, t, lo_e) <= ideal * (1.0 + 1e-9):
            return None                 # the mechanism does not act in this pattern here
        if ideal >= t:
            got.append(hi_e)
            continue
        lo, hi = lo_e, hi_e             # the model's time falls as the efficiency rises
        for _ in range(ACK_QUEUE_STEPS):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if model_s(m, t, mid) > t else (lo, mid)
        got.append(0.5 * (lo + hi))
    return float(np.median(got))


def check_patterns(p2p: dict, network: dict, P: int, cores=None, cpu=None, binding: str = "none",
                   path: dict | None = None, start=None, wait=None, slice_s=None) -> list[dict]:
    """Each measured pattern beside the simulator's time for it on ``network``
    (with ``cores`` shared by the ranks, bound as ``binding`` says, ``cpu``
    per request, ``wait`` per wake-up, ``start`` per run and ``path`` per
    message: the send and receive path of these back-to-back messages, as
    the profile runs; ``slice_s`` the scheduler's time slice)."""
    from ..compute.devices import DeviceProfile, ParametricDevice
    from ..network.spec import NETWORK_SPECS
    from ..ops import Dense

    spec = NETWORK_SPECS[network["model"]].model_validate(network)
    device = ParametricDevice(DeviceProfile(mem_bandwidth_Bps=1e12, shared_cores=cores, message_cpu_s=cpu,
                                            wait_cpu_s=wait or None, start_cpu_s=start, core_binding=binding,
                                            core_slice_s=slice_s or None,
                                            message_path=path or None)) if cores else None

    def maker(m):
        a = np.zeros(max(1, m // 4), np.float32)
        return lambda: Dense(a)

    def sim(program, pick):
        results, finish = patterns.simulate(spec, device, P, program)
        return results[0] if pick == "rank0" else max(finish)

    # repeated as measured, so shaped links' token buckets reach the level they have there
    reps = 8
    rows = []
    for m, t in p2p["pingpong"]:
        rows.append(("pingpong", m, t, sim(lambda c, mk=maker(m): patterns.pingpong(c, mk, reps), "rank0")))
    for m, t in p2p.get("exchange", []):
        n = EXCHANGE_STEPS if m <= 1 << 20 else 1   # as .worker times it
        rows.append(("exchange", m, t, sim(lambda c, mk=maker(m), n=n: patterns.exchange(c, mk, n), "span") / n))
    for m, t in p2p.get("exchange_steady", []):
        rows.append(("exchange_steady", m, t,
                     sim(lambda c, mk=maker(m): patterns.exchange(c, mk, STEADY_STEPS), "span") / STEADY_STEPS))
    for m, t in p2p.get("alltoall_steady", []):
        rows.append(("alltoall_steady", m, t,
                     sim(lambda c, mk=maker(m): patterns.alltoall(c, mk, STEADY_STEPS), "span") / STEADY_STEPS))
    for m, t in p2p["pairs"]:
        rows.append(("pairs", m, t, sim(lambda c, mk=maker(m): patterns.pairs(c, mk, 4), "span") / 4))
    for m, t in p2p.get("crossing", []):
        rows.append(("crossing", m, t, sim(lambda c, mk=maker(m): patterns.crossing(c, mk, 4), "span") / 4))
    for m, t in p2p["incast"]:
        rows.append(("incast", m, t, sim(lambda c, mk=maker(m): patterns.incast(c, mk), "span")))
    return [{"pattern": p, "bytes": int(m), "measured_s": float(t), "model_s": float(s),
             "error": float(s / t - 1.0) if t else None} for p, m, t, s in rows]
