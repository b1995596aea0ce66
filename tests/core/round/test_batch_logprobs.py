"""core/round/batch_logprobs.py through core/batch_decode.py: each batch row's logprobs are the ones
its prompt gets alone.

Prompts of different lengths, max_tokens, seeds and sampling settings share a batch of 3 rows
(more prompts than rows: finished rows are refilled, ragged), and each prompt's Finished (its
tokens, and its logprob entries: every emitted token's logprob and its top-N alternatives) equals
batch 1's exactly, floats and all, and the single decode loop's for that prompt alone: the same
tokens and alternatives, the values within CLOSE, since on the torch backend a batch row's step
(attention over its cache row's slots) and the step alone (over the live keys) leave the logits a
few ulps apart; on the kernels a GPU runs they are the same bits, and so are the logprobs
(tests/gpu/test_batch_gpu.py, on the interpreter and on CUDA). Greedy, sampled under rejection
and Gumbel coupling, raw and warped modes, token trees (their path's rows), prompt lookup (chains
and trees), an EAGLE-3 head, a stop string that cuts a row's tokens, two rounds in flight (each
round's own host buffer), and rows that ask for different N, or none at all, side by side.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest

from dataclasses import replace

from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair, head_for

# Per-prompt settings sharing one batch (a greedy row among sampled ones included).
SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, top_k=20), dict(top_p=0.9), dict(min_p=0.1), dict(),
            dict(temperature=1.3), dict(top_p=0.8, top_k=5)]


CLOSE = 1e-4  # the torch backend's batch step and its step alone: logits a few ulps apart


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch-logprobs"), noisy=0.1)


def jobs(profile, count: int, sampled: bool, **each) -> list:
    """(ids, settings) of `count` prompts of 1 to 12 ids, each with its own max_tokens and seed."""
    prompts = random_prompts(200, count, seed=count)
    specs = [replace(profile.sampling, max_tokens=6 + 4 * (i % 4), seed=100 + i,
                     **(SETTINGS[i % len(SETTINGS)] if sampled else {}), **each) for i in range(count)]
    return list(zip(prompts, specs))


def alone(engine: Engine, work: list) -> list[tuple]:
    out = []
    for ids, spec in work:
        finished = finish(engine.decoder(replace(engine.profile, sampling=spec)), ids)
        out.append((finished.token_ids, finished.logprobs))
    return out


def batched(engine: Engine, batch: int, work: list) -> list[tuple]:
    results = list(engine.batch_decoder(batch).run(work))
    assert [index for index, _ in results] == list(range(len(work)))
    return [(finished.token_ids, finished.logprobs) for _, finished in results]


def check(engine: Engine, work: list, batch: int = 3) -> None:
    """Each prompt's tokens at B = `batch` equal B = 1's and the prompt's alone, and so do its logprob
    entries' ids and alternatives, the values within CLOSE: on the torch backend a CPU's matrix
    products may split rows by their number (a 16- and a 64-core CPU moved values by ulps between
    B = 3 and B = 1, a 2-core one did not); the kernels' exact equality is tests/gpu/test_batch_gpu.py's."""
    reference = alone(engine, work)
    for (ids, logprobs), (_, spec) in zip(reference, work):
        assert (logprobs is None) == (spec.logprobs is None)
        assert logprobs is None or len(logprobs) == len(ids)
    assert any(logprobs for _, logprobs in reference)
    one = batched(engine, 1, work)
    for (ids, logprobs), (one_ids, one_logprobs), (alone_ids, alone_logprobs) in zip(batched(engine, batch, work),
                                                                                   one, reference):
        assert ids == one_ids == alone_ids
        assert close(logprobs, one_logprobs) and close(one_logprobs, alone_logprobs)


def close(got, want) -> bool:
    """The same entries (ids, alternatives, -inf where the warp removed an id), the values within CLOSE."""
    if isinstance(got, list):
        return isinstance(want, list) and len(got) == len(want) and all(close(a, b) for a, b in zip(got, want))
    if isinstance(got, dict):
        return got.keys() == want.keys() and all(close(got[key], want[key]) for key in got)
    if isinstance(got, float):
        return got == want or abs(got - want) <= CLOSE
    return got == want


@pytest.mark.parametrize("mode", ["warped", "raw"])
def test_greedy_rows_logprobs_equal_each_prompt_alone(pair, mode):
    engine = Engine(make_profile(*pair, k=3))
    check(engine, jobs(engine.profile, 7, sampled=False, logprobs=3, logprobs_mode=mode))


@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
@pytest.mark.parametrize("mode", ["warped", "raw"])
def test_sampled_rows_logprobs_equal_each_prompt_alone(pair, coupling, mode):
    """Each row's own temperature, top-k, top-p, min-p (its warped logprobs: its own cut)."""
    engine = Engine(make_profile(*pair, k=3, temperature=1.0, coupling=coupling))
    check(engine, jobs(engine.profile, 7, sampled=True, logprobs=4, logprobs_mode=mode))


def test_rows_with_other_logprobs_settings_share_a_batch(pair):
    """No logprobs, N = 0, 2, 5 and raw mode, row by row: each row its own (none where it asks none)."""
    engine = Engine(make_profile(*pair, k=3, temperature=1.0))
    asked = [dict(logprobs=2), dict(), dict(logprobs=0), dict(logprobs=5, logprobs_mode="raw"), dict(logprobs=5),
             dict(logprobs=2, logprobs_mode="raw"), dict()]
    work = [(ids, replace(spec, **own)) for (ids, spec), own in zip(jobs(engine.profile, 7, sampled=True), asked)]
    check(engine, work)


def test_stop_strings_and_two_rounds_in_flight(pair):
    """A stop string cuts a row's tokens and their logprobs where it cuts them alone; with two
    rounds in flight each round's logprobs are read from its own host buffer."""
    engine = Engine(make_profile(*pair, k=3, speculation=dict(pipeline="on")))
    work = jobs(engine.profile, 5, sampled=False, logprobs=2)
    text = finish(engine.decoder(replace(engine.profile, sampling=work[1][1])), work[1][0]).text
    work[1] = (work[1][0], replace(work[1][1], stop=(text[len(text) // 2:][:3],)))
    assert engine.batch_decoder(3).pipelined
    check(engine, work)


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, coupling="rejection"),
                                      dict(temperature=1.0, coupling="gumbel")], ids=["greedy", "rejection", "gumbel"])
def test_tree_rows_logprobs_equal_each_prompt_alone(pair, sampling):
    """Token trees: each row's logprobs read its accepted path's rows, as the tree round's alone."""
    engine = Engine(make_profile(*pair, k=3, speculation=dict(tree_width=2, tree_nodes=5), **sampling))
    check(engine, jobs(engine.profile, 7, sampled=bool(sampling), logprobs=3))


@pytest.mark.parametrize("speculation", [dict(), dict(tree_width=2, tree_nodes=5)], ids=["chains", "trees"])
@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0)], ids=["greedy", "sampled"])
def test_penalised_rows_logprobs_equal_each_prompt_alone(pair, speculation, sampling):
    """Penalties and min_tokens: each row's warped logprobs read the rows its verification warped
    (a chain's rows with its drafts counted, a tree's path rows with theirs), as alone; the
    penalties move them (power: the same prompts' logprobs without them differ)."""
    parts = dict(repetition_penalty=1.3, frequency_penalty=0.5, min_tokens=2)
    engine = Engine(make_profile(*pair, k=3, speculation=speculation, **sampling, **parts))
    work = jobs(engine.profile, 7, sampled=bool(sampling), logprobs=3)
    check(engine, work)
    plain = Engine(make_profile(*pair, k=3, speculation=speculation, **sampling))
    free = [(ids, replace(spec, repetition_penalty=1.0, frequency_penalty=0.0, min_tokens=0)) for ids, spec in work]
    assert alone(plain, free) != alone(engine, work)


@pytest.mark.parametrize("speculation", [dict(), dict(tree_width=2, tree_nodes=4)], ids=["chains", "trees"])
def test_lookup_rows_logprobs_equal_each_prompt_alone(pair, speculation):
    """Prompt lookup drafting every row (its chains, or its trees' accepted paths)."""
    engine = Engine(make_profile(*pair, k=3, proposer=ProposerSpec(kind="ngram"), speculation=speculation,
                                 temperature=1.0))
    check(engine, jobs(engine.profile, 5, sampled=True, logprobs=2))


def test_eagle_rows_logprobs_equal_each_prompt_alone(pair, tmp_path):
    """An EAGLE-3 head drafting every row (the target's rows as a chain's)."""
    head = head_for(pair[0], tmp_path / "head")
    engine = Engine(make_profile(pair[0], None, k=3, proposer=ProposerSpec(kind="eagle", head=str(head))))
    check(engine, jobs(engine.profile, 5, sampled=False, logprobs=2))
