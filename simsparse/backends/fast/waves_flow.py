"""Approximate bulk timing on the flow-level network, wave after wave
(``evaluation: link_load``).

The event path solves max-min fairness at every start and end of a shared
flow: Ok-Topk of BERT on Piz Daint's adaptive Dragonfly at P = 256 is 243 k
messages and 222 k solves an iteration, and adaptive routing (a route chosen
by the load when a message starts) has no exact bulk path. This evaluation
times the recorded schedule in the order it was recorded instead, as
:mod:`.waves_ab` does on the alpha-beta network:

* kernel steps run on each rank's FIFO device (:func:`~simsparse.backends.protocol.run_kernels`);
* a wave's messages are ready by the eager, window and rendezvous rules
  (:meth:`~simsparse.backends.protocol.Protocol.ready`) and routed in booking order
  (ready, the rank's place among the resumptions, place in its sender's
  wave): adaptive routing chooses each route by the model's own rule, seeing
  the load of the wave's messages routed before it;
* the wave's flows share each link on its own, fairly from their starts,
  and a flow ends when its busiest link lets it (:func:`_ends_by_load`):
  one pass a wave, no max-min solve. A flow's arrival is its end plus its
  route's latency and ``o_r``, as ``transfer`` gives it.

Cost model: the flow model's (bottleneck bandwidth, max-min sharing, LogGP
overheads), approximated, which is why the row declares a bound: flows of
other waves of the collective, and traffic from outside it, are not seen;
adaptive routing sees only the wave's own load, so it may choose other
routes than the event path, whose choices depend on every message in
flight; and the sharing is link by link. Adaptive routing is the largest
error, and the event path itself is as sensitive to it: its time moves by
up to 31 % with the routing seed on small bare collectives
(``benchmarks/bench_flow_waves.py`` measures the evaluation against the
events).
"""
from __future__ import annotations

import heapq

import numpy as np

from ... import jit
from ...jit import njit
from ...network.dragonfly import Dragonfly
from ...network.dragonfly_wave import Drawn, wave_routes
from .waves_ab import drive

def _links(net, order, src, dst) -> tuple[np.ndarray, np.ndarray]:
    """Every message's links (rows padded with the padding link) and route
    latency. Adaptive routing chooses in ``order`` with one draw per message
    (:class:`.dragonfly_wave.Drawn`), seeing the load of the wave's messages
    routed before (their count on each watched link, as ``transfer`` keeps
    it) on top of the flows the event path has in flight: compiled on
    nodes of one GPU and one NIC of a Dragonfly
    (:func:`.dragonfly_wave.wave_routes`, no route-table row per route),
    else by the model's own ``select``, which the compiled pass matches."""
    rt, ep = net._routes, net._ep
    if not net._adaptive:
        rid = np.array([net.route_id(ep[s], ep[d]) for s, d in zip(src.tolist(), dst.tolist())],
                       dtype=np.intp)
        return rt.R[rid], rt.lat[rid]
    u = np.random.default_rng(net._rng.getrandbits(64)).random(len(src))
    m = net._m
    if _compiled_routes(m):   # (no Python lists of the wave's ends: a wave at P = 1024 has some 3,000 messages)
        ep_a = net._ep_a
        load = np.zeros(len(net._load), dtype=np.int64) if net._routed == 0 else \
            np.array(net._load, dtype=np.int64)   # (nothing in flight: 50,918 zeros, not a list's copy)
        return wave_routes(m.fabric, rt.watched, ep_a[src], ep_a[dst], order, u, load, rt.dummy)
    s_l, d_l = src.tolist(), dst.tolist()
    load, watch, drawn = net._load, rt.watch, Drawn(u)
    rid = np.empty(len(src), dtype=np.intp)
    for i in order.tolist():
        es, ed = ep[s_l[i]], ep[d_l[i]]
        drawn.i = i
        r = rid[i] = net.route_id(es, ed, m.select(es, ed, load, drawn))
        for x in watch[r]:
            load[x] += 1
    for r in rid.tolist():
        for x in watch[r]:
            load[x] -= 1
    return rt.R[rid], rt.lat[rid]


def _compiled_routes(m) -> bool:
    """Whether :func:`.dragonfly_wave.wave_routes` routes on machine m (its
    twin, the model's own route choice, inside ``jit.python``)."""
    return jit.enabled() and isinstance(m.fabric, Dragonfly) and m.G == 1 and m.nics == 1


def _ends_by_load(L, cap, start, size) -> np.ndarray:
    """When each flow's last byte leaves, from each of its links on its own
    (``link_load``, after Parsimon, NSDI '23: the network decomposed into
    link-level simulations, recombined per flow). On a link of capacity C
    the wave's flows through it share it fairly from their starts
    (processor sharing, the fluid model's max-min on one link), timed by
    :func:`_link_shares`; a flow takes its busiest link's end. One pass a
    wave, no max-min solve. On one link it is the fluid model; across links
    it errs both ways: slow where a flow held back elsewhere leaves its
    share to the others (max-min gives it to them), fast where a flow meets
    its links' congestion at different times (each link alone lets it
    catch up). The second wins: on the grid of benchmarks/bench_flow_waves.py
    it is below the events on 31 of 36 points (a max-min sweep of the wave: 4)."""
    n, H = L.shape
    link = np.asarray(L, dtype=np.int64).ravel()
    real = np.isfinite(cap[link])                    # (the padding link: infinite, no time)
    pair = np.flatnonzero(real)
    flow = pair // H
    o = np.lexsort((start[flow], link[pair]))        # by link, then start
    pair, flow = pair[o], flow[o]
    lk = link[pair]
    end = np.array(start, dtype=np.float64)
    if len(pair):
        shares = _SHARES if jit.enabled() else _link_shares
        np.maximum.at(end, flow, shares(lk, end[flow], np.asarray(size, np.float64)[flow],
                                        np.asarray(cap, np.float64)[lk]))
    return end


def _link_shares(lk, st, sz, c):
    """Processor sharing on each link, pairs sorted by (link, start): each
    pair's end. Virtual time V (the bytes every flow on the link has had)
    grows at C / (flows on it); a flow that starts at V0 leaves at
    V0 + its size, so departures come in that order (a heap)."""
    m = len(lk)
    end = np.empty(m)
    heap = [(0.0, 0)]   # (typed for numba by its first item; cleared per link)
    i = 0
    while i < m:
        j = i
        while j < m and lk[j] == lk[i]:
            j += 1
        C = c[i]
        heap.clear()
        t, V = st[i], 0.0
        for a in range(i, j + 1):
            until = st[a] if a < j else np.inf
            while len(heap) > 0:
                F, f = heap[0]
                dt = (F - V) * len(heap) / C
                if t + dt > until:
                    V += (until - t) * C / len(heap)
                    t = until
                    break
                t += dt
                V = F
                heapq.heappop(heap)
                end[f] = t
            if a < j:
                t = max(t, st[a])
                heapq.heappush(heap, (V + sz[a], a))
        i = j
    return end


_SHARES = njit(_link_shares)


def _wave(net, order, src, dst, ready, nb, P: int) -> np.ndarray:
    """Per rank: the last arrival among its messages of the wave (-inf: none)."""
    links, tail = _links(net, order, src, dst)
    end = ready + net.o_s
    f = np.flatnonzero(nb > 0)
    if len(f):
        end[f] = _ends_by_load(links[f], net._cap, end[f], nb[f])
    arrival = end + tail + net.o_r
    last = np.full(P, -np.inf)
    np.maximum.at(last, src, arrival)
    np.maximum.at(last, dst, arrival)
    return last


def load_waves_run(run) -> bool:
    """Time ``run`` (a :class:`~simsparse.backends.fast.bulk.BulkRun` on a
    flow-level network) wave after wave (:func:`.waves_ab.drive`), each wave's
    flows timed from its links' loads. The network keeps no trace of its
    flows (later messages find the links free)."""
    run._reset()
    net, P = run.host.network, run.P
    drive(run, lambda src, dst, nb, ready, order, floor: _wave(net, order, src, dst, ready,
                                                               nb.astype(np.float64), P))
    return True
