"""core/round/tree_round.py: rounds that draft and verify a token tree, end to end on tiny fp32 models.

Greedy and Gumbel-coupled trees of any shape give target-only's tokens; after a run both caches
hold what a chain's would after the same tokens (the accepted paths compacted); a width of 1 is
the chain round itself; what trees cannot take yet is a one-line error. Sampled rejection
coupling: whole rounds (drawn children with the recursive walk, top-w children with the sibling
walk) against the target's warped p; the walks' own χ² tests are tests/core/sampling/test_tree_walk.py's.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest
import torch

from dataclasses import replace
from types import SimpleNamespace

from decode_helpers import assert_first_two_follow_p, finish, make_profile, random_prompts
from specgen.core.engine import Engine, target_only
from specgen.core.errors import UsageError
from specgen.core.events import Fate
from specgen.core.round import Round, TreeRound
from specgen.core.round.rows import MinTokens, Penalties
from specgen.core.round.tree import Tree
from specgen.core.round.tree_round import TreeRows
from specgen.core.sampling.warp import penalty_rows
from specgen.core.step import rows as rowsets
from specgen.core.runner import EagerRunner
from specgen.core.settings import ProposerSpec
from rows_helpers import path as rows_path
from tiny_models import build_pair

SHAPES = [(2, 3, 5), (3, 3, 12)]  # (k, width, nodes)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MORE_SHAPES = [(2, 2, 2), (4, 2, 9), (4, 4, 40), (1, 3, 3)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("trees"), noisy=0.1)


def tree_profile(pair, k: int, width: int, nodes: int, **sampling):
    return make_profile(*pair, k=k, speculation=dict(tree_width=width, tree_nodes=nodes), **sampling)


def outputs(engine: Engine, profile, prompts) -> list[list[int]]:
    return [finish(engine.decoder(profile), ids).token_ids for ids in prompts]


def check_identity(pair, shapes, **sampling) -> None:
    prompts = random_prompts(200, 3, seed=len(shapes))
    reference = outputs(Engine(make_profile(*pair, **sampling)), target_only(make_profile(*pair, **sampling)), prompts)
    for k, width, nodes in shapes:
        profile = tree_profile(pair, k, width, nodes, **sampling)
        engine = Engine(profile)
        decoder = engine.decoder()
        assert isinstance(decoder.round, TreeRound)
        if engine.backend.name == "cuda":  # the whole tree round captured, not run eagerly
            assert all(getattr(program, "eager", None) is None and program.graphs
                       for program in decoder.programs.values())
        assert outputs(engine, profile, prompts) == reference, (k, width, nodes)


def test_greedy_trees_give_target_only_tokens(pair):
    check_identity(pair, SHAPES)


def test_gumbel_trees_give_target_only_text(pair):
    check_identity(pair, SHAPES, temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)


@CUDA
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)])
def test_captured_tree_rounds_give_target_only_tokens(pair, sampling):
    """On a GPU the tree round (drafting, selection, the target's tree step on the attention
    kernel's tails, the walk, the compaction) is one captured program per slot: greedy and
    Gumbel-coupled trees still give target-only's tokens."""
    check_identity(pair, SHAPES + [(4, 4, 40)], backend="cuda", **sampling)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured test above runs the kernels")
def test_tree_rounds_on_the_kernel_table_give_target_only_tokens(pair):
    """The runners a GPU captures (GraphRunner.step_rows and compact on the Triton table, here in
    the interpreter and uncaptured): the target's tree rows and the draft's level rows go through
    the attention kernel's tails, and greedy output is still target-only's."""
    from gpu_helpers import KernelRunners, kernels

    profile = tree_profile(pair, 3, 3, 8, max_tokens=6)
    prompt = random_prompts(200, 1, seed=4)[0]
    reference = finish(Engine(profile).decoder(target_only(profile)), prompt).token_ids
    decoder = Engine(profile, backend=KernelRunners(kernels(attention=True, rope=True))).decoder()
    assert isinstance(decoder.round, TreeRound) and decoder.round.target.ops.kernels.attention
    assert finish(decoder, prompt).token_ids == reference


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured test above runs the kernels")
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)])
def test_tree_rounds_on_the_triton_round_ops_give_target_only_tokens(pair, sampling):
    """The round's Triton table (the warp, the walk kernel) and the step table's compaction kernel,
    here in the interpreter: greedy and Gumbel-coupled trees still give target-only's tokens."""
    from gpu_helpers import KernelRunners, kernels
    from specgen.gpu.round_ops import TritonRoundOps
    from specgen.gpu.workspace import Workspace

    profile = tree_profile(pair, 3, 2, 5, max_tokens=6, **sampling)
    prompt = random_prompts(200, 1, seed=4)[0]
    reference = finish(Engine(profile).decoder(target_only(profile)), prompt).token_ids
    backend = KernelRunners(kernels())
    backend.ops = TritonRoundOps(Workspace(backend.device))
    decoder = Engine(profile, backend=backend).decoder()
    assert isinstance(decoder.round, TreeRound) and decoder.round.ops is backend.ops
    assert finish(decoder, prompt).token_ids == reference


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, tests/gpu/test_round_ops.py runs the kernels")
def test_taken_draws_on_the_triton_round_ops_are_the_torch_tables(pair):
    """Sampled rejection coupling with drawn children on the round's Triton table (the recursive
    walk kernel's taken flag through the staged ids), in the interpreter: the tokens and fates of
    the torch table, rounds that end on a draw accepted outside the tree included."""
    from gpu_helpers import KernelRunners, kernels
    from specgen.gpu.round_ops import TritonRoundOps
    from specgen.gpu.workspace import Workspace

    profile = tree_profile(pair, 2, 3, 2, max_tokens=10, temperature=1.0, seed=2)
    prompt = random_prompts(200, 1, seed=9)[0]
    want = list(Engine(profile).decoder().run(prompt))
    backend = KernelRunners(kernels())
    backend.ops = TritonRoundOps(Workspace(backend.device))
    decoder = Engine(profile, backend=backend).decoder()
    assert decoder.round.tree.sampled and decoder.round.ops is backend.ops
    got = list(decoder.run(prompt))
    assert [(e.token_ids, e.fates, e.drafted_ids) for e in got[:-1]] == \
        [(e.token_ids, e.fates, e.drafted_ids) for e in want[:-1]]
    assert any(e.fates[-1] == Fate.ACCEPTED for e in want[:-1]), "no round ended on a taken draw"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, test_lookup_tree_round.py captures the programs")
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, top_k=40, seed=3)], ids=["greedy", "rejection"])
def test_empty_lookup_rounds_on_the_triton_tables_are_the_torch_tables(pair, sampling):
    """The ngram proposer's tree rounds on the GPU's tables in the interpreter (the target's step
    kernels, the round's Triton warp and walk), its empty program's one-row step and walk over the
    root alone among them: the events of the torch tables."""
    from gpu_helpers import KernelRunners, kernels
    from specgen.core.round import Mode
    from specgen.gpu.round_ops import TritonRoundOps
    from specgen.gpu.workspace import Workspace

    profile = make_profile(pair[0], None, k=3, proposer=ProposerSpec(kind="ngram", ngram_min=1, ngram_max=3),
                           speculation=dict(tree_width=2, tree_nodes=5), max_tokens=8, **sampling)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6] + random_prompts(200, 1, seed=4)[0]
    want = list(Engine(profile).decoder().run(prompt))
    backend = KernelRunners(kernels(attention=True, rope=True))
    backend.ops = TritonRoundOps(Workspace(backend.device))
    decoder = Engine(profile, backend=backend).decoder()
    assert Mode.EMPTY in decoder.programs and decoder.round.ops is backend.ops
    got = list(decoder.run(prompt))
    assert [(e.token_ids, e.fates, e.drafted_ids) for e in got[:-1]] == \
        [(e.token_ids, e.fates, e.drafted_ids) for e in want[:-1]]
    assert {e.num_drafted == 0 for e in want[:-1]} == {True, False}  # empty lookups and trees both ran


def test_tree_rows_count_each_paths_drafts_and_mask_by_depth():
    """Row r's penalty counts are a chain's after the drafts on r's path (its ancestors below the
    root, then r), and min_tokens masks the stop ids in rows of depth < min_tokens - generated."""
    parents = [-1, 0, 0, 1, 1, 3]  # tree rows: 0 the root
    tree = Tree(3, 2, 5, torch.device("cpu"))
    tree.ids[0] = torch.tensor([3, 5, 7, 5, 9, 5])
    rows = rowsets.tree(tree.ids, torch.tensor(parents), torch.tensor([10]), levels=4)
    penalties = Penalties(3, 12, torch.arange(4), torch.device("cpu"))
    penalties.start([3, 1])
    penalties.commit(torch.tensor([3, 5, -1]))
    generated = torch.tensor(2)
    mask = MinTokens(12, 11, [9], min_tokens=4, generated=generated, steps=torch.arange(4))
    got, bad = TreeRows(SimpleNamespace(generated=generated), SimpleNamespace(penalties=penalties, mask=mask)
                        ).target_rows(tree, rows)
    for row in range(len(parents)):
        path = rows_path(parents, row)[1:]  # below the root
        want = penalty_rows(penalties.counts, penalties.seen, tree.ids[0, path])
        assert torch.equal(got.counts[row], want.counts[-1]) and torch.equal(got.seen[row], want.seen[-1])
        depth = len(path) + 1
        assert bad[row].nonzero().flatten().tolist() == ([9, 11] if 2 + depth - 1 < 4 else [11])


def test_penalties_and_min_tokens_apply_along_each_path(pair):
    """A node counts the drafts on its path for penalties, and min_tokens masks stop ids by its
    depth: greedy and Gumbel trees still give target-only's tokens (the pair's EOS is a stop id)."""
    check_identity(pair, SHAPES[1:], repetition_penalty=1.5, frequency_penalty=0.5, min_tokens=6, ignore_eos=False)
    check_identity(pair, SHAPES[1:], temperature=0.9, presence_penalty=1.0, min_tokens=4, ignore_eos=False,
                   coupling="gumbel", seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.2, top_k=20, coupling="gumbel", seed=5)])
def test_every_tree_shape_gives_target_only_tokens(pair, sampling):
    check_identity(pair, MORE_SHAPES, **sampling)


DRAWN_CASES = {
    "drawn": ((3, 3, 9), dict(temperature=1.0), "auto"),
    "drawn, budget below the stepped nodes": ((3, 3, 4), dict(temperature=0.8, top_k=20, top_p=0.9), "auto"),
    "top-w": ((3, 2, 6), dict(temperature=1.0, min_p=0.02), "argmax"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DRAWN_CASES))
def test_sampled_tree_rounds_follow_the_target_distribution(pair, case):
    """Rejection coupling through whole tree rounds (drafting, drawn children and the recursive
    walk, or top-w children and the sibling walk; the commit): χ² of the first emitted token, and
    of the next one after the most common first, against the target's exact warped p. α = 1e-4
    per test (6 tests): false failures below 6e-4."""
    shape, sampling, pick = DRAWN_CASES[case]
    profile = tree_profile(pair, *shape, max_tokens=5, **sampling)
    profile = replace(profile, speculation=replace(profile.speculation, draft_sampling=pick))
    engine = Engine(profile)
    assert engine.decoder().round.tree.sampled == (pick == "auto")
    prompt, model = [7, 8, 9], engine.pair.target
    assert_first_two_follow_p(engine, profile, prompt, model)


@pytest.mark.parametrize("sampling, pick, drawn", [
    (dict(temperature=0.8), "auto", True), (dict(temperature=0.8), "argmax", False), ({}, "auto", False),
    (dict(temperature=0.8, coupling="gumbel", seed=1), "auto", False),
])
def test_sampled_requests_draw_children_unless_argmax(pair, sampling, pick, drawn):
    """Rejection-coupled sampled requests draw children (and walk them recursively); greedy ones
    and draft_sampling = argmax take the top-w; Gumbel-coupled ones draw with the race noise but
    keep the best-n tree (their text is target-only's whatever the tree)."""
    profile = tree_profile(pair, 3, 2, 5, **sampling)
    profile = replace(profile, speculation=replace(profile.speculation, draft_sampling=pick))
    rnd = Engine(profile).decoder().round
    assert rnd.tree.sampled == drawn
    gumbel = sampling.get("coupling") == "gumbel"
    assert (rnd.coupling.children_noise(1) is not None) == (drawn or gumbel)


@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, top_k=30, repetition_penalty=1.3, seed=4,
                                             logprobs_mode="warped")])
def test_logprobs_are_target_onlys_along_the_accepted_path(pair, sampling):
    profile = tree_profile(pair, 3, 3, 10, max_tokens=14, logprobs=3, coupling="gumbel", **sampling)
    engine = Engine(profile)
    tree = finish(engine.decoder(), [4, 5])
    base = finish(engine.decoder(target_only(profile)), [4, 5])
    assert tree.token_ids == base.token_ids and len(tree.logprobs) == 14
    for a, b in zip(tree.logprobs, base.logprobs):
        assert a["token_id"] == b["token_id"]
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
        assert [t["token_id"] for t in a["top"]] == [t["token_id"] for t in b["top"]]


def cached(runner, length: int) -> list[torch.Tensor]:
    return [t[0, :, :length] for t in (*runner.cache.keys, *runner.cache.values)]


@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=3)])
def test_both_caches_hold_a_chains_after_the_same_tokens(pair, sampling, backend):
    """The target's cache holds the committed sequence but its last id, the draft's all but its last
    two, slot by slot as a chain prefill of those ids writes them (sampled rejection coupling too;
    on a GPU, after captured rounds)."""
    profile = tree_profile(pair, 3, 3, 10, max_tokens=20, backend=backend, **sampling)
    engine = Engine(profile)
    decoder = engine.decoder()
    prompt = random_prompts(200, 1, seed=9)[0]
    sequence = prompt + finish(decoder, prompt).token_ids
    for runner, model, held in ((engine.target_runner, engine.pair.target, sequence[:-1]),
                                (engine.draft_runner, engine.pair.draft, sequence[:-2])):
        assert int(runner.position) == len(held)
        chain = EagerRunner(model, engine.width)
        chain.forward(torch.tensor(held), want_logits=False)
        for got, want in zip(cached(runner, len(held)), cached(chain, len(held))):
            # a tree step's matmuls (and on a GPU the kernels' sums) add in another order than a
            # chain prefill's (~1e-5 in float32): a slot out of place differs by the values' size
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert runner.cache.positions[0, : len(held)].tolist() == chain.cache.positions[0, : len(held)].tolist()
    assert decoder.round.drafter.chain.pending[0].tolist() == sequence[-2:]


def test_width_one_is_the_chain_round(pair):
    engine = Engine(tree_profile(pair, 3, 1, 0))
    assert type(engine.decoder().round) is Round
    assert {key: engine.describe()[key] for key in ("tree_width", "tree_nodes")} == {"tree_width": 1, "tree_nodes": 3}


@pytest.mark.parametrize("change, message", [
    (dict(proposer=ProposerSpec(kind="hybrid", draft_p_min=0.3)), "do not take draft_p_min yet"),
    (dict(proposer=ProposerSpec(draft_p_min=0.3)), "do not take draft_p_min yet"),
])
def test_what_trees_cannot_take_yet_is_a_usage_error(pair, change, message):
    profile = make_profile(*pair, k=3, speculation=dict(tree_width=2, tree_nodes=4), **change)
    with pytest.raises(UsageError, match=message):
        Engine(profile).decoder()


@pytest.mark.parametrize("shape", [(3, 3, 4), (2, 3, 2)])
def test_a_draw_accepted_outside_the_tree_is_an_accepted_draft(pair, shape):
    """Sampled rejection coupling with drawn children and a node budget that leaves draws out of
    the tree: where the walk accepts one of those (taken), the round ends on it, and the host
    reports it as a draft the target accepted (fate accepted, shown as the drafted token at its
    depth, counted in num_accepted and the stats), not as a recovered token."""
    profile = tree_profile(pair, *shape, max_tokens=24, temperature=1.0, seed=2)
    profile = replace(profile, speculation=replace(profile.speculation, pipeline="off"))
    engine = Engine(profile)
    decoder = engine.decoder()
    rnd = decoder.round
    assert rnd.tree.sampled
    walks = []  # (taken, out) of each round, in order: the walk's own verdict
    verify = rnd.coupling.verify

    def recorded(*args):
        result = verify(*args)
        walks.append((bool(result[3][0]), result[0][0].tolist()))
        return result

    rnd.coupling.verify = recorded
    taken_rounds = 0
    for prompt in random_prompts(200, 6, seed=9):
        walks.clear()
        events = list(decoder.run(prompt))
        finished, rounds = events[-1], events[:-1]
        assert len(rounds) == len(walks)
        for event, (taken, out) in zip(rounds, walks):
            assert event.token_ids == [t for t in out if t >= 0]
            if taken:
                taken_rounds += 1
                assert event.fates == [Fate.ACCEPTED] * len(event.token_ids)
                assert event.num_accepted == len(event.token_ids) <= event.num_drafted
                assert event.drafted_ids[: event.num_accepted] == event.token_ids
            else:
                assert event.fates[-1] in (Fate.RECOVERED, Fate.BONUS)
                assert event.num_accepted == len(event.token_ids) - 1
        stats = finished.stats
        assert stats.accepted == finished.fates.count(Fate.ACCEPTED) == sum(e.num_accepted for e in rounds)
        assert stats.recovered == finished.fates.count(Fate.RECOVERED)
        assert stats.bonus == finished.fates.count(Fate.BONUS)
        assert stats.accepted_at[0] == sum(e.num_accepted > 0 for e in rounds)
    assert taken_rounds > 0, "no walk accepted a draw outside the tree: pick other seeds"
