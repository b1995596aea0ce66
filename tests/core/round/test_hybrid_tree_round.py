"""Hybrid token trees (core/round/tree_round.py, merged_tree.py): each round is the lookup's trie
merged with the model's tree where prompt lookup finds continuations, else the model's tree alone
(the draft model's, or an EAGLE-3 head's), both programs of one TreeRound, on tiny fp32 models.

Greedy and Gumbel-coupled hybrid trees give target-only's tokens, and both kinds of round occur;
sampled rejection coupling (drawn children in the model's rounds; in the merged ones the lookup's
one-hot children as point masses before the drawn) is seed-stable; after every merged round the
draft model's cache, position and pending pair are a chain's after the same tokens, and an EAGLE-3
head's cache is a fresh head's over the committed sequence; a merged round's tree holds the
lookup's trie and the model's tree; insight stages the lookup's rows' q as 1.
On a GPU: captured hybrid tree rounds give target-only's tokens.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from decode_helpers import assert_first_two_tokens_follow_p, finish, make_profile, next_token_probs, warped_next
from specgen.core.engine import Engine, target_only
from specgen.core.events import RoundEvent
from specgen.core.drafters.merge_rule import PROBE
from specgen.core.drafters.ngram import LookupTree, TreeLookup
from specgen.core.round import Mode, TreeRound
from specgen.core.round.head_tree import HeadTreeDraft
from specgen.core.round.host_tree import HostTree
from specgen.core.round.merged_tree import MergedTree
from specgen.core.round.tree_round import TreeDraft
from specgen.core.runner import EagerRunner
from specgen.core.settings import ProposerSpec
from lookup_helpers import Following, OracleLookup, lookup_prompts
from tiny_models import build_pair, head_for

SHAPES = [(3, 2, 5), (4, 3, 12)]  # (k, width, nodes)
AUX = (0, 1, 1)  # head_for's aux layers on the tiny 2-layer target
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("hybrid_trees"), noisy=0.1)


@pytest.fixture(scope="module")
def head(pair, tmp_path_factory):
    return head_for(pair[0], tmp_path_factory.mktemp("hybrid_tree_head") / "head")


def hybrid_profile(pair, k: int, width: int, nodes: int, head=None, backend: str = "torch", merge: str = "always",
                   **sampling):
    """merge: [speculation] hybrid_merge (always: every lookup round merged, as most tests here
    check the merged tree; never: the lookup's trie alone; auto: core/drafters/merge_rule.py)."""
    sampling.setdefault("max_tokens", 32)
    with_ = dict(hybrid_with="eagle", head=str(head)) if head is not None else {}
    proposer = ProposerSpec(kind="hybrid", ngram_min=1, ngram_max=3, **with_)
    return make_profile(pair[0], None if head is not None else pair[1], k=k, backend=backend, proposer=proposer,
                        speculation=dict(tree_width=width, tree_nodes=nodes, hybrid_merge=merge), **sampling)


def assert_hybrid_tree(decoder, model_drafter, merge: str) -> None:
    """One TreeRound, a program for each tree the merge choice takes: the model's tree (MODEL),
    the merged one (MERGED: the lookup's trie and the same model drafter's tree) and the
    lookup's trie alone (HOST: the same model drafter following)."""
    rnd = decoder.round
    assert isinstance(rnd, TreeRound) and isinstance(decoder.lookup, TreeLookup)
    want = {Mode.MODEL, *[Mode.MERGED] * (merge != "never"), *[Mode.HOST] * (merge != "always")}
    assert set(decoder.programs) == want and decoder.merge.choice == merge
    model, merged, alone = rnd.drafters[Mode.MODEL], rnd.drafters[Mode.MERGED], rnd.drafters[Mode.HOST]
    assert isinstance(model, model_drafter) and isinstance(merged, MergedTree) and isinstance(alone, HostTree)
    assert merged.model is model and alone.follower.model is model


def check_identity(pair, head=None, shapes=SHAPES, backend: str = "torch", oracle: bool = False,
                   merge: str = "always", **sampling) -> dict:
    """Every shape's tokens are target-only's; returns the rounds each proposer drafted. oracle:
    the lookup is an OracleLookup (host rounds that accept up to k drafts), else the ngram's."""
    engine = Engine(hybrid_profile(pair, *shapes[0], head=head, backend=backend, merge=merge, **sampling))
    batch = lookup_prompts(engine.pair.vocab_size, 6, seed=len(sampling))
    reference = [finish(engine.decoder(target_only(engine.profile)), p).token_ids for p in batch]
    rounds = {"ngram": 0, "draft": 0}
    for shape in shapes:
        profile = hybrid_profile(pair, *shape, head=head, backend=backend, merge=merge, **sampling)
        for prompt, want in zip(batch, reference):
            decoder = engine.decoder(profile)
            assert_hybrid_tree(decoder, TreeDraft if head is None else HeadTreeDraft, merge)
            if oracle:
                decoder.lookup = OracleLookup(engine.pair.target, engine.pair.vocab_size, shape[0])
            if engine.backend.name == "cuda":  # both programs captured, not run eagerly
                assert all(getattr(program, "eager", None) is None and program.graphs
                           for program in decoder.programs.values())
            done = finish(decoder, prompt)
            assert done.token_ids == want, (shape, prompt)
            assert sum(decoder.proposer_rounds.values()) == done.stats.rounds
            for kind, count in decoder.proposer_rounds.items():
                rounds[kind] += count
    assert rounds["ngram"] > 5 and rounds["draft"] > 5, rounds  # both kinds of round really ran
    return rounds


MERGES = ["always", "never", "auto"]


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("oracle", [False, True])
def test_greedy_hybrid_trees_give_target_only_tokens(pair, oracle, merge):
    check_identity(pair, oracle=oracle, merge=merge)


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("oracle", [False, True])
def test_gumbel_hybrid_trees_give_target_only_text(pair, oracle, merge):
    check_identity(pair, oracle=oracle, merge=merge, temperature=0.9, top_p=0.95, coupling="gumbel", seed=7)


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("oracle", [False, True])
def test_greedy_hybrid_head_trees_give_target_only_tokens(pair, head, oracle, merge):
    check_identity(pair, head=head, oracle=oracle, merge=merge)


def test_gumbel_hybrid_head_trees_give_target_only_text(pair, head):
    check_identity(pair, head=head, shapes=SHAPES[1:], oracle=True, temperature=0.9, top_p=0.95,
                   coupling="gumbel", seed=7)


def test_sampled_rejection_hybrid_trees_are_seed_stable(pair):
    """The model's rounds draw their children and walk them recursively, the host's walk the
    lookup's one-hot siblings; the host draws every round's numbers whoever drafts it, so a seed
    gives one text, another seed another."""
    engine = Engine(hybrid_profile(pair, 4, 3, 10, merge="auto", temperature=0.8, top_k=40))
    prompt = lookup_prompts(engine.pair.vocab_size, 2, seed=5)[1]
    texts, rounds = {}, {"ngram": 0, "draft": 0}
    for seed in (1, 1, 2):
        decoder = engine.decoder(hybrid_profile(pair, 4, 3, 10, merge="auto", temperature=0.8, top_k=40, seed=seed))
        assert decoder.round.tree.sampled and decoder.round.coupling.q is not None
        got = finish(decoder, prompt).token_ids
        assert texts.setdefault(seed, got) == got
        for kind, count in decoder.proposer_rounds.items():
            rounds[kind] += count
    assert texts[1] != texts[2]
    assert rounds["ngram"] > 0 and rounds["draft"] > 0, rounds


class FirstRoundTree(Following):
    """A lookup whose first round's tree holds the target's likeliest next tokens (its top
    `width` under the request's warp) as the root's children, and the likeliest after the first
    of them below it; every later round finds nothing (the model drafts)."""

    def __init__(self, model, spec, width: int):
        self.model, self.spec, self.width = model, spec, width
        self.tokens: list[int] = []

    def lookup(self, k: int) -> LookupTree:
        self.asked += 1
        if self.asked > 1 or k <= 0:
            return LookupTree()
        top = warped_next(self.model, self.tokens, self.spec).topk(self.width).indices.tolist()
        below = int(warped_next(self.model, self.tokens + top[:1], self.spec).argmax())
        return LookupTree(top + [below], [-1] * self.width + [0])


class BeforeEachLaunch:
    """Wraps a decoder's programs: check(mode of the round before, or None) runs before each round
    launches, when the round before it has committed (the loop reads a round before it queues the
    next where a lookup proposes); records each round's mode."""

    def __init__(self, decoder, check):
        self.modes: list[Mode] = []
        decoder.programs = {mode: self._wrap(mode, program, check) for mode, program in decoder.programs.items()}

    def _wrap(self, mode, program, check):
        modes = self.modes

        class Checked:
            asynchronous = program.asynchronous

            def prepare(self, slots):
                program.prepare(slots)

            def launch(self, clock, slot=0):
                check(modes[-1] if modes else None)
                modes.append(mode)
                program.launch(clock, slot)

        return Checked()


class RightLookup(Following):
    """A lookup that finds the target's greedy continuation, k tokens, every round: the merged
    rounds' accepted paths are all the lookup's."""

    def __init__(self, model, k: int):
        self.model, self.k = model, k
        self.tokens: list[int] = []

    def lookup(self, k: int) -> LookupTree:
        branch = []
        for _ in range(max(k, 0)):
            branch.append(int(next_token_probs(self.model, self.tokens + branch).argmax()))
        return LookupTree(branch, list(range(-1, len(branch) - 1)))


def test_auto_merges_only_to_probe_where_the_lookup_wins_every_round(pair):
    """hybrid_merge auto: where the lookup's nodes win every merged round, its trie alone brings
    as many tokens for fewer bytes, so the rounds after the first merged one take the trie alone,
    merged again only every PROBE lookup rounds; the tokens stay target-only's."""
    k = 3
    engine = Engine(hybrid_profile(pair, k, 2, 6, merge="auto", max_tokens=160))
    prompt = lookup_prompts(engine.pair.vocab_size, 1, seed=9)[0]
    want = finish(engine.decoder(target_only(engine.profile)), prompt).token_ids
    decoder = engine.decoder()
    assert decoder.merge.ratio > 1
    decoder.lookup = RightLookup(engine.pair.target, k)
    launches = BeforeEachLaunch(decoder, lambda before: None)
    assert finish(decoder, prompt).token_ids == want
    modes = launches.modes
    merged = [i for i, mode in enumerate(modes) if mode is Mode.MERGED]
    assert merged[0] == 0 and set(modes) == {Mode.MERGED, Mode.HOST}, modes
    assert len(merged) > 2 and all(b - a == PROBE for a, b in zip(merged, merged[1:])), modes
    assert decoder.merge.merged_rounds == len(merged) and decoder.merge.lookup_rounds == len(modes) - len(merged)


def cached(runner, length: int) -> list[torch.Tensor]:
    return [t[0, :, :length].cpu() for t in (*runner.cache.keys, *runner.cache.values)]


@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=3)])
@pytest.mark.parametrize("merge", ["always", "never"])
def test_after_each_host_round_the_draft_is_a_chains(pair, sampling, backend, merge):
    """After every round, the lookup's rounds above all (merged, or the trie alone): the draft's
    cache holds the committed sequence but its last two ids, slot by slot as a chain prefill of
    those ids writes them (what a model round, or a chain's, leaves), its position is theirs and
    `pending` holds the last two, so the next model round starts where it would after a chain of
    the same tokens."""
    k = 4
    profile = hybrid_profile(pair, k, 3, 10, backend=backend, merge=merge, max_tokens=40, **sampling)
    engine = Engine(profile)
    draft, model = engine.draft_runner, engine.pair.draft
    looked = Mode.MERGED if merge == "always" else Mode.HOST
    checked = {Mode.MODEL: 0, looked: 0}
    emitted = set()  # by host rounds followed by a check

    for prompt in lookup_prompts(engine.pair.vocab_size, 4, seed=2):
        decoder = engine.decoder()
        decoder.lookup = OracleLookup(engine.pair.target, engine.pair.vocab_size, k)
        pending = decoder.round.drafters[Mode.MODEL].chain.pending
        length = [len(prompt)]  # the committed sequence's at the check before

        def check(before):
            committed = decoder.lookup.tokens  # the prompt and every token the rounds committed
            held = committed[:-2]
            assert int(draft.position) == len(held), (before, len(committed))
            assert pending[0].tolist() == committed[-2:], before
            chain = EagerRunner(model, engine.width)
            chain.forward(torch.tensor(held), want_logits=False)
            for got, want in zip(cached(draft, len(held)), cached(chain, len(held))):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            if before is not None:
                checked[before] += 1
                if before is looked:
                    emitted.add(len(committed) - length[0])
            length[0] = len(committed)

        launches = BeforeEachLaunch(decoder, check)
        finish(decoder, prompt)
        assert len(launches.modes) > 1
    assert checked[looked] > 5 and checked[Mode.MODEL] > 5, checked
    if not sampling:  # a host round of every length, the last two ids pending of its tokens or not
        assert emitted == set(range(1, k + 2)), emitted


@pytest.mark.parametrize("merge", ["always", "never"])
def test_after_host_rounds_the_heads_cache_is_a_fresh_heads(pair, head, merge):
    """Hybrid with an EAGLE-3 head: a host round extends the head over the round before's rows and
    gathers its own accepted path's (the target's tree step over the lookup's tree filled the tap),
    so after every round the head's rows below the last round's start hold what a fresh head
    computes over the committed sequence with the target's states."""
    from transformers import AutoModelForCausalLM

    from specgen.core.drafters.head_formats import load_head

    k = 3
    engine = Engine(hybrid_profile(pair, k, 3, 8, head=head, merge=merge, max_tokens=30))
    model = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    looked = Mode.MERGED if merge == "always" else Mode.HOST
    checked = {Mode.MODEL: 0, looked: 0}
    for prompt in lookup_prompts(engine.pair.vocab_size, 4, seed=6):
        decoder = engine.decoder()
        decoder.lookup = OracleLookup(engine.pair.target, engine.pair.vocab_size, k)
        rnd = decoder.round

        def check(before):
            if before is None:
                return
            sequence = decoder.lookup.tokens
            held = int(rnd.target.position - rnd.emitted)  # the last round's start: rows below it extended
            fresh = load_head(head, embedding=model.get_input_embeddings().weight, capacity=256)
            with torch.no_grad():
                states = model(torch.tensor([sequence[:-1]]), output_hidden_states=True).hidden_states
                features = torch.cat([states[i][0] for i in AUX], dim=-1)
                fresh(torch.tensor(sequence[1:held + 1]), features[:held], torch.arange(held))
            got = rnd.drafters[Mode.MODEL].head.head
            for mine, want in ((got.k_cache, fresh.k_cache), (got.v_cache, fresh.v_cache)):
                torch.testing.assert_close(mine[:, :, :held], want[:, :, :held], rtol=1e-4, atol=1e-4)
            checked[before] += 1

        BeforeEachLaunch(decoder, check)
        finish(decoder, prompt)
    assert checked[looked] > 2 and checked[Mode.MODEL] > 2, checked


class Recorded:
    """Wraps a lookup: each call's committed sequence and tree, in order."""

    def __init__(self, lookup):
        self.inner, self.calls = lookup, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def lookup(self, k: int):
        tree = self.inner.lookup(k)
        self.calls.append((list(self.inner.tokens), tree))
        return tree


def test_a_merged_round_holds_the_lookups_trie_and_the_models_tree(pair):
    """After each merged (host) round, the round's tree is the lookup's trie in rows 1 .. m, its
    root children first, then the model's nodes: the root's next lane holds the draft model's
    likeliest token after the committed sequence (greedy: its top-w), each model node hangs
    from the root through model nodes; `point` flags exactly the lookup's lanes."""
    k, w, n = 4, 3, 10
    engine = Engine(hybrid_profile(pair, k, w, n, max_tokens=30))
    merged = 0
    for prompt in lookup_prompts(engine.pair.vocab_size, 3, seed=4):
        decoder = engine.decoder()
        decoder.lookup = Recorded(OracleLookup(engine.pair.target, engine.pair.vocab_size, k))
        rnd = decoder.round
        host = rnd.drafters[Mode.MERGED]

        def check(before):
            nonlocal merged
            if before is not Mode.MERGED:
                return
            committed, looked = decoder.lookup.calls[-2]  # [-1]: the round about to launch
            m, tree = len(looked), rnd.tree
            ids, parents, children = tree.ids[0].tolist(), tree.parents.tolist(), tree.children.tolist()
            assert ids[1 : m + 1] == looked.tokens and [p - 1 for p in parents[1 : m + 1]] == looked.parents
            a = sum(1 for p in looked.parents if p < 0)
            assert 0 < a < w and children[0][:a] == [r for r in range(1, m + 1) if parents[r] == 0]
            model_root = children[0][a]
            assert model_root > m, "the model's best child of the root is in every merged tree"
            best = int(next_token_probs(engine.pair.draft, committed).argmax())
            assert ids[model_root] == best
            model = [r for r in range(m + 1, n + 1) if any(r in kids for kids in children)]
            assert model_root in model
            for r in model:
                assert parents[r] == 0 or parents[r] in model
            point = [[c >= 0 and (r == 0 and lane < a or 1 <= r <= m) for lane, c in enumerate(kids)]
                     for r, kids in enumerate(children)]
            assert host.point.tolist() == point
            merged += 1

        BeforeEachLaunch(decoder, check)
        finish(decoder, prompt)
    assert merged > 5, merged


def test_insight_stages_the_lookups_rows_q_as_one(pair):
    """Insight takes hybrid trees: the same tokens as without it; a merged round's lookup rows
    (rows 1 .. m) have q = 1 (one-hot drafts), its model rows and a model round's q in (0, 1]."""
    engine = Engine(hybrid_profile(pair, 3, 3, 8, max_tokens=24, temperature=1.0, seed=4))
    host_rounds = 0
    for ids in lookup_prompts(engine.pair.vocab_size, 4, seed=3):
        plain = finish(engine.decoder(), ids)
        decoder = engine.decoder(insight=True)
        decoder.lookup = Recorded(decoder.lookup)
        launches = BeforeEachLaunch(decoder, lambda before: None)
        events = list(decoder.run(ids))
        assert events[-1].token_ids == plain.token_ids
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        for mode, r, (_, looked) in zip(launches.modes, rounds, decoder.lookup.calls):
            view = r.tree
            path = [view.tokens[row] for row in view.path]
            assert path == r.token_ids[: len(path)]
            m = len(looked) if mode in (Mode.HOST, Mode.MERGED) else 0
            assert view.tokens[1 : m + 1] == looked.tokens if m else True
            assert all(q == 1.0 for q in view.q[1 : m + 1])
            assert all(0 < q <= 1 for q in view.q[m + 1 :])
            host_rounds += mode is Mode.MERGED and len(view.q) > m + 1
    assert host_rounds > 0


@CUDA
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=7)])
def test_captured_hybrid_tree_rounds_give_target_only_tokens(pair, head, sampling):
    """On a GPU every program is captured (the model's tree, the merged one and the lookup's
    trie alone): greedy and Gumbel-coupled text is target-only's, with the draft model and with
    an EAGLE-3 head."""
    check_identity(pair, backend="cuda", merge="auto", **sampling)
    check_identity(pair, head=head, shapes=SHAPES[1:], backend="cuda", merge="auto", **sampling)
    check_identity(pair, shapes=SHAPES[1:], backend="cuda", merge="never", **sampling)


@pytest.mark.slow
def test_sampled_hybrid_tree_rounds_follow_the_target_distribution(pair):
    """Rejection coupling with drawn children: a merged round walks the lookup's one-hot children
    (the target's two likeliest tokens at the root: often accepted) as point masses, then the
    model's draw in the root's last lane against what is left. The first token comes from a
    merged round, the second from it or from the model's round after it: χ² of both against the
    target's warped p. α = 1e-4 per test: false failures below 2e-4."""
    profile = hybrid_profile(pair, 3, 3, 8, max_tokens=3, temperature=1.0, top_k=12)
    engine = Engine(profile)
    model, prompt = engine.pair.target, [7, 8, 9]
    outputs, modes = [], []
    for seed in range(1500):
        decoder = engine.decoder(replace(profile, sampling=replace(profile.sampling, seed=seed)))
        assert decoder.round.tree.sampled
        decoder.lookup = FirstRoundTree(model, profile.sampling, 2)
        launches = BeforeEachLaunch(decoder, lambda before: None)
        outputs.append(finish(decoder, prompt).token_ids)
        modes.append(launches.modes)
    assert all(m[0] is Mode.MERGED for m in modes) and sum(Mode.MODEL in m for m in modes) > 500
    assert_first_two_tokens_follow_p(outputs, model, prompt, profile.sampling)
