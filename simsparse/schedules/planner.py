"""Merge planners of layer-wise pipelined SGD: which consecutive gradient
tensors are sparsified and communicated together.

Conventions. A model has L gradient tensors in *backward order* (index 0 is
the tensor whose gradient is ready first, the paper's layer L). A *plan* is a
tuple of group lengths in backward order summing to L: ``(3, 1, 2)`` puts
tensors 0-2 in group 0, tensor 3 in group 1, tensors 4-5 in group 2. Costs
are ``tb`` (backward time per tensor), ``sizes`` (elements per tensor),
``ts(d)`` (sparsification time of a buffer of d elements, 0 for dense),
``tc(d)`` (communication time of a buffer of d elements), ``tf`` (forward).

The timing model is OMGS-SGD's (Shi et al., INFOCOM'20, Eqs. 5-9 and 17)
with merged layers (Eqs. 13-15): :func:`pipeline_time`. Planners:
:func:`threshold_plan` (MGS-SGD), :func:`omgs_plan` (Algorithm 1),
:func:`mgwfbp_plan` (MG-WFBP, dense) and :func:`optimal_plan` (exact minimum
of :func:`pipeline_time` by dynamic programming). Algorithm 1 and MG-WFBP
are greedy and miss the optimum of their own model in some cases (see the
counterexamples in tests/schedules/test_merge_planner.py).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

Cost = Callable[[float], float]


@dataclass(frozen=True)
class Timeline:
    """One iteration of a plan under Eqs. 5-9/17. Per group g (backward
    order): ``start_backward`` (tau_b of its first tensor), ``start_sparsify``
    (tau_s), ``start_comm`` (tau_c), ``end_comm`` (tau_c + t_c). ``compute`` is
    t_f + sum t_b + sum t_s (Eq. 5 without t_c^no) and ``non_overlapped`` is
    t_c^no = t_iter - compute (Eq. 9)."""

    plan: tuple
    t_iter: float
    start_backward: tuple
    start_sparsify: tuple
    start_comm: tuple
    end_comm: tuple
    compute: float
    non_overlapped: float


def _check_plan(plan, L: int) -> tuple:
    plan = tuple(int(g) for g in plan)
    if L == 0 or sum(plan) != L or any(g <= 0 for g in plan):
        raise ValueError(f"plan {plan} is not a partition of {L} tensors into positive group lengths")
    return plan


def _check_model(tb, sizes):
    tb = [float(t) for t in tb]
    sizes = [int(s) for s in sizes]
    if len(tb) != len(sizes) or not sizes:
        raise ValueError(f"tb ({len(tb)}) and sizes ({len(sizes)}) must be non-empty and of equal length")
    if min(tb) < 0 or min(sizes) < 0:
        raise ValueError("backward times and sizes must be non-negative")
    return tb, sizes


def _plan_from_normal(normal: Sequence[bool]) -> tuple:
    """Group lengths from per-tensor flags (backward order): a group closes at
    every tensor flagged normal (the last tensor is always normal)."""
    plan, n = [], 0
    for flag in normal:
        n += 1
        if flag:
            plan.append(n)
            n = 0
    return tuple(plan)


def pipeline_time(plan, tb, sizes, ts: Cost, tc: Cost, tf: float = 0.0) -> Timeline:
    """Iteration time of ``plan`` (OMGS-SGD Eqs. 5-9 generalised to merged
    groups, Eqs. 13-15, and Eq. 17). The device runs group g's backward, then
    its sparsification ts(S_g) of the group's total size S_g, then group
    g+1's backward (Eq. 6); group g's communication starts at
    max(end of its sparsification, end of group g-1's communication) (Eq. 8)
    and lasts tc(S_g); t_iter is the end of the last communication (Eq. 17)."""
    tb, sizes = _check_model(tb, sizes)
    plan = _check_plan(plan, len(sizes))
    t = float(tf)
    comm_end = -np.inf
    sb, ss, sc, ec = [], [], [], []
    i = 0
    for g in plan:
        S = sum(sizes[i:i + g])
        sb.append(t)
        t += sum(tb[i:i + g])
        ss.append(t)
        t += float(ts(S))
        start = max(t, comm_end)
        comm_end = start + float(tc(S))
        sc.append(start)
        ec.append(comm_end)
        i += g
    compute = t  # the device never idles: its end is tf + sum tb + sum ts
    return Timeline(plan, comm_end, tuple(sb), tuple(ss), tuple(sc), tuple(ec), compute, comm_end - compute)


def threshold_plan(sizes, threshold: int = 8192, first: int | None = None) -> tuple:
    """MGS-SGD's fixed-size merging (OMGS paper section V.D, 8,192 elements;
    OMGS-SGD code ``_generate_groups_with_threshold``): walking in backward
    order, a group is closed as soon as its accumulated size reaches
    ``threshold``; a remainder forms the last group. With ``first``, the
    first group closes at ``first`` instead: PyTorch DDP's rule
    (``compute_bucket_assignment_by_size`` with the limits [first, threshold])."""
    plan, n, acc = [], 0, 0
    limit = threshold if first is None else first
    for s in sizes:
        n += 1
        acc += int(s)
        if acc >= limit:
            plan.append(n)
            n, acc, limit = 0, 0, threshold
    if n:
        plan.append(n)
    return _check_plan(plan, len(sizes))


def omgs_plan(tb, sizes, ts: Cost, tc: Cost, alpha: float) -> tuple:
    """OMGS-SGD Algorithm 1 (FindMergedLayers), section IV, followed line by
    line in the paper's layer numbering (layer L = backward index 0). Model:
    Eqs. 6-8 with merged layers (Eqs. 13-15), sparsification ``ts`` (TKPM,
    Eq. 10) and communication ``tc`` with startup ``alpha`` (AGPM, Eq. 11).
    Scanning l = L..2, layer l is merged into l-1 when Q3 and Q5 hold (Eq. 24):

    * Q3: tau_b[l] + tb[l] + tb[l-1] + ts(d[l]) + ts(d[l-1]) < tau_c[l] + tc(d[l])
    * Q5: tau_c[l] + alpha > tau_b[l] + tb[l] + tb[l-1] + ts(d[l] + d[l-1])

    after which the start times are recomputed (lines 9-12). Readings of the
    pseudo-code: Q3's right side is tau_c[l] + AGPM(d[l]) (as in section
    IV.A); CCPS line 32 reads tb[L]; a merged layer has t_s = t_c = 0 (Eq. 13)
    in CCPS/CCMS, not AGPM(0) = alpha (the public code's models also return
    0 for 0 elements); ts(0) is never called. Start times do not depend on
    t_f (a common shift), so none is taken. The rule is greedy and not always
    optimal under its own model (see :func:`optimal_plan`)."""
    tb_, sizes_ = _check_model(tb, sizes)
    L = len(sizes_)
    alpha = float(alpha)
    # 1-based arrays in the paper's numbering: paper layer l is backward index L - l.
    tbp = [0.0] + [tb_[L - l] for l in range(1, L + 1)]
    d = [0] + [sizes_[L - l] for l in range(1, L + 1)]
    merged = [False] * (L + 1)
    taub, taus, tauc = [0.0] * (L + 1), [0.0] * (L + 1), [0.0] * (L + 1)

    def ccps(top, start):  # CalculateCompStart over layers 1..top (lines 27-36)
        taub[top] = start
        taus[top] = taub[top] + tbp[top]
        for l in range(top - 1, 0, -1):
            taub[l] = taus[l + 1] + tsp[l + 1]
            taus[l] = taub[l] + tbp[l]

    def ccms():  # CalculateCommStart (lines 19-26)
        tauc[L] = taus[L] + tsp[L]
        for l in range(L - 1, 0, -1):
            tauc[l] = max(tauc[l + 1] + tcp[l + 1], taus[l] + tsp[l])

    # TKPM/AGPM of every layer (lines 22, 30), kept up to date by Merge
    tsp = [0.0] + [float(ts(d[l])) for l in range(1, L + 1)]
    tcp = [0.0] + [float(tc(d[l])) for l in range(1, L + 1)]
    ccps(L, 0.0)  # line 2
    ccms()  # line 3
    for l in range(L, 1, -1):  # lines 4-13
        mu = taub[l] + tbp[l] + tbp[l - 1]
        q3 = mu + tsp[l] + tsp[l - 1] < tauc[l] + tcp[l]
        ts_merged = float(ts(d[l] + d[l - 1]))
        q5 = tauc[l] + alpha > mu + ts_merged
        if q3 and q5:
            # Merge (lines 37-41); Eq. 13: the merged layer has t_s = t_c = 0
            tbp[l - 1], tbp[l] = tbp[l - 1] + tbp[l], 0.0
            d[l - 1], d[l] = d[l - 1] + d[l], 0
            tcp[l - 1], tcp[l] = float(tc(d[l - 1])), 0.0
            tsp[l - 1], tsp[l] = ts_merged, 0.0
            merged[l] = True
            ccps(l, taub[l] + tbp[l])  # lines 10-11 (tb[l] is now 0)
            ccms()  # line 12
    # m[l] normal closes a group; backward order walks l = L..1.
    return _plan_from_normal([not merged[l] for l in range(L, 0, -1)])


def mgwfbp_plan(tb, sizes, tc: Cost, alpha: float) -> tuple:
    """MG-WFBP's merge for dense allreduce (Shi, Chu, Li, INFOCOM'19; its code
    HKBU-HPML/MG-WFBP ``distributed_optimizer.py::_generate_groups_mgwfbp``),
    i.e. the OMGS rule with t_s = 0. Backward ends are fixed (merging moves no
    computation); walking in backward order, tensor l joins the next tensor
    l-1 when l-1's gradient is ready (r) before l's communication could end
    (r < tau_c[l] + t_c[l]) and either l's communication would have to wait
    anyway (tau_c[l] > r) or the wait is below the startup saved
    (r - tau_c[l] < alpha); the communication start times are recomputed
    after every merge. For tc = alpha + beta d this is r < tau_c[l] + alpha."""
    tb_, sizes_ = _check_model(tb, sizes)
    L = len(sizes_)
    alpha = float(alpha)
    ready = np.cumsum(tb_).tolist()  # backward end of each tensor (Eq. 2, t_f = 0)
    d = list(sizes_)
    normal = [True] * L
    tcv = [float(tc(s)) for s in d]

    def comm_start():
        tauc, end = [0.0] * L, -np.inf
        for i in range(L):
            tauc[i] = max(end, ready[i])
            end = tauc[i] + tcv[i]
        return tauc

    tauc = comm_start()
    for i in range(L - 1):
        r = ready[i + 1]
        if r < tauc[i] + tcv[i] and (tauc[i] > r or r - tauc[i] < alpha):
            d[i + 1] += d[i]
            d[i] = 0
            tcv[i], tcv[i + 1] = 0.0, float(tc(d[i + 1]))
            normal[i] = False
            tauc = comm_start()
    return _plan_from_normal(normal)


def _cost_table(f: Cost, S: np.ndarray) -> np.ndarray:
    """f at every entry of S: one vectorised call when f accepts arrays and
    agrees with scalar calls on a few entries, else one call per entry."""
    try:
        v = np.broadcast_to(np.asarray(f(S), dtype=float), S.shape).copy()
        probe = np.unique(np.linspace(0, S.size - 1, 7).astype(int))
        if all(np.isclose(v[k], float(f(int(S[k]))), rtol=1e-12, atol=0.0) for k in probe):
            return v
    except Exception:  # noqa: BLE001 - a scalar-only cost model
        pass
    return np.array([float(f(int(x))) for x in S])


def _count_dp(X, TC):
    """Backward DP over (boundary j, number m of groups left): A[m, j] is the
    least total communication of m groups covering tensors j..L-1 and E[m, j]
    the least max_g(device offset of g + communication of groups g..end)
    given that total (so from a state (D, C) at j the iteration ends at
    max(C + A, D + E), Eqs. 8 and 17). When tc is affine the total depends on
    (j, m) only and E is exact; otherwise A is a minimum and E a lower bound."""
    L = X.shape[0] - 1
    A, E = np.full((L + 1, L + 1), np.inf), np.full((L + 1, L + 1), np.inf)
    nxt = np.zeros((L + 1, L + 1), dtype=np.int64)
    A[0, L], E[0, L] = 0.0, -np.inf
    for j in range(L - 1, -1, -1):
        n = L - j
        step = -(-n // 4)
        for r0 in range(0, n, step):  # rows r = m - 1 in [r0, r1) need k <= L - r0
            r1, w = min(n, r0 + step), n - r0
            ca = A[r0:r1, j + 1:j + 1 + w] + TC[j, j + 1:j + 1 + w]  # first group [j, k)
            A[r0 + 1:r1 + 1, j] = ca.min(axis=1)
            np.maximum(ca, E[r0:r1, j + 1:j + 1 + w], out=ca)
            ca += X[j, j + 1:j + 1 + w]
            k = ca.argmin(axis=1)
            E[r0 + 1:r1 + 1, j] = ca[np.arange(r1 - r0), k]
            nxt[r0 + 1:r1 + 1, j] = k + j + 1
    return A, E, nxt


def _pareto_dp(X, TC, A, E, tf, UB, budget):
    """Forward DP over group boundaries keeping, per boundary, the Pareto
    front of (device end D, communication end C); a group [i, j) maps (D, C)
    to (D + X[i, j], max(D + X[i, j], C) + TC[i, j]). A state at j whose
    completion bound max(C + min_m A[m, j], D + min_m E[m, j]) exceeds UB is
    dropped, and it only extends to the boundaries its bound allows.
    Returns (value, boundaries), (inf, None) when nothing beats UB, or None
    once more than ``budget`` state extensions were needed."""
    L = X.shape[0] - 1
    tol = UB * (1 + 1e-9)
    Amin, Elb = A.min(axis=0), E.min(axis=0)
    delta = X.min(axis=1)  # least device time of the next group
    Kc = TC + Amin[None, :]
    with np.errstate(invalid="ignore"):
        K = np.where(np.isfinite(X), X + np.maximum(Elb[None, :], Kc), np.inf)
    M = np.minimum.accumulate(K[:, ::-1], axis=1)[:, ::-1]  # non-decreasing in j
    Mc = np.minimum.accumulate(Kc[:, ::-1], axis=1)[:, ::-1]
    aD, aC = np.array([float(tf)]), np.array([-np.inf])
    aPos, aId, aEnd = np.array([0]), np.array([0]), np.array([L + 1])
    pos, par, best, parent, work = [0], [-1], np.inf, -1, 0
    for j in range(1, L + 1):
        live = aEnd > j
        aD, aC, aPos, aId, aEnd = aD[live], aC[live], aPos[live], aId[live], aEnd[live]
        work += aD.size
        if work > budget:
            return None
        Dn = aD + X[aPos, j]
        Cn = np.maximum(Dn, aC) + TC[aPos, j]
        if j == L:
            if Cn.size:
                k = int(np.argmin(Cn))
                best, parent = float(Cn[k]), int(aId[k])
            break
        Cn = np.maximum(Cn, Dn + delta[j])  # an idle channel: only D matters
        ok = np.nonzero(np.maximum(Cn + Amin[j], Dn + Elb[j]) <= tol)[0]
        order = ok[np.lexsort((Cn[ok], Dn[ok]))]
        if order.size == 0:
            continue
        Cs = Cn[order]
        keep = np.empty(Cs.size, dtype=bool)
        keep[0] = True
        keep[1:] = Cs[1:] < np.minimum.accumulate(Cs)[:-1]
        sel = order[keep]
        nD, nC = Dn[sel], Cn[sel]
        end = j + 1 + np.minimum(np.searchsorted(M[j, j + 1:], tol - nD, side="right"),
                                 np.searchsorted(Mc[j, j + 1:], tol - nC, side="right"))
        ids = np.arange(len(pos), len(pos) + sel.size)
        pos.extend([j] * sel.size)
        par.extend(aId[sel].tolist())
        aD, aC, aEnd = np.concatenate((aD, nD)), np.concatenate((aC, nC)), np.concatenate((aEnd, end))
        aPos, aId = np.concatenate((aPos, np.full(sel.size, j))), np.concatenate((aId, ids))
    if parent < 0:
        return np.inf, None
    bounds, k = [L], parent
    while k > 0:  # state 0 is the empty prefix
        bounds.append(pos[k])
        k = par[k]
    return best, [0] + bounds[::-1]


def optimal_plan(tb, sizes, ts: Cost, tc: Cost, tf: float = 0.0, budget: int = 20_000_000) -> tuple:
    """The plan minimising :func:`pipeline_time` (Eq. 17) over all 2^(L-1)
    plans, exactly (ts, tc >= 0). The iteration ends at
    max_g(D_g + sum_{h >= g} tc_h), D_g the device end of group g (Eqs. 6-8).
    With an affine tc (Eq. 11) the communication left after a boundary
    depends only on the number of groups left, so a backward DP over
    (boundary, groups left) is exact: O(L^3) vectorised, about 0.15 s for
    L = 449. For any other tc that DP gives an upper bound (its plan) and
    lower bounds, and an exact forward DP over Pareto fronts of (device end,
    communication end) per boundary, pruned by them, finds the optimum;
    it can blow up for far-from-affine tc (e.g. concave), so past ``budget``
    state extensions it warns and returns the upper-bound plan."""
    tb_, sizes_ = _check_model(tb, sizes)
    L = len(sizes_)
    B = np.concatenate(([0.0], np.cumsum(tb_)))
    Pc = np.concatenate(([0], np.cumsum(np.asarray(sizes_, dtype=np.int64))))
    iu = np.triu_indices(L + 1, 1)
    S = (Pc[None, :] - Pc[:, None])[iu]
    TS, TC = np.full((L + 1, L + 1), np.inf), np.full((L + 1, L + 1), np.inf)
    TS[iu], TC[iu] = _cost_table(ts, S), _cost_table(tc, S)
    if min(TS[iu].min(), TC[iu].min()) < 0:
        raise ValueError("ts and tc must be non-negative")
    X = B[None, :] - B[:, None] + TS  # device time of group [i, j): backward + sparsification
    A, E, nxt = _count_dp(X, TC)
    m = int(np.argmin(E[:, 0]))
    bounds = [0]
    while bounds[-1] < L:
        bounds.append(int(nxt[m, bounds[-1]]))
        m -= 1
    if not _is_affine(S.astype(float), TC[iu]):
        plan = tuple(b2 - b1 for b1, b2 in zip(bounds, bounds[1:]))
        ub = pipeline_time(plan, tb_, sizes_, ts, tc, tf).t_iter
        res = _pareto_dp(X, TC, A, E, float(tf), ub, budget)
        if res is None:
            warnings.warn(f"optimal_plan: tc is not affine and the exact search needs more than "
                          f"{budget} state extensions; returning the best plan found, not proven optimal",
                          RuntimeWarning, stacklevel=2)
        elif res[1] is not None and res[0] < ub:
            bounds = res[1]
    return _check_plan([b2 - b1 for b1, b2 in zip(bounds, bounds[1:])], L)


def _is_affine(S, T) -> bool:
    """Whether T = a + b S on all entries, up to rounding."""
    if np.unique(S).size < 3:
        return True
    coef = np.polyfit(S, T, 1)
    return bool(np.max(np.abs(np.polyval(coef, S) - T)) <= 1e-9 * max(np.abs(T).max(), 1e-300))
