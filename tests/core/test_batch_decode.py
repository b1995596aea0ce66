"""core/batch_decode.py: results in input order, streamed while the queue is still being read, and
no finished result lost when a later prompt fails. Batch invariance itself is
tests/core/round/test_batch_round.py's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine
from tiny_models import build_pair


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(make_profile(*build_pair(tmp_path_factory.mktemp("batch_decode"), noisy=0.1), k=3))


def spec(engine: Engine, max_tokens: int):
    return replace(engine.profile.sampling, max_tokens=max_tokens)


def counted_queue(engine, prompts, lengths, taken: list[int]):
    """The prompts with their max_tokens, noting in `taken` each index as the batch reads it."""
    for i, (ids, n) in enumerate(zip(prompts, lengths)):
        taken.append(i)
        yield ids, spec(engine, n)


def test_results_stream_in_input_order(engine):
    """A long first prompt: later ones finish first but wait for it; results come out while the
    queue is still being read."""
    prompts = random_prompts(200, 9, seed=5)
    lengths = [30] + [4] * 8
    taken: list[int] = []
    queue = counted_queue(engine, prompts, lengths, taken)
    seen = []
    for index, finished in engine.batch_decoder(2).run(queue):
        seen.append((index, len(taken)))
        alone = engine.decoder(replace(engine.profile, sampling=spec(engine, lengths[index])))
        assert finished.token_ids == finish(alone, prompts[index]).token_ids
    assert [index for index, _ in seen] == list(range(9))
    assert seen[0][1] < 9  # the first result came out before the queue was read to its end


def test_results_held_for_a_long_prompt_are_bounded_by_the_batch(engine):
    """A long first prompt and many short ones behind it: free rows stop taking prompts once
    WAITING x B results wait for it, so the queue is read no further than that while it runs; all
    come out in order, each as alone."""
    from specgen.core.batch_decode import WAITING

    prompts = random_prompts(200, 30, seed=8)
    lengths = [60] + [2] * 29
    taken: list[int] = []
    queue = counted_queue(engine, prompts, lengths, taken)
    seen = []
    for index, finished in engine.batch_decoder(2).run(queue):
        seen.append((index, len(taken), finished.token_ids))
    assert [index for index, _, _ in seen] == list(range(30))
    assert seen[0][1] <= 1 + (WAITING + 1) * 2  # prompt 0, the results waiting for it, one more per row
    for index in (0, 1, 29):
        alone = engine.decoder(replace(engine.profile, sampling=spec(engine, lengths[index])))
        assert seen[index][2] == finish(alone, prompts[index]).token_ids


def test_prompts_taken_finish_when_the_queue_fails(engine):
    """Prompt 0 still running, 1 to 3 finished behind it, then the queue fails: it is read no
    further, 0 runs to its end, 0 to 3 come out (in order), then the error."""
    prompts = random_prompts(200, 4, seed=6)

    def queue():
        yield prompts[0], spec(engine, 40)
        for ids in prompts[1:]:
            yield ids, spec(engine, 3)
        raise RuntimeError("the prompts file could not be read on")

    seen = []
    with pytest.raises(RuntimeError, match="could not be read on"):
        for index, finished in engine.batch_decoder(2).run(queue()):
            seen.append((index, finished.reason))
    assert seen == [(0, "length"), (1, "length"), (2, "length"), (3, "length")]


def test_ctrl_c_hands_over_the_prompts_in_flight_as_far_as_they_got(engine):
    """Ctrl-C while prompt 0 runs and 1 to 3 wait behind it: all four come out, in order, 0 as
    interrupted with the tokens it had."""
    prompts = random_prompts(200, 4, seed=6)

    def queue():
        yield prompts[0], spec(engine, 40)
        for ids in prompts[1:]:
            yield ids, spec(engine, 3)
        raise KeyboardInterrupt

    seen = []
    with pytest.raises(KeyboardInterrupt):
        for index, finished in engine.batch_decoder(2).run(queue()):
            seen.append((index, finished.reason, finished.token_ids))
    assert [(index, reason) for index, reason, _ in seen] == [(0, "interrupted"), (1, "length"), (2, "length"),
                                                            (3, "length")]
    whole = finish(engine.decoder(replace(engine.profile, sampling=spec(engine, 40))), prompts[0]).token_ids
    assert 0 < len(seen[0][2]) < 40 and whole[:len(seen[0][2])] == seen[0][2]
