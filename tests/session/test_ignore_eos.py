"""``ignore_eos`` (llama-server's and vLLM's request field, which benchmarks send): the
answer runs to its length, never choosing an end-of-generation token and never cut by
the loop guard; stop strings still end it."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Prompt
from engine.errors import ConfigError
from engine.session.generate import _sample_without
from engine.session.sampling import Sampler, Sampling
from engine.stats import Done

LOOP = Prompt("", "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", " 1", (), True)


def test_it_is_true_or_false():
    for bad in (1, "true", None):
        with pytest.raises(ConfigError, match="ignore_eos"):
            Sampling(ignore_eos=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_end_token_is_never_chosen(engine, temperature):
    eog = np.asarray(engine.model.eog_ids, dtype=np.int64)
    assert eog.size and all(engine.model.is_eog(int(t)) for t in eog)
    logits = np.zeros(engine.model.info.n_vocab, dtype=np.float32)
    logits[eog] = 30.0  # the model is sure it is done
    sample = Sampler(Sampling(temperature, seed=1))
    assert sample(logits) in set(eog.tolist())
    picks = {_sample_without(sample, eog, logits) for _ in range(20)}
    assert not picks & set(eog.tolist())
    assert logits[eog[0]] == 30.0  # the reader's logits are left as they were


def test_a_loop_runs_to_the_length_and_a_stop_string_still_ends_it(engine):
    with engine.session("snapkv", 1024) as s:
        cut = s.collect(s.run(LOOP, max_tokens=40, stops=()))
        whole = s.collect(s.run(LOOP, max_tokens=40, sampling=Sampling(ignore_eos=True)))
        stopped = s.collect(
            s.run(LOOP, max_tokens=40, sampling=Sampling(ignore_eos=True), stops=(" 1 1 1",))
        )
    assert cut.reason == "repetition" and cut.stats.generated_tokens < 40
    assert whole.reason == "length" and whole.stats.generated_tokens == 40
    assert whole.text.startswith(cut.text)
    assert stopped.reason == "stop" and stopped.stats.generated_tokens < 10


SENTENCE = "The cat sat on the mat and looked at the door. "
SAID_AGAIN = Prompt("", SENTENCE * 5, SENTENCE, (), True)


def test_the_answer_ends_with_the_counts_of_the_cache_it_leaves(engine):
    """A loop of a sentence said again is cut from the cache after its last token was
    yielded: the end's figures are those of the cache it leaves, not of that token."""
    for sampling in (Sampling(), Sampling(ignore_eos=True)):
        with engine.session("snapkv", 1024) as s:
            run = s.run(SAID_AGAIN, max_tokens=60, stops=(), sampling=sampling)
            seen = [(e, e.stats.cells_used) for e in run]
            used = s.cache.n_used
        done, _ = seen[-1]
        assert isinstance(done, Done)
        assert done.stats.cells_used == used
        if not sampling.ignore_eos:
            assert done.reason == "repetition"  # this model repeats the sentence (greedy)
            assert used < max(n for _, n in seen[:-1])  # the cut left the cache smaller
