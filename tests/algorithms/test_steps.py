"""The schedules of simsparse.algorithms.steps: one function gives one
rank's steps and every rank's, and they fit together (every send meets a
receive of the same blocks, in the same step)."""
import numpy as np
import pytest

from simsparse.algorithms.steps import (RABENSEIFNER, RD_ALLGATHER, RECURSIVE_DOUBLING, RING, RING_ALLGATHER, Fold,
                                        at)

SCHEDULES = {"ring": RING, "recursive_doubling": RECURSIVE_DOUBLING, "rabenseifner": RABENSEIFNER,
             "ring_allgather": RING_ALLGATHER, "rd_allgather": RD_ALLGATHER}


def one_rank(schedule, P):
    """Per step, every rank's own view: (to, blocks sent, from, blocks received)."""
    views = [list(schedule.steps(P, r)) for r in range(P)]
    assert len({len(v) for v in views}) == 1
    return views


def blocks(lo, hi, skip):
    return [q for q in range(int(lo), int(hi)) if q != skip]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("P", [1, 2, 3, 5, 6, 8, 13, 64])
def test_one_rank_and_all_ranks_are_the_same_steps(name, P):
    sched = SCHEDULES[name]
    views = one_rank(sched, P)
    all_steps = list(sched.steps(P, np.arange(P)))
    assert len(all_steps) == len(views[0])
    messages = 0
    for k, st in enumerate(all_steps):
        for r in range(P):
            mine = views[r][k]
            assert int(np.broadcast_to(st.to, P)[r]) == mine.to
            assert int(np.broadcast_to(st.frm, P)[r]) == mine.frm
            if mine.to >= 0:   # the receiver takes the blocks the sender sends
                messages += 1
                theirs = views[mine.to][k]
                assert theirs.frm == r and theirs.kernel == mine.kernel
                assert blocks(mine.lo, mine.hi, mine.skip) == blocks(theirs.rlo, theirs.rhi, theirs.rskip)
                idx = np.array([r])
                assert (at(st.lo, idx)[0], at(st.hi, idx)[0]) == (mine.lo, mine.hi)
    assert messages == sum(len(src) for _, src, _ in sched.all(P))


@pytest.mark.parametrize("P", [2, 3, 5, 8, 13])
def test_rd_allgather_gathers_every_block_once(P):
    """Replaying the steps' blocks: every rank ends with all P blocks, and
    never receives one it has."""
    views = one_rank(RD_ALLGATHER, P)
    have = [{r} for r in range(P)]
    for k in range(len(views[0])):
        got = {r: blocks(v[k].rlo, v[k].rhi, v[k].rskip) for r, v in enumerate(views) if v[k].frm >= 0}
        for r, v in enumerate(views):
            if v[k].to >= 0:
                assert set(blocks(v[k].lo, v[k].hi, v[k].skip)) <= have[r]
        for r, bs in got.items():
            assert not (set(bs) & have[r])
            have[r] |= set(bs)
    assert all(h == set(range(P)) for h in have)


@pytest.mark.parametrize("P", [1, 2, 3, 6, 7, 12])
def test_fold_maps_ranks_and_participants_both_ways(P):
    f = Fold(P)
    nr = f.newrank(np.arange(P))
    assert [f.newrank(r) for r in range(P)] == nr.tolist()
    assert sorted(nr[nr >= 0].tolist()) == list(range(f.pof2))
    for p in range(f.pof2):
        assert f.newrank(f.real(p)) == p and f.ranks_of(p)[-1] == f.real(p)
