"""Layer-wise schedules: results against numpy, the limits the pipeline model
must reach, the merge plans, and the same iteration under mpiexec."""
import dataclasses

import numpy as np
import pytest

from simsparse.backends.events.sim import Simulator, TrainingModel
from simsparse.experiments.run.plan import plan_costs, with_plan
from simsparse.experiments.config.point import Point
from simsparse.experiments.run.runner import simulate_point
from simsparse.network.alphabeta import AlphaBetaNetwork
from simsparse.schedules import SCHEDULES, get_schedule
from simsparse.algorithms import get_algorithm

from tests import real_batch
from tests.helpers import requires_mpi, schedule_point as point

DENSE = ["whole", "wfbp", "mg_wfbp", "dense_ovlp", "ddp"]
SPARSE = ["topk_sgd", "lags_sgd", "mgs_sgd", "omgs_sgd"]


def test_every_schedule_is_registered_and_cites_its_paper():
    assert set(SCHEDULES) == set(DENSE + SPARSE)
    for cls in SCHEDULES.values():
        assert cls.__doc__ and ("section" in cls.__doc__ or "Algorithm" in cls.__doc__), cls.name


@pytest.mark.parametrize("schedule", DENSE)
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner"])
def test_dense_schedules_sum_every_gradient(schedule, algorithm):
    pt = point(schedule, algorithm, P=3)
    row = simulate_point(pt).row
    assert row["correct"] is True and row["max_rel_err"] < 1e-5
    # an iteration holds its compute and the communication that backward does not hide
    assert row["t_iter_s"] >= row["t_forward_s"] + row["t_backward_s"] + row["t_comm_nonoverlap_s"] > 0
    assert row["t_comm_nonoverlap_s"] > 0 and row["t_forward_s"] > 0 and row["t_backward_s"] > 0
    layers = len(pt.workload["layers"])
    expected = {"whole": 1, "dense_ovlp": 1, "wfbp": layers}  # mg_wfbp merges by its cost model
    assert row["merged_groups"] == expected.get(schedule, row["merged_groups"]) and 1 <= row["merged_groups"] < layers + 1


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SPARSE)
@pytest.mark.parametrize("algorithm,params", [("topka", {"error_feedback": True}), ("oktopk", {}),
                                              ("gaussiank", {}), ("gtopk", {}), ("dsar_split_allgather", {})])
def test_sparse_schedules_with_any_sparse_allreduce(schedule, algorithm, params):
    """Each bucket's collective (with its own state) equals its reference on
    the bucket's slice of every rank's input."""
    row = simulate_point(point(schedule, algorithm, P=4, params=params, iterations=2)).row
    assert row["correct"] is True, row["max_rel_err"]


def test_schedule_rejects_the_wrong_kind_of_collective():
    assert "dense" in get_schedule("wfbp").check_algorithm(get_algorithm("topka"))
    assert "compressing" in get_schedule("omgs_sgd").check_algorithm(get_algorithm("ring"))


# -- limits ------------------------------------------------------------------------------

FREE_NET = {"model": "alphabeta", "alpha_s": 0.0, "bandwidth_Bps": 1e30}


@pytest.mark.parametrize("schedule,algorithm,tol", [("wfbp", "ring", 1e-9), ("omgs_sgd", "topka", 1e-9),
                                                    ("lags_sgd", "topka", 1e-9), ("lags_sgd", "gtopk", 1e-2),
                                                    ("topk_sgd", "oktopk", 1e-2)])
def test_free_communication_leaves_forward_backward_and_sparsification(schedule, algorithm, tol):
    """With the same work on every rank the iteration is exactly the device's
    work. gTopk's tree and Ok-Topk's regions give ranks different amounts of
    selection and reduction: then the slowest rank also waits a little for
    the others' compute."""
    row = simulate_point(point(schedule, algorithm, network=FREE_NET)).row
    parts = row["t_forward_s"] + row["t_backward_s"] + row["t_sparsify_s"]
    assert row["t_comm_nonoverlap_s"] <= tol * row["t_iter_s"]
    assert row["t_iter_s"] == pytest.approx(parts, rel=tol)
    assert row["t_backward_s"] > row["t_forward_s"] > 0


@pytest.mark.parametrize("schedule,algorithm", [("whole", "rabenseifner"), ("topk_sgd", "topka")])
def test_free_compute_whole_is_the_collective_alone(schedule, algorithm):
    p = point(schedule, algorithm, compute=None, iterations=1, warmup=0)
    alone = dataclasses.replace(p, schedule=None, schedule_params={}, batch_size=None)
    assert simulate_point(p).row["t_iter_s"] == pytest.approx(simulate_point(alone).row["time_s"], rel=1e-12)


def test_free_compute_wfbp_is_the_buckets_one_after_another():
    """Ideal compute: every gradient is ready at once; the comm stream runs
    the per-tensor allreduces back to back."""
    p = with_plan(point("wfbp", "ring", compute=None, iterations=1, warmup=0, model="resnet20_cifar10", P=2))
    layers = p.workload["layers"]
    each = sum(simulate_point(Point(algorithm="ring", P=2, network=p.network, iterations=1, warmup=0,
                                    workload={"n": s, "density": 0.01, "dtype": "float32", "seed": 0})).row["time_s"]
               for s in layers)
    assert simulate_point(p).row["t_iter_s"] == pytest.approx(each, rel=1e-9)


def test_whole_and_wfbp_coincide_on_a_one_layer_model():
    model = TrainingModel(t_forward=1e-3, t_backward=(2e-3,), sizes=(1000,))
    grads = [np.random.default_rng(r).standard_normal(1000).astype(np.float32) for r in range(4)]
    costs = dataclasses.replace(plan_costs(with_plan(point("wfbp", "ring"))), sizes=(1000,), tb=(2e-3,))
    times = []
    for name in ("whole", "wfbp"):
        cls = get_schedule(name)
        plan = cls.plan(cls.Params(), costs)
        assert plan == (1,)
        scheds = [cls(r, 4, (1000,), 0.01, "float32", plan, get_algorithm("ring"), get_algorithm("ring").Params())
                  for r in range(4)]
        st = Simulator(AlphaBetaNetwork(1e-6, 1e9)).run([s.run for s in scheds], model, grads)
        times.append(st.time_s)
        np.testing.assert_allclose(st.results[0][0], sum(grads), rtol=1e-5, atol=1e-6)
    assert times[0] == times[1]


def test_comm_overlaps_the_backward():
    """WFBP on a slow network hides part of its communication behind the
    backward pass: it beats backward-then-allreduce."""
    net = {"model": "alphabeta", "alpha_s": 5e-6, "bandwidth_Bps": 2e8}
    whole = simulate_point(point("whole", "rabenseifner", network=net)).row
    dense_ovlp = simulate_point(point("dense_ovlp", "rabenseifner", network=net, sparams={"bucket_mb": 0.25})).row
    assert dense_ovlp["t_iter_s"] < whole["t_iter_s"]
    assert dense_ovlp["t_comm_nonoverlap_s"] < whole["t_comm_nonoverlap_s"]


# -- plans ---------------------------------------------------------------------------------

def test_plans_of_resnet50_table_v_mgs():
    p = with_plan(point("mgs_sgd", "topka", model="resnet50_imagenet", batch_size=16, data_scale=0.01, P=2))
    assert len(p.plan) == 53   # the OMGS paper's Table V


@pytest.mark.parametrize("evaluation", ["events", "link_load"])
def test_the_plans_microbenchmarks_run_the_points_own_evaluation(monkeypatch, evaluation):
    """tc(d) is fitted from microbenchmarks on the point's network at its P,
    under the point's own evaluation (the flow waves where it asks for them)."""
    from simsparse.experiments.run import plan

    seen = []
    real = plan.simulate

    def spy(pt, *a, **kw):
        seen.append((pt.evaluation, pt.P, pt.network["model"]))
        return real(pt, *a, **kw)

    monkeypatch.setattr(plan, "simulate", spy)
    net = {"model": "fattree", "radix": 4, "link_bw_Bps": 1e9, "send_overhead_s": 1e-6, "recv_overhead_s": 1e-6}
    p = dataclasses.replace(point("omgs_sgd", "topka", P=4, network=net), evaluation=evaluation)
    alpha, beta = plan.comm_fit(p)
    assert len(seen) >= 3 and set(seen) == {(evaluation, 4, "fattree")}
    assert alpha >= 0 and beta > 0


def test_the_plans_microbenchmarks_take_the_approximation_fast_chose_for_the_point(monkeypatch):
    """Where ``fast`` times a point's collectives by an approximation because
    its events would take too long, the plan's microbenchmarks (part of its
    simulation) take the same evaluator; where it does not, the point's own."""
    from simsparse.backends import evaluators as ev
    from simsparse.experiments.run import plan

    from tests.helpers import net

    p = dataclasses.replace(point("omgs_sgd", "topka", P=4, network=net("piz_daint_aries")), evaluation="fast")
    assert plan._evaluation(p) == "fast"
    monkeypatch.setattr(ev, "LONG_S", 0.0)
    assert plan._evaluation(p) == "link_load"
    assert plan._evaluation(dataclasses.replace(p, evaluation="exact")) == "exact"


def test_optimal_omgs_is_never_slower_than_the_paper_rule_in_its_model():
    from simsparse.schedules.planner import pipeline_time

    p = point("omgs_sgd", "topka", model="resnet20_cifar10", network={"model": "ethernet", "topology": "star",
                                                                      "link_bw_Bps": 1.126e8, "send_overhead_s": 1e-5,
                                                                      "recv_overhead_s": 1e-5})
    costs = plan_costs(p)
    paper = get_schedule("omgs_sgd").plan(get_schedule("omgs_sgd").Params(), costs)
    best = get_schedule("omgs_sgd").plan(get_schedule("omgs_sgd").Params(planner="optimal"), costs)
    t = [pipeline_time(pl, costs.tb, costs.sizes, costs.ts, costs.tc, costs.tf).t_iter for pl in (paper, best)]
    assert t[1] <= t[0] * (1 + 1e-12)


# -- the real backend ---------------------------------------------------------------------------

def _under_mpiexec(P):
    cases = [("wfbp", "ring", {}), ("omgs_sgd", "topka", {"error_feedback": True})]
    if P == 2:
        cases += [("whole", "rabenseifner", {}), ("mg_wfbp", "recursive_doubling", {}),
                  ("dense_ovlp", "ring", {}), ("topk_sgd", "topka", {}), ("lags_sgd", "gaussiank", {}),
                  ("mgs_sgd", "oktopk", {})]
    if P == 4:
        cases += [("omgs_sgd", "gtopk", {}), ("mgs_sgd", "oktopk", {})]
    return real_batch.register(f"layerwise_{P}", [point(s, a, P=P, params=prm, batch_size=2, iterations=2, warmup=1)
                                                  for s, a, prm in cases])


UNDER_MPIEXEC = {P: _under_mpiexec(P) for P in (2, 3, 4)}


@requires_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("P", [2, 3, 4])
def test_schedules_under_mpiexec_run_the_real_model_and_are_correct(P, tmp_path_factory, worker_id):
    """A real forward and backward of resnet20 per rank; every schedule's
    aggregated gradients equal numpy's reference on the real gradients, and
    the bytes equal the simulator's (same plan, same buckets)."""
    for p in UNDER_MPIEXEC[P]:
        row, _ = real_batch.measured(p, tmp_path_factory, worker_id)
        assert row["backend"] == "mpi" and row["correct"] is True, (p.schedule, p.algorithm, row["max_rel_err"])
        assert row["t_iter_s"] > 0 and row["t_backward_s"] > 0 and row["t_forward_s"] > 0
        sim = simulate_point(p).row
        assert row["merged_groups"] == sim["merged_groups"]
        if p.algorithm in ("ring", "rabenseifner", "recursive_doubling", "topka", "gtopk"):
            assert row["bytes_total"] == sim["bytes_total"], (p.schedule, p.algorithm)


@requires_mpi
@pytest.mark.mpi
def test_the_measured_backward_is_traced_without_the_communication_its_hooks_run():
    """The real backend runs the programs inside the gradient hooks (as DDP's
    reducer does): the backward's trace records are the spans between the
    hooks, so the 'main' phase is the forward and backward alone, as the
    simulator traces it (the record had spanned the whole allreduce)."""
    from simsparse.experiments.run.measure import measure_points

    points = [point("whole", "rabenseifner", P=2, batch_size=2, iterations=2, warmup=1),
              point("dense_ovlp", "ring", P=2, batch_size=2, iterations=2, warmup=1)]
    for p, m in zip(points, measure_points(points, device="cpu", trace=True)):
        for r, it in {(t["rank"], t["iteration"]) for t in m.trace}:
            mine = [t for t in m.trace if (t["rank"], t["iteration"]) == (r, it)]
            bwd = [(t["start_s"], t["end_s"]) for t in mine if t["op"] == "backward"]
            msgs = [(t["start_s"], t["end_s"]) for t in mine if t["op"] in ("send", "recv")]
            assert bwd and msgs, p.schedule
            assert not [(a, b) for a, b in bwd for c, d in msgs if a < c < b or a < d < b], p.schedule


def test_trace_has_a_device_lane_and_one_lane_per_bucket():
    out = simulate_point(point("mgs_sgd", "topka", P=2, iterations=1, warmup=0), trace=True)
    lanes = {t["lane"] for t in out.trace}
    groups = out.row["merged_groups"]
    assert lanes == {"main"} | {f"comm/b{g}" for g in range(groups)}
    main_ops = {t["op"] for t in out.trace if t["lane"] == "main"}
    assert {"forward", "backward"} <= main_ops
    assert any(t["op"] == "send" and t["lane"].startswith("comm/") for t in out.trace)


@pytest.mark.parametrize("schedule,algorithm,fewer", [("topk_sgd", "topka", True), ("dense_ovlp", "rabenseifner", True),
                                                      ("mg_wfbp", "ring", False), ("wfbp", "ring", False)])
def test_a_buckets_gradients_at_once_are_the_gradients_in_turn(monkeypatch, schedule, algorithm, fewer):
    """A bucket's gradients in one request (the rank's main program alone on
    its device: the simulator chains the tensors' backward on the clocks
    each would have resumed at) and one tensor at a time: the same times,
    busy seconds and spans of the trace, bit for bit, with fewer events
    where a bucket of several tensors comes first (WFBP's buckets are one
    tensor each; MG-WFBP's later ones wait behind communication)."""
    from simsparse.backends.events.sim import SimContext

    pt = point(schedule, algorithm, P=3, iterations=2, warmup=1)
    got = {}
    for at_once in (True, False):
        if not at_once:
            monkeypatch.setattr(SimContext, "_grads_at_once", lambda self: False)
        got[at_once] = simulate_point(pt, trace=True)
    a, b = got[True], got[False]
    keys = [k for k in a.row if k.startswith(("t_", "time")) or k in ("correct", "bytes_max")]
    assert {k: a.row[k] for k in keys} == {k: b.row[k] for k in keys}
    def spans(out):   # (in the order the ranks recorded them: interleaved differently)
        return sorted(tuple(sorted(t.items())) for t in out.trace)
    assert spans(a) == spans(b)
    assert (a.row["sim_events"] < b.row["sim_events"]) if fewer else (a.row["sim_events"] <= b.row["sim_events"])


@pytest.mark.parametrize("schedule,algorithm", [("topk_sgd", "topka"), ("dense_ovlp", "rabenseifner")])
def test_the_compiled_chain_of_backward_spans_is_its_python_twin(monkeypatch, schedule, algorithm):
    """Untraced, a bucket's gradients at once run the clock compiled
    (``sim_model._chain``): the same row, events and busy seconds included,
    as the Python loop."""
    import simsparse.backends.events.model as sm

    if sm._CHAIN is None:
        pytest.skip("numba disabled")
    pt = point(schedule, algorithm, P=3, iterations=2, warmup=1)
    a = simulate_point(pt).row
    monkeypatch.setattr(sm, "_CHAIN", None)
    b = simulate_point(pt).row
    drop = ("wall_s", "started_at", "host", "worker")
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


@pytest.mark.parametrize("model", ["bert_base", "resnet50_imagenet", "vgg16_cifar10", "lstm_an4"])
def test_ddp_buckets_are_torchs_own_assignment(model):
    """The ddp schedule's buckets equal DDP's reducer's (torch.distributed's
    compute_bucket_assignment_by_size on the float32 gradients in backward order, with its
    default limits [1 MiB, 25 MiB]): bucket by bucket, the same tensors."""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    from simsparse.compute.models import model_table
    from simsparse.schedules.base import get_schedule

    sizes = [t["size"] for t in model_table(model)["tensors"]][::-1]   # backward order
    ddp = get_schedule("ddp")
    plan = ddp.plan(ddp.Params(), type("Costs", (), {"sizes": sizes})())
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20]
    groups, _ = dist._compute_bucket_assignment_by_size([torch.empty(s, device="meta") for s in sizes], limits)
    assert [len(g) for g in groups] == list(plan)
    assert [i for g in groups for i in g] == list(range(len(sizes)))   # consecutive: backward order kept


@pytest.mark.slow
def test_ddp_buckets_are_those_a_real_ddp_reduces(tmp_path):
    """World size 1 (gloo), a comm hook logging each bucket's parameters in the second
    iteration (after DDP rebuilt its buckets in the order gradients became ready): the same
    buckets as the ddp schedule's plan, for ResNet-20 and ResNet-18. (LSTM-PTB's tied
    embedding makes its ready order differ from the backward order the plan assumes.)"""
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    from torch.nn.parallel import DistributedDataParallel

    import simsparse.models as models
    from simsparse.schedules.base import get_schedule

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        for name in ("resnet20_cifar10", "resnet18_cifar10"):
            torch.manual_seed(0)
            model = models.build(name)
            index = {id(p): i for i, p in enumerate(model.parameters())}
            ddp = DistributedDataParallel(model)
            seen = []

            def log(state, bucket, seen=seen, index=index):
                seen.append([index[id(p)] for p in bucket.parameters()])
                done = torch.futures.Future()
                done.set_result(bucket.buffer())
                return done

            ddp.register_comm_hook(None, log)
            for it in range(2):
                seen.clear()
                models.loss(name, ddp, models.example_batch(name, 2, generator=torch.Generator().manual_seed(it))).backward()
            sizes = [p.numel() for p in model.parameters()][::-1]
            plan = get_schedule("ddp").plan(get_schedule("ddp").Params(), type("Costs", (), {"sizes": sizes})())
            assert [len(g) for g in sorted(seen, key=lambda g: -max(g))] == list(plan), name
    finally:
        dist.destroy_process_group()
