"""Which drafter's nodes a hybrid tree round's accepted path took (core/round/tree_stage.py's
path_source, read by the decode loop from the staged ranks and the trie it staged), and what the
records, the statistics and inspect-acceptance's report make of it, on tiny fp32 models.

A lookup that drafts the target's own greedy continuation (cut after `right` tokens by a wrong
one) every other round: greedy, those rounds' accepted paths are the lookup's, exactly `right`
tokens of it; the rounds between are the model's tree alone. Runs of the other proposers tell no
source, and their records' JSON has no field for it. On a GPU, captured rounds tell the same.
"""

from __future__ import annotations

import json

import pytest

from decode_helpers import BACKENDS, make_profile, next_token_probs, random_prompts
from specgen.core.drafters.ngram import LookupTree
from specgen.core.engine import Engine
from specgen.core.events import RoundEvent
from specgen.core.insight import RunRecord, analyse, stats_of
from specgen.core.round.tree_stage import path_source
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair

K, WIDTH, NODES = 4, 3, 10


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("hybrid_source"), noisy=0.1)


def profile(pair, kind: str = "hybrid", backend: str = "torch", merge: str = "always", **sampling):
    """merge: hybrid_merge (always: the lookup's rounds are merged trees, whose lanes the source reads)."""
    sampling.setdefault("max_tokens", 30)
    proposer = ProposerSpec(kind=kind, ngram_min=1, ngram_max=3)
    return make_profile(*pair, k=K, backend=backend, proposer=proposer,
                        speculation=dict(tree_width=WIDTH, tree_nodes=NODES, hybrid_merge=merge), **sampling)


class TargetBranch:
    """Every other round (from the first) a trie of a branch, the target's greedy continuation's
    first `right` tokens (cycling 1 .. K) then one it does not take, and a second child of the
    root it does not take; the rounds between find nothing. Keeps each round's (trie, right)."""

    kind = "ngram"

    def __init__(self, model, vocab: int):
        self.model, self.vocab, self.asked = model, vocab, 0
        self.tries: list[tuple[LookupTree, int]] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.tokens = list(prompt_ids)

    def follow(self, committed: list[int]) -> None:
        self.tokens += committed

    def lookup(self, k: int) -> LookupTree:
        self.asked += 1
        right = 1 + (self.asked // 2) % K
        if k <= 0 or self.asked % 2 == 0 or right > k:
            self.tries.append((LookupTree(), 0))
            return LookupTree()
        branch = []
        for _ in range(right):
            branch.append(int(next_token_probs(self.model, self.tokens + branch).argmax()))
        if right < k:
            branch.append((int(next_token_probs(self.model, self.tokens + branch).argmax()) + 1) % self.vocab)
        wrong = (branch[0] + 2) % self.vocab
        tree = LookupTree(branch + [wrong], list(range(-1, len(branch) - 1)) + [-1])
        self.tries.append((tree, right))
        return tree


def test_path_source_reads_the_first_lane():
    trie = LookupTree([5, 6, 7], [-1, 0, -1])  # two children of the root: lanes 0 and 1
    assert path_source([1, 0], 2, trie) == ("lookup", 3)
    assert path_source([2], 1, trie) == ("model", 3)
    assert path_source([], 1, trie) == ("model", 3)  # a draw taken outside the tree: the model's
    assert path_source([], 0, trie) == ("none", 3)
    assert path_source([0, 1], 2, LookupTree()) == ("model", 0)  # a model round


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_round_says_whose_nodes_its_path_took(pair, backend):
    """On a GPU the rounds are captured: the same ranks staged, so the same sources."""
    engine = Engine(profile(pair, backend=backend))
    runs, told = [], {"lookup": 0, "model": 0}
    for prompt in random_prompts(engine.pair.vocab_size, 3, seed=4):
        decoder = engine.decoder(insight=True)
        lookup = decoder.lookup = TargetBranch(engine.pair.target, engine.pair.vocab_size)
        events = list(decoder.run(prompt))
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert len(rounds) == len(lookup.tries)
        for event, (trie, right) in zip(rounds, lookup.tries):
            assert event.lookup_nodes == len(trie)
            view = event.tree
            if right:  # the target takes the lookup's branch: `right` tokens of it, then its own
                assert (event.source, event.num_accepted) == ("lookup", right)
                assert event.token_ids[:right] == trie.tokens[:right]
                assert all(1 <= row <= len(trie) for row in view.path)  # the tree's rows 1 .. m
            else:  # the model's tree alone
                assert event.source == ("model" if event.num_accepted else "none")
                assert all(row > 0 for row in view.path)
            told[event.source] = told.get(event.source, 0) + 1
        runs.append(RunRecord.build("", events[-1], rounds, engine.tokenizer))
        stats = events[-1].stats
        assert stats.source_rounds == stats.tree_rounds == len(rounds)
        assert stats.merged_rounds == sum(1 for trie, _ in lookup.tries if trie)
        assert stats.lookup_accepted == sum(right for _, right in lookup.tries)
        assert stats.lookup_accepted + stats.model_accepted == stats.accepted
        assert f"lookup {stats.lookup_share:.0%} of accepted" in stats.tree_line()
    assert told["lookup"] > 3 and told["model"] > 3, told
    # the records keep it, through JSON, and the report adds it up
    again = [RunRecord.from_dict(json.loads(json.dumps(run.as_dict()))) for run in runs]
    assert [r.source for run in again for r in run.rounds] == [r.source for run in runs for r in run.rounds]
    report = analyse(again)["tree"]["hybrid"]
    stats = stats_of(runs)
    assert report["rounds"] == stats.rounds
    assert report["lookup"]["rounds"] + report["model"]["rounds"] + report["none"] == stats.rounds
    assert report["lookup"]["accepted"] == sum(r.num_accepted for run in runs for r in run.rounds
                                               if r.source == "lookup")
    assert report["lookup"]["accepted"] + report["model"]["accepted"] == stats.accepted
    assert report["lookup"]["share"] == pytest.approx(report["lookup"]["accepted"] / stats.accepted)
    for d in report["per_depth"]:
        assert d["lookup"] == sum(r.source == "lookup" and r.num_accepted >= d["depth"]
                                  for run in runs for r in run.rounds)
        assert d["lookup"] + d["model"] == stats.accepted_at[d["depth"] - 1]


@pytest.mark.parametrize("sampling", [
    dict(temperature=1.0, seed=2),  # the model's children drawn: the recursive walk, lookup lanes first
    dict(temperature=0.9, seed=5, draft_sampling="argmax"),  # the model's top-w: the sibling walk
    dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11),
])
def test_the_source_is_where_the_staged_path_went(pair, sampling):
    """Sampled: the source read from the ranks is the part whose rows the walk's path took, as
    insight staged them (the lookup's rows 1 .. m), or the model's where it took a draw outside
    the tree."""
    spec = dict(sampling)
    draft_sampling = spec.pop("draft_sampling", None)
    prof = profile(pair, **spec)
    if draft_sampling:
        from dataclasses import replace
        prof = replace(prof, speculation=replace(prof.speculation, draft_sampling=draft_sampling))
    engine = Engine(prof)
    told = {}
    for prompt in random_prompts(engine.pair.vocab_size, 3, seed=6):
        decoder = engine.decoder(insight=True)
        decoder.lookup = TargetBranch(engine.pair.target, engine.pair.vocab_size)
        for event in decoder.run(prompt):
            if not isinstance(event, RoundEvent):
                continue
            view, m = event.tree, event.lookup_nodes
            if not event.num_accepted:
                want = "none"
            elif view.path:
                want = "lookup" if view.path[0] <= m else "model"
            else:
                assert view.taken is not None
                want = "model"
            assert event.source == want, (event, view)
            told[want] = told.get(want, 0) + 1
    assert told.get("lookup", 0) > 2 and told.get("model", 0) > 2, told


@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_other_tree_runs_tell_no_source(pair, kind):
    """The draft model's and the ngram proposer's tree runs: no source in the events, the stats,
    the records' JSON or the report."""
    engine = Engine(profile(pair, kind))
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6] if kind == "ngram" else random_prompts(engine.pair.vocab_size, 1)[0]
    events = list(engine.decoder(insight=True).run(prompt))
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert all(e.source is None and e.lookup_nodes is None and e.ranks is not None for e in rounds)
    stats = events[-1].stats
    assert stats.source_rounds == 0 and stats.lookup_share is None and "lookup" not in stats.tree_line()
    run = RunRecord.build("", events[-1], rounds, engine.tokenizer)
    assert all(set(r) == {"drafted_ids", "num_accepted", "token_ids", "target_p", "draft_q", "target_entropy",
                          "k_used", "early_stop", "branch", "tree"} for r in run.as_dict()["rounds"])
    assert "hybrid" not in analyse([run])["tree"]
