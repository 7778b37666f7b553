"""TCP flows whose acknowledgements wait in a full switch port.

Mechanism (measured on the testbed's tree, docs/history/validation-journal.md, eleventh
session). A switch port that is the bottleneck of two or more TCP flows
fills its drop-tail queue (``port_buffer_B``) until it drops: that is how
loss-based TCP and BBR's probing find the rate. When the flows on the
*other* direction of the fabric are bottlenecked likewise, each flow's
acknowledgements wait behind a full queue (1 MiB is 80 ms at 100 Mb/s), so
its window must cover that queue's delay as well as its own. Every loss
halves a window sized for that round trip, the bottleneck's queue runs
empty, and the port idles until the windows grow back. A star's incast (its
acknowledgements return through idle ports) keeps its port busy; recursive
doubling across a 2:1 tree's uplinks, both directions full, does not:
plain TCP flows, 2 each way on one uplink, 40 MB each, moved 86 to 97 % of
the port's rate, and the calibration's ``crossing`` pattern 87 to 94 %.

The flow model keeps max-min fairness and takes the port's lost share off
its capacity: after a solve, a switch port is *queued* if its flows arrive
over two input links or more and their rates fill it (one input link is no
faster than the port: a rank's several messages to one peer queue in its
own host, which does not drop); a flow is *late-acked* if its reverse route
(its acknowledgements' path) crosses a queued port; each queued port keeps
``1 - (1 - e) x f`` of its rate, f the fraction of its flows that are
late-acked and e the fabric's ``ack_queue_efficiency`` (1: no loss). Then
the flows are solved again, once. e is calibrated per machine from the
crossing pattern (:func:`simsparse.calibration.network.fit_ack_queue`);
lossless fabrics (InfiniBand, Aries: credit flow control, no drops) have no
such term.
"""
from __future__ import annotations

import numpy as np

#: a link whose flows' rates sum to within this of its capacity is full (its queue grows)
FULL_TOL = 1e-6


def derated(L: np.ndarray, rate: np.ndarray, cap: np.ndarray, port: np.ndarray, rev: np.ndarray,
            efficiency: float) -> np.ndarray | None:
    """Capacities with the queued ports' lost share taken off, or None if no
    port loses any. ``L`` (flows x hops) and ``rev`` (the flows' reverse
    routes, -1 for a link no shared flow uses) are link numbers into
    ``cap`` and ``port`` (True for a switch's output port); ``rate`` the
    flows' max-min rates on ``cap``."""
    nl = len(cap)
    H = L.shape[1]
    load = np.bincount(L.ravel(), weights=np.repeat(rate, H), minlength=nl)
    n = np.bincount(L.ravel(), minlength=nl)
    # a port's queue grows only if its flows arrive over two links or more: one input link is no faster than it
    pairs = np.unique(L[:, 1:].ravel() * nl + L[:, :-1].ravel())
    inputs = np.bincount(pairs // nl, minlength=nl)
    queued = port & (inputs >= 2) & (load >= cap * (1.0 - FULL_TOL))
    if not queued.any():
        return None
    late = np.append(queued, False)[rev].any(axis=1)   # -1: the appended False
    if not late.any():
        return None
    frac = np.where(queued, np.bincount(L[late].ravel(), minlength=nl) / np.maximum(n, 1), 0.0)
    if not frac.any():
        return None
    return cap * (1.0 - (1.0 - efficiency) * frac)
