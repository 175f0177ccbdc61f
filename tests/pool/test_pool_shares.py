"""A pool's shares and its admission check, as plain arithmetic (engine.pool.shares):
no model, no threads. The numbers are those of tests/pool/test_pool.py's real pools."""

from __future__ import annotations

import pytest

from engine.errors import ConfigError
from engine.pool.shares import (
    MIN_SHARE,
    NEW,
    QUESTION_ROOM,
    SLACK,
    ShareRule,
    Want,
    check_settings,
    chunk_in_share,
    job_wants,
)

WHOLE = 512 + 128  # a session's budget and chunk
LONG = WHOLE + QUESTION_ROOM  # what a job longer than a session wants


def test_by_length_a_short_job_takes_what_it_needs_and_the_long_ones_split_the_rest():
    rule = ShareRule(1200)
    short = Want(100 + SLACK, evicts=True)
    assert rule.shares({0: short, 1: Want(LONG, True)}) == {0: 116, 1: LONG}
    half = (1200 - 116) // 2
    shares = rule.shares({0: short, 1: Want(LONG, True), 2: Want(LONG, True)})
    assert shares == {0: 116, 1: half, 2: half} and half >= MIN_SHARE


def test_by_length_a_tie_gives_the_odd_cell_to_the_higher_id():
    rule = ShareRule(1001)
    assert rule.shares({1: Want(600, True), 0: Want(600, True)}) == {0: 500, 1: 501}


def test_even_shares_ignore_what_each_needs():
    rule = ShareRule(1024, share="even")
    assert rule.shares({0: Want(116, True)}) == {0: 1024}  # alone: the whole pool
    assert rule.shares({0: Want(116, True), 1: Want(LONG, True)}) == {0: 512, 1: 512}


def test_streams_give_each_what_it_wants_up_to_its_stream():
    rule = ShareRule(1024, layout="streams", stream_cells=512)
    assert rule.shares({0: Want(116, True), 1: Want(LONG, True), 2: Want(600, False)}) == {
        0: 116,
        1: 512,
        2: 512,
    }
    assert rule.most == 512


def test_a_sequence_that_never_evicts_gets_what_it_wants_and_the_rest_split_what_is_left():
    for share in ("length", "even"):
        rule = ShareRule(1200, share=share)
        shares = rule.shares({0: Want(600, False), 1: Want(LONG, True), 2: Want(LONG, True)})
        assert shares == {0: 600, 1: 300, 2: 300}, share
    assert ShareRule(1200).shares({0: Want(600, False)}) == {0: 600}


def test_admission_gives_the_new_share_and_the_running_ones_new_shares():
    rule = ShareRule(1200)
    running = {0: Want(116, True), 1: Want(LONG, True)}
    share, others = rule.admit(running, Want(LONG, True, MIN_SHARE))
    assert share == 542 and others == {0: 116, 1: 542}
    assert NEW not in others


def test_admission_is_refused_when_a_share_would_fall_under_its_floor():
    rule = ShareRule(600)
    # two shares of 300 are under MIN_SHARE: the second waits in line
    assert rule.admit({0: Want(LONG, True)}, Want(LONG, True, MIN_SHARE)) is None
    assert rule.admit({}, Want(LONG, True, MIN_SHARE)) == (600, {})
    # the new one's floor is what it asks for at least
    assert ShareRule(1000).admit({0: Want(LONG, True)}, Want(LONG, True, 600)) is None
    # a running one reading a long question needs more than MIN_SHARE
    reading = Want(LONG, True, least=550)
    assert reading.floor == 550
    assert ShareRule(1000).admit({0: reading}, Want(LONG, True, MIN_SHARE)) is None
    assert ShareRule(1000).admit({0: Want(LONG, True)}, Want(LONG, True, MIN_SHARE))


def test_admission_is_refused_when_sequences_that_never_evict_would_overfill_the_pool():
    rule = ShareRule(1000)
    first = Want(600, False, 600)
    assert first.floor == 600
    # each would get its 600 cells, but 1,200 promised cells are more than the pool
    assert rule.admit({0: first}, Want(600, False, 600)) is None
    assert rule.admit({}, first) == (600, {})
    # one stream each: nothing is shared, so both fit
    streams = ShareRule(1200, layout="streams", stream_cells=600)
    assert streams.admit({0: first}, Want(600, False, 600)) == (600, {0: 600})


def test_streams_floors_stop_at_the_stream():
    rule = ShareRule(1024, layout="streams", stream_cells=512)
    share, _ = rule.admit({0: Want(LONG, True, least=600)}, Want(LONG, True, 600))
    assert share == 512


def test_a_request_that_could_never_fit():
    assert ShareRule(1200).never_fits(1300, evicts=False)
    assert ShareRule(1200).never_fits(1300, evicts=True)
    assert not ShareRule(1200).never_fits(1200, evicts=False)
    streams = ShareRule(1024, layout="streams", stream_cells=512)
    assert streams.never_fits(600, evicts=False)
    assert not streams.never_fits(600, evicts=True)  # it reads on in its stream


def test_a_job_wants_itself_whole_or_a_session_and_the_question_room():
    assert job_wants(100, WHOLE, evicts=True) == (116, 116)
    assert job_wants(5000, WHOLE, evicts=True) == (LONG, MIN_SHARE)
    assert job_wants(584, WHOLE, evicts=False) == (600, 600)
    assert job_wants(5000, WHOLE, evicts=False) == (5016, 5016)


def test_the_chunk_shrinks_with_a_small_share():
    assert chunk_in_share(542, 128) == (542 - QUESTION_ROOM) // 5
    assert chunk_in_share(2000, 128) == 128
    assert chunk_in_share(MIN_SHARE, 128) == 51
    assert chunk_in_share(100, 128) == 32


@pytest.mark.parametrize(
    ("cells", "max_seqs", "share", "layout", "match"),
    [
        (1024, 0, "length", "shared", "parallel sequences"),
        (1024, 65, "length", "shared", "parallel sequences"),
        (1024, 2, "fair", "shared", "share must be"),
        (1024, 2, "length", "split", "layout must be"),
        (MIN_SHARE - 1, 2, "length", "shared", "at least"),
    ],
)
def test_settings_that_cannot_work_are_refused(cells, max_seqs, share, layout, match):
    with pytest.raises(ConfigError, match=match):
        check_settings(cells, max_seqs, share, layout)
    check_settings(MIN_SHARE, 64, "even", "streams")
