"""core/round/tree_stage.py: what a tree round stages of its tree (insight) and of which branch won.

The staged tree is the Tree's own buffers; the drafted ids' p and q follow the walk's `shown`; the
chain inside a greedy tree (its first children) yields, round by round, what a chain round from
the same sequence yields; per-depth counts add up to the tokens. On a GPU, the captured round
with insight stages what the eager one does.
"""

from __future__ import annotations

import pytest
import torch

from dataclasses import replace

from decode_helpers import make_profile, random_prompts
from specgen.core.engine import Engine
from specgen.core.insight import RunRecord, analyse, stats_of
from specgen.core.round import TreeRound
from specgen.core.round.tree_stage import TreeView
from specgen.core.sampling.warp import logprobs_from_logits
from specgen.core.settings import ProposerSpec, tree_envelope
from tiny_models import build_pair

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SAMPLINGS = {
    "greedy": {},
    "drawn": dict(temperature=1.0, seed=2),  # drawn children, the recursive walk, draws taken outside
    "top-w": dict(temperature=0.9, seed=5, draft_sampling="argmax"),  # top-w children, the sibling walk
    "gumbel": dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("tree_insight"), noisy=0.1)


def tree_profile(pair, k: int, width: int, nodes: int, backend: str = "torch", proposer=None, **sampling):
    draft_sampling = sampling.pop("draft_sampling", None)
    speculation = dict(tree_width=width, tree_nodes=nodes, pipeline="off")
    if draft_sampling:
        speculation["draft_sampling"] = draft_sampling
    return make_profile(*pair, k=k, backend=backend, proposer=proposer, speculation=speculation, **sampling)


class Snapshots:
    """The tree's buffers and the walk's path as each round staged them (the loop queues the next
    round before it yields an event)."""

    def __init__(self, rnd: TreeRound):
        self.rnd, self.rounds = rnd, []
        # every envelope's stage: the ngram proposer's empty rounds stage the root alone
        for env in {id(env): env for env in rnd.envelopes.values()}.values():
            self._hook(env)

    def _hook(self, env) -> None:
        stage = env.stage.stage

        def recorded(out, path, taken, ranks, penalties, bad, one_hot, point=None):
            tree = env.tree
            self.rounds.append(dict(ids=tree.ids[0].clone(), parents=tree.parents.clone(),
                                    children=tree.children.clone(), depth=tree.depth[0].clone(),
                                    path=path.clone(), logits=env.logits.clone(), params=env.params,
                                    scores=tree.scores.clone(), row_of=tree.row_of.clone()))
            stage(out, path, taken, ranks, penalties, bad, one_hot, point)

        env.stage.stage = recorded


def kept_rows(snap: dict) -> list[int]:
    """Tree rows that are nodes (the root, and every row its parent's children name)."""
    named = set(snap["children"].view(-1).tolist())
    return [r for r in range(snap["ids"].shape[0]) if r == 0 or r in named]


@pytest.mark.parametrize("case", ["greedy", "drawn", "top-w", "gumbel", "ngram"])
def test_the_staged_tree_is_the_trees_buffers(pair, case):
    proposer = ProposerSpec(kind="ngram") if case == "ngram" else None
    sampling = SAMPLINGS["greedy" if case == "ngram" else case]
    engine = Engine(tree_profile(pair, 3, 3, 7, proposer=proposer, max_tokens=24, **sampling))
    decoder = engine.decoder(insight=True)
    rnd = decoder.round
    snaps = Snapshots(rnd)
    checked = 0
    # ngram: lookups that find trees, and (the random prompt) rounds whose lookups find nothing
    prompts = random_prompts(200, 3, seed=3) if case != "ngram" else [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]] * 2 + \
        random_prompts(200, 1, seed=3)
    empty = 0
    for prompt in prompts:
        snaps.rounds.clear()
        events = list(decoder.run(prompt))[:-1]
        assert len(events) == len(snaps.rounds)
        for event, snap in zip(events, snaps.rounds):
            view = event.tree
            assert isinstance(view, TreeView)
            rows = kept_rows(snap)
            new = {old: i for i, old in enumerate(rows)}
            assert view.tokens == [snap["ids"][r].item() for r in rows]
            assert view.parents == [-1] + [new[snap["parents"][r].item()] for r in rows[1:]]
            assert view.depth == [snap["depth"][r].item() - 1 for r in rows]
            for i, r in enumerate(rows[1:], start=1):
                siblings = snap["children"][snap["parents"][r]].tolist()
                assert view.ranks[i] == siblings.index(r)
            walked = [new[r] for r in snap["path"].tolist() if r > 0]
            assert view.path == walked
            # the accepted nodes' tokens are the round's, and their sibling indices the ranks staged
            accepted = event.num_accepted - (view.taken is not None)
            assert [view.tokens[r] for r in view.path] == event.token_ids[:accepted]
            assert event.ranks == [view.ranks[r] for r in view.path] + ([view.taken[3]] if view.taken else [])
            # p: the target's (greedy: its softmax) at the parent row; q: the draft's, 1 for the host's
            probs = logprobs_from_logits(snap["logits"], snap["params"]).exp()
            for i, r in enumerate(rows[1:], start=1):
                parent = snap["parents"][r].item()
                assert view.p[i] == pytest.approx(probs[parent, view.tokens[i]].item(), rel=1e-4, abs=1e-6)
                if case == "ngram":
                    assert view.q[i] == 1.0
                else:
                    pool = snap["row_of"].tolist().index(r)
                    up = snap["row_of"].tolist().index(parent) if parent else None
                    logq = snap["scores"][pool] - (snap["scores"][up] if up is not None else 0.0)
                    assert view.q[i] == pytest.approx(logq.exp().item(), rel=1e-4)
            # the drafted ids the event reports are the walk's shown rows, with their p and q
            shown = view.shown(rnd.k)[: event.num_drafted]
            tokens = [view.tokens[r] for r in shown]
            p = [view.p[r] for r in shown]
            if view.taken is not None:
                tokens[len(view.path)], p[len(view.path)] = view.taken[0], view.taken[1]
            assert event.drafted_ids == tokens
            assert event.target_p == p
            assert len(event.draft_q) == len(event.target_entropy) == event.num_drafted
            checked += 1
            empty += snap["ids"].shape[0] == 1  # an empty lookup's round: the root alone (Mode.EMPTY)
    assert checked and (empty > 0) == (case == "ngram")


def test_a_draw_taken_outside_the_tree_is_staged_with_its_sibling_index(pair):
    """Drawn children with a small node budget: the walk takes draws the tree left out; the view
    keeps each (token, p, q, sibling index), and its q is the draft's at the parent."""
    engine = Engine(tree_profile(pair, 3, 3, 4, max_tokens=24, temperature=1.0, seed=2))
    decoder = engine.decoder(insight=True)
    taken = []
    for prompt in random_prompts(200, 6, seed=9):
        for event in list(decoder.run(prompt))[:-1]:
            if event.tree.taken is not None:
                token, p, q, rank = event.tree.taken
                assert token == event.token_ids[-1] and event.ranks[-1] == rank
                assert 0.0 < q <= 1.0 and 0.0 <= p <= 1.0
                taken.append(rank)
    assert taken, "no walk took a draw outside the tree: pick other seeds"


def chain_yield(ranks: list[int], emitted: int) -> int:
    """What the chain inside the tree would have yielded (core/stats.py)."""
    return min(next((i for i, r in enumerate(ranks) if r != 0), len(ranks)) + 1, emitted)


@pytest.mark.parametrize("k, width", [(3, 2), (2, 3)])
def test_the_chain_inside_a_greedy_tree_yields_a_chain_rounds_tokens(pair, k, width):
    """The comparison is honest: each round of a greedy tree (a node budget holding the whole
    envelope, so its first-child path is k deep), the chain inside it yields as many tokens as a
    chain round run from the same sequence, and the same tokens."""
    max_tokens = 20
    tree = Engine(tree_profile(pair, k, width, tree_envelope(k, width), max_tokens=max_tokens))
    chain_engine = Engine(tree_profile(pair, k, 1, 0, max_tokens=max_tokens))
    decoder = tree.decoder()
    rounds = wins = 0
    # two ids at least: a one-token prompt's draft sees its id twice, which a later prompt does not
    for prompt in [p for p in random_prompts(200, 6, seed=7) if len(p) > 1][:4]:
        events = list(decoder.run(prompt))
        finished, events = events[-1], events[:-1]
        before = []
        for event in events:
            left = max_tokens - len(before)
            profile = replace(chain_engine.profile, sampling=replace(chain_engine.profile.sampling, max_tokens=left))
            chain = next(iter(chain_engine.decoder(profile).run(prompt + before)))
            expected = chain_yield(event.ranks, len(event.token_ids))
            assert len(chain.token_ids) == expected, (prompt, before, event.ranks)
            assert chain.token_ids == event.token_ids[:expected]
            wins += len(event.token_ids) > expected
            rounds += 1
            before += event.token_ids
        stats = finished.stats
        assert stats.tree_rounds == len(events)
        assert stats.tree_emitted == stats.emitted == len(finished.token_ids)
        assert stats.chain_emitted == sum(chain_yield(e.ranks, len(e.token_ids)) for e in events)
    assert rounds and wins, "no branch ever won: pick other seeds"


@pytest.mark.parametrize("case", ["greedy", "drawn"])
def test_per_depth_acceptance_adds_up_to_the_tokens(pair, case):
    """Per depth, the rounds whose path reached it sum to the accepted tokens, and with one token
    more per round (none after a draw taken outside the tree) to the tokens emitted; the chain's
    per-depth counts sum to its tokens the same way; records and the live stats agree."""
    engine = Engine(tree_profile(pair, 3, 3, 6, max_tokens=24, **SAMPLINGS[case]))
    decoder = engine.decoder(insight=True)
    runs = []
    for prompt in random_prompts(200, 3, seed=1):
        events = list(decoder.run(prompt))
        runs.append(RunRecord.build("", events[-1], events[:-1], engine.tokenizer))
        live = events[-1].stats
        again = stats_of(runs[-1:])
        for name in ("tree_rounds", "tree_emitted", "chain_emitted", "chain_at", "branch_at", "accepted_at"):
            assert getattr(again, name) == getattr(live, name), name
    report = analyse(runs)
    tree, totals, fates = report["tree"], report["totals"], report["fates"]
    rounds = [r for run in runs for r in run.rounds]
    taken = sum(r.tree["taken"] is not None for r in rounds)
    assert tree["rounds"] == totals["rounds"] == len(rounds)
    assert sum(d["reached"] for d in tree["per_depth"]) == totals["accepted"] == fates["accepted"]
    assert totals["accepted"] + totals["rounds"] - taken == totals["generated_tokens"]
    assert tree["tokens_per_round"] * tree["rounds"] == pytest.approx(totals["generated_tokens"])
    chain_tokens = sum(chain_yield(r.branch, len(r.token_ids)) for r in rounds)
    assert tree["chain_tokens_per_round"] * tree["rounds"] == pytest.approx(chain_tokens)
    assert sum(d["chain_reached"] for d in tree["per_depth"]) + len(rounds) >= chain_tokens
    for d in tree["per_depth"]:
        at = d["depth"] - 1
        assert d["reached"] == sum(r.num_accepted > at for r in rounds)
        assert d["branch_wins"] == sum(len(r.branch) > at and r.branch[at] != 0 for r in rounds)
        assert d["chain_reached"] <= d["reached"]


def test_a_chain_has_no_tree_report(pair):
    engine = Engine(tree_profile(pair, 3, 1, 0, max_tokens=12))
    events = list(engine.decoder(insight=True).run([4, 5, 6]))
    assert all(e.ranks is None and e.tree is None for e in events[:-1])
    assert events[-1].stats.tree_rounds == 0 and events[-1].stats.tree_line() == ""
    assert analyse([RunRecord.build("", events[-1], events[:-1], engine.tokenizer)])["tree"] is None


@CUDA
@pytest.mark.parametrize("case", ["greedy", "drawn", "gumbel", "ngram"])
def test_captured_tree_rounds_with_insight_stage_what_eager_ones_do(pair, case):
    """The tree round with its insight stage captured as CUDA graphs, against the same round's body
    run eagerly (same Round, buffers and draws): the same tokens, branches and staged trees (ngram:
    the lookup's trees, and the empty program's root where a lookup finds nothing)."""
    from specgen.core.backend import EagerProgram

    proposer = ProposerSpec(kind="ngram") if case == "ngram" else None
    sampling = SAMPLINGS["greedy" if case == "ngram" else case]
    engine = Engine(tree_profile(pair, 3, 3, 7, backend="cuda", proposer=proposer, max_tokens=24, **sampling))
    decoder = engine.decoder(insight=True)
    assert all(getattr(p, "eager", None) is None and p.graphs for p in decoder.programs.values())
    twin = engine.decoder(insight=True)
    rnd = twin.round
    twin.programs = {mode: EagerProgram(lambda mark, mode=mode: rnd.body(mode, mark)) for mode in twin.programs}
    for prompt in random_prompts(200, 3, seed=4) + [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]]:
        got, want = list(decoder.run(prompt))[:-1], list(twin.run(prompt))[:-1]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert (a.token_ids, a.ranks, a.drafted_ids) == (b.token_ids, b.ranks, b.drafted_ids)
            assert a.tree == b.tree
