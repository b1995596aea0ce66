"""Tree rounds drafted by prompt lookup (core/round/host_tree.py): the ngram proposer's trie verified in
one target step, on tiny fp32 models. Greedy and Gumbel-coupled trees give target-only's tokens;
sampled rejection coupling is seed-stable; the target's cache holds a chain's after the run; a
prompt whose suffix has two continuations accepts more per round with the tree than with the
chain; and a round whose lookup found nothing runs the round's empty program (Mode.EMPTY: the
target over the root alone), with the tokens and insight of the lookup tree's program."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from decode_helpers import (assert_first_two_follow_p, finish, make_profile, next_token_probs, random_prompts,
                            warped_next)
from specgen.core.decode import Decoder
from specgen.core.engine import Engine, target_only
from specgen.core.round import Mode, Round, TreeRound
from specgen.core.round.host_tree import HostTree
from specgen.core.drafters.ngram import NgramProposer, TreeLookup
from specgen.core.runner import EagerRunner
from specgen.core.settings import ProposerSpec
from lookup_helpers import lookup_prompts
from tiny_models import build_pair

SHAPES = [(4, 2, 6), (3, 3, 12), (5, 4, 24)]  # (k, width, nodes)
LOOKUP = ProposerSpec(kind="ngram", ngram_min=1, ngram_max=3)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("lookup_trees"), noisy=0.1)[0]


def lookup_profile(target, k: int, width: int, nodes: int, **sampling):
    sampling.setdefault("max_tokens", 40)
    return make_profile(target, None, k=k, proposer=LOOKUP, speculation=dict(tree_width=width, tree_nodes=nodes),
                        **sampling)


def repetitive_prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Pieces repeated with a change here and there: one n-gram, several continuations."""
    return lookup_prompts(vocab, count, seed, mixed=False)


def check_identity(target, **sampling) -> int:
    """Every shape's tokens are target-only's; returns the tokens the trees' rounds accepted."""
    engine = Engine(lookup_profile(target, *SHAPES[0], **sampling))
    prompts = repetitive_prompts(6, engine.pair.vocab_size, seed=len(sampling))
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in prompts]
    accepted = 0
    for shape in SHAPES:
        profile = lookup_profile(target, *shape, **sampling)
        for prompt, want in zip(prompts, reference):
            decoder = engine.decoder(profile)
            assert isinstance(decoder.round, TreeRound) and isinstance(decoder.round.drafter, HostTree)
            assert set(decoder.programs) == {Mode.HOST, Mode.EMPTY} and isinstance(decoder.lookup, TreeLookup)
            done = finish(decoder, prompt)
            assert done.token_ids == want, (shape, prompt)
            assert decoder.proposer_rounds == {"ngram": done.stats.rounds, "draft": 0}
            accepted += done.stats.accepted
    return accepted


def test_greedy_lookup_trees_give_target_only_tokens(target):
    assert check_identity(target) > 0  # the lookups proposed tokens the target kept


def test_gumbel_lookup_trees_give_target_only_text(target):
    check_identity(target, temperature=0.9, top_p=0.95, coupling="gumbel", seed=7)


def test_sampled_rejection_lookup_trees_are_seed_stable(target):
    """Rejection coupling walks the siblings of the one-hot children: the host draws the same
    numbers in the same order for a seed, so a seed gives one text; another seed, another text."""
    engine = Engine(lookup_profile(target, 4, 3, 10, temperature=0.8, top_k=40))
    prompt = repetitive_prompts(1, engine.pair.vocab_size, seed=5)[0]
    texts = {}
    for seed in (1, 1, 2):
        profile = lookup_profile(target, 4, 3, 10, temperature=0.8, top_k=40, seed=seed)
        decoder = engine.decoder(profile)
        assert isinstance(decoder.round.drafter, HostTree) and decoder.round.coupling.uniform is not None
        got = finish(decoder, prompt).token_ids
        assert texts.setdefault(seed, got) == got
    assert texts[1] != texts[2]


def test_the_target_cache_holds_a_chains_after_the_run(target):
    """The accepted paths compacted, the padding rows left behind: slot by slot as a chain prefill."""
    engine = Engine(lookup_profile(target, 4, 3, 12, max_tokens=30))
    prompt = repetitive_prompts(1, engine.pair.vocab_size, seed=3)[0]
    sequence = prompt + finish(engine.decoder(), prompt).token_ids
    held = sequence[:-1]
    runner = engine.target_runner
    assert int(runner.position) == len(held)
    chain = EagerRunner(engine.pair.target, engine.width)
    chain.forward(torch.tensor(held), want_logits=False)
    for got, want in zip((*runner.cache.keys, *runner.cache.values), (*chain.cache.keys, *chain.cache.values)):
        torch.testing.assert_close(got[0, :, : len(held)], want[0, :, : len(held)], rtol=1e-4, atol=1e-4)


def two_continuations(model, vocab: int) -> tuple[list[int], list[int]]:
    """(prompt, right): a prompt R s C s w s whose unigram s was followed by C (older) and w
    (latest), where the target's greedy continuation starts with C = `right`, and w differs. Found
    by iterating C <- the target's continuation (a fixed point of a tiny random model: seeds tried
    in order, so the prompt is the same on every run)."""
    def greedy(ids: list[int], n: int) -> list[int]:
        out = []
        for _ in range(n):
            out.append(int(next_token_probs(model, ids + out).argmax()))
        return out

    for seed in range(50):
        rng = random.Random(seed)
        head, s, w = [rng.randrange(vocab) for _ in range(5)], rng.randrange(vocab), rng.randrange(vocab)
        right = [rng.randrange(vocab), rng.randrange(vocab)]
        for _ in range(8):
            prompt = head + [s, *right, s, w, s]
            follow = greedy(prompt, 2)
            if follow == right and w != right[0] and s not in (w, *right) and len(set(head) & {s}) == 0:
                return prompt, right
            right = follow
    raise AssertionError("no prompt found")


def test_a_tree_accepts_more_per_round_than_the_chain_where_continuations_differ(target):
    """The chain proposes the latest continuation (w ...), which the target rejects at once; the
    tree also holds the older one, which the target follows: its first round accepts more."""
    profile = make_profile(target, None, k=3, proposer=ProposerSpec(kind="ngram", ngram_min=1, ngram_max=1),
                           max_tokens=4)
    engine = Engine(profile)
    prompt, right = two_continuations(engine.pair.target, engine.pair.vocab_size)
    chain_lookup = NgramProposer(1, 1)
    chain_lookup.start(prompt)
    assert chain_lookup.lookup(3)[0] != right[0]
    first = {}
    for width, nodes in ((1, 0), (2, 6)):
        shaped = replace(profile, speculation=replace(profile.speculation, tree_width=width, tree_nodes=nodes))
        decoder = engine.decoder(shaped)
        assert type(decoder.round) is (Round if width == 1 else TreeRound)
        events = list(decoder.run(prompt))
        assert events[-1].token_ids == finish(engine.decoder(target_only(shaped)), prompt).token_ids
        first[width] = events[0].num_accepted
    assert first[1] == 0 and first[2] >= len(right)


def test_a_fresh_host_tree_is_the_empty_tree(target):
    """A capture's warm-ups run the body before the host set any tree: what it reads then must be a
    tree (the empty one, rows at depth >= 1), or Gumbel coupling indexes noise row -1 (on a GPU a
    device-side assert in the captured program)."""
    engine = Engine(lookup_profile(target, 4, 3, 12, temperature=0.9, top_p=0.95, coupling="gumbel", seed=7))
    drafter = engine.decoder().round.drafter
    assert isinstance(drafter, HostTree)
    assert torch.equal(drafter.staged, drafter.pack([]).to(drafter.staged.device))
    assert int(drafter.depth.min()) >= 1 and int(drafter.budget) == 0


class Spied:
    """A decoder's launches, each with the modes it ran and the rows of the target's tree steps."""

    def __init__(self, engine, decoder):
        self.launched, self.rows = [], []
        for mode, program in decoder.programs.items():
            def launch(clock, slot=0, _launch=program.launch, _mode=mode):
                self.launched.append(_mode)
                return _launch(clock, slot)
            program.launch = launch
        runner, step_rows = engine.target_runner, engine.target_runner.step_rows
        runner.step_rows = lambda rows, logits: (self.rows.append(rows.count), step_rows(rows, logits))[1]


def same_floats(a, b) -> bool:
    """Equal ids and structure, floats within float32 rounding of each other (grown over a run)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_floats(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_floats(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == pytest.approx(b, rel=2e-3, abs=1e-5)
    return a == b


def mixed_prompts(vocab: int) -> list[list[int]]:
    """Prompts whose rounds' lookups find continuations, and random ones whose lookups mostly don't."""
    return repetitive_prompts(3, vocab, seed=11) + random_prompts(vocab, 3, seed=11)


SAMPLINGS = [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=7),
             dict(temperature=0.8, top_k=40, seed=3), dict(temperature=0.8, top_k=40, seed=3, repetition_penalty=1.3, logprobs=2)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "gumbel", "rejection", "penalties"])
def test_an_empty_lookup_round_steps_the_target_over_the_root_alone(target, sampling):
    """A round whose lookup found nothing runs the empty program, whose target step is one row (a
    lookup tree's round steps over the root and its n rows, padding included); its event emits
    one token and drafts nothing. The tokens, every event's fates and drafts, and with insight the
    trees (the root alone), are those of a decoder without the empty program (the lookup tree's
    program over an empty tree, the padding rows stepped): the same walk from the same numbers,
    over the root's logits from a step of one row rather than n + 1 (equal to float rounding)."""
    k, w, n = 4, 3, 12
    engine = Engine(lookup_profile(target, k, w, n, **sampling))
    decoder = engine.decoder(insight=True)
    rnd = decoder.round
    assert set(decoder.programs) == {Mode.HOST, Mode.EMPTY} and rnd.drafters[Mode.EMPTY].tree.n == 0
    # the same round, its lookup tree's program alone (as before Mode.EMPTY)
    full = Decoder(rnd, {Mode.HOST: decoder.programs[Mode.HOST]}, engine.tokenizer, decoder.setup,
                   TreeLookup(1, 3, w, n))
    spy = Spied(engine, decoder)
    modes = set()
    for prompt in mixed_prompts(engine.pair.vocab_size):
        spy.launched.clear(), spy.rows.clear()
        events = list(decoder.run(prompt))
        rounds = events[:-1]
        assert len(spy.launched) == len(spy.rows) == len(rounds)
        for mode, rows, event in zip(spy.launched, spy.rows, rounds):
            assert rows == (1 if mode is Mode.EMPTY else n + 1)
            if mode is Mode.EMPTY:
                assert event.num_drafted == 0 and len(event.token_ids) == 1 and event.drafted_ids == []
                assert event.tree.tokens == [event.tree.tokens[0]] and event.tree.path == []
        modes.update(spy.launched)
        assert decoder.proposer_rounds == {"ngram": len(rounds), "draft": 0}
        spy.launched.clear()
        before = list(full.run(prompt))
        assert Mode.EMPTY not in spy.launched and len(before) == len(events)
        assert before[-1].token_ids == events[-1].token_ids
        for old, new in zip(before[:-1], rounds):
            for field in ("token_ids", "fates", "drafted_ids", "ranks"):
                assert getattr(old, field) == getattr(new, field), field
            # the root's logits (and K/V) from a step of one row or of n + 1: equal to float rounding
            for field in ("draft_q", "target_p", "target_entropy", "logprobs"):
                assert same_floats(getattr(old, field), getattr(new, field)), field
            assert same_floats(old.tree.as_dict(), new.tree.as_dict())
    assert modes == {Mode.HOST, Mode.EMPTY}  # both kinds of round ran


def test_a_chain_ngram_round_has_no_empty_program(target):
    """Only the ngram proposer's tree rounds have one: a chain's ngram round keeps its one program
    (a hybrid tree round whose lookup finds nothing is the model's: test_hybrid_tree_round.py)."""
    engine = Engine(lookup_profile(target, 3, 1, 0))
    decoder = engine.decoder()
    assert type(decoder.round) is Round and set(decoder.programs) == {Mode.HOST}
    assert Mode.EMPTY not in decoder.round.drafters


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_empty_lookup_round_is_captured(target):
    """On a GPU the empty program is a captured program of its own (the root's one-row target
    step inside it), which the rounds whose lookups find nothing replay: target-only's tokens."""
    engine = Engine(lookup_profile(target, 4, 3, 12, backend="cuda"))
    decoder = engine.decoder()
    program = decoder.programs[Mode.EMPTY]
    assert program.eager is None and program.graphs and program is not decoder.programs[Mode.HOST]
    spy = Spied(engine, decoder)
    for prompt in mixed_prompts(engine.pair.vocab_size):
        want = finish(engine.decoder(target_only(engine.profile)), prompt).token_ids
        assert finish(decoder, prompt).token_ids == want
    assert Mode.EMPTY in spy.launched and Mode.HOST in spy.launched
    assert program.eager is None and program.graphs  # replayed, never fallen back to eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=7)])
def test_captured_lookup_tree_rounds_give_target_only_tokens(target, sampling):
    """On a GPU the lookup tree round (the staged tree's copies, the target's tree step, the walk,
    the compaction) is one captured program: greedy and Gumbel-coupled text is still target-only's."""
    engine = Engine(lookup_profile(target, 4, 3, 12, backend="cuda", **sampling))
    decoder = engine.decoder()
    assert engine.backend.name == "cuda" and all(getattr(program, "eager", None) is None and program.graphs
                                                 for program in decoder.programs.values())
    for prompt in repetitive_prompts(4, engine.pair.vocab_size, seed=9):
        want = finish(engine.decoder(target_only(engine.profile)), prompt).token_ids
        assert finish(engine.decoder(), prompt).token_ids == want


@pytest.mark.slow
def test_sampled_lookup_tree_rounds_follow_the_target_distribution(target):
    """Rejection coupling through whole lookup tree rounds (the sibling walk over the trie's one-hot
    children): χ² of the first emitted token, and of the next after the most common first, against
    the target's warped p. The prompt's unigram s was followed by the target's likeliest tokens,
    so the root's children carry much of p. α = 1e-4 per test: false failures below 2e-4."""

    profile = lookup_profile(target, 3, 3, 8, max_tokens=3, temperature=1.0, top_k=12)
    engine = Engine(profile)
    model = engine.pair.target
    head, s = [11, 12, 13], 14
    likely = [1, 2, 3]
    for _ in range(3):  # the children follow the target's likeliest next tokens, as far as that goes
        prompt = head + sum(([s, t] for t in likely), []) + [s]
        likely = warped_next(model, prompt, profile.sampling).topk(3).indices.tolist()
    lookup = TreeLookup(1, 3, 3, 8)
    lookup.start(prompt)
    assert len([p for p in lookup.lookup(3).parents if p == -1]) >= 2  # branches at the root
    assert_first_two_follow_p(engine, profile, prompt, model)
