"""A session's size in cells, alone or as a pool's share (engine.session.sizing)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.policies import make_policy
from engine.session.sizing import MIN_CHUNK, OwnContext, PoolShare


def test_a_lone_session_holds_budget_and_chunk_rounded_as_llama_cpp_does():
    own = OwnContext(make_policy("snapkv"), 1000, 250)
    assert (own.capacity, own.n_ctx_max, own.budget) == (1250, 1280, 1000)
    assert own.limits(40) == (1240, 1000), "the question's cells come off the text's"
    assert own.grows and not own.follows_share


def test_a_policy_that_never_evicts_holds_the_budget_alone():
    own = OwnContext(make_policy("full"), 1000, 250)
    assert (own.capacity, own.n_ctx_max, own.budget) == (1000, 1024, 1000)


def test_a_pool_share_bounds_the_session_and_follows_the_pool():
    policy = make_policy("snapkv")
    slot = SimpleNamespace(n_ctx=2000, least=0, stats=None)
    share = PoolShare(policy, 1024, 256, slot=slot)
    assert (share.capacity, share.n_ctx_max, share.budget) == (1280, 2000, 1024)
    slot.n_ctx = 600  # others came: the share shrank
    assert share.capacity == 600 and share.budget == 600 - 256
    limit, target = share.limits(64)
    assert limit == 536 and target == min(share.budget, limit - MIN_CHUNK)
    slot.n_ctx = 40  # below what the policy protects: it still keeps those
    floor = policy.protected(1024) + 1
    assert share.limits(0)[1] == floor
    share.reading(64)
    assert slot.least == 64 + policy.protected(1024) + 1 + MIN_CHUNK
    share.report("stats")
    assert slot.stats == "stats" and not share.grows and share.follows_share


def test_a_job_is_read_whole_only_where_its_cells_stay_its_own():
    """``keeps``: a lone session keeps what fits its capacity; in a pool, a job read in
    one go must also sit under the share's floor, which others coming never cut."""
    from engine.pool.slot import Slot

    policy = make_policy("snapkv")
    lone = OwnContext(policy, 512, 256)
    assert lone.keeps(lone.capacity) and not lone.keeps(lone.capacity + 1)
    slot = SimpleNamespace(n_ctx=2048, least=0, floor=222)
    share = PoolShare(policy, 1024, 256, slot=slot)
    assert share.keeps(206) and share.keeps(222) and not share.keeps(223)
    # the pool's own floor: a job wanting at most MIN_SHARE cells keeps all it wants
    real = Slot.__new__(Slot)
    real.want, real.evicts, real.least = 222, True, 0
    assert real.floor == 222
    real.want = 900
    assert real.floor == 320  # MIN_SHARE: a longer job may be shrunk to it, so it evicts
