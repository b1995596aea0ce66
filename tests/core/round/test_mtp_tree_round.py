"""Token trees drafted by a checkpoint's MTP layer (core/round/head_tree.py over core/drafters/
heads.py's MtpDrafter), end to end on a tiny fp32 DeepSeek-V3 checkpoint (its target runs on
transformers: core/runner.py's tree steps).

Greedy and Gumbel-coupled MTP trees give target-only's tokens; each stepped node's logits and
hidden state are the layer's own chain along its path (the tree's mask and positions); hybrid
trees with the MTP layer (merged with the lookup's trie) give target-only's tokens; sampled
rejection coupling follows the target's warped p (χ² of whole rounds). The rounds run eagerly
on CUDA too (the layer's cache grows): the identity tests run there where there is a GPU.
"""

from __future__ import annotations

import pytest
import torch

from dataclasses import replace

from decode_helpers import assert_sampled_trees_follow_p, finish, make_profile, random_prompts
from lookup_helpers import OracleLookup, lookup_prompts
from specgen.core.engine import Engine, target_only
from specgen.core.round import Mode, TreeRound
from specgen.core.round.head_tree import HeadTreeDraft
from specgen.core.round.merged_tree import MergedTree
from specgen.core.settings import ProposerSpec
from round_helpers import head_chains_along_paths
from tiny_models import build_mtp_target

SHAPES = [(2, 2, 4), (3, 2, 6), (4, 4, 16)]  # (k, width, nodes)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp-trees")
    build_mtp_target(folder)
    return folder


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tree_profile(target, k: int, width: int, nodes: int, proposer: ProposerSpec | None = None, merge: str = "auto",
                 backend: str = "torch", **sampling):
    return make_profile(target, None, k=k, backend=backend, proposer=proposer or ProposerSpec(kind="mtp"),
                        speculation=dict(tree_width=width, tree_nodes=nodes, hybrid_merge=merge), **sampling)


def check_identity(target, shapes, backend: str = "torch", **sampling) -> None:
    engine = Engine(tree_profile(target, 1, 1, 0, backend=backend, **sampling))
    prompts = random_prompts(engine.pair.vocab_size, 3, seed=len(shapes))
    reference = [finish(engine.decoder(target_only(engine.profile)), ids).token_ids for ids in prompts]
    for k, width, nodes in shapes:
        profile = tree_profile(target, k, width, nodes, backend=backend, **sampling)
        decoder = engine.decoder(profile)
        assert isinstance(decoder.round, TreeRound) and isinstance(decoder.round.drafter, HeadTreeDraft)
        assert engine.pair.modeling == "transformers"  # DeepSeek-V3: the target's tree steps on transformers
        got = [finish(engine.decoder(profile), ids).token_ids for ids in prompts]
        assert got == reference, (k, width, nodes)


def test_greedy_mtp_trees_give_target_only_tokens(target):
    check_identity(target, SHAPES)


def test_gumbel_mtp_trees_give_target_only_text(target):
    check_identity(target, SHAPES[:2], temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)


@CUDA
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)])
def test_mtp_trees_on_cuda_give_target_only_tokens(target, sampling):
    """The same rounds on a GPU: the target's tree steps on transformers and the layer's growing
    cache, eagerly on the CUDA backend."""
    check_identity(target, SHAPES, backend="cuda", **sampling)


@pytest.mark.parametrize("k, w", [(4, 3), (3, 2)])
def test_each_node_is_the_mtp_layers_chain_along_its_path(target, k, w):
    """One more draft after a run: the root's children are the top-w of the layer's log q after its
    extend, and every stepped node's output hidden state and logits are the layer stepped as a
    chain over its path's tokens (each on the one before's output, at positions P, P + 1, ...).
    A node that saw a sibling, another branch or a wrong position would differ."""
    profile = tree_profile(target, k, w, w * (k - 1), max_tokens=17)
    profile = replace(profile, speculation=replace(profile.speculation, pipeline="off"))
    decoder = Engine(profile).decoder()
    finish(decoder, [5, 9, 17, 33, 2])
    rnd = decoder.round
    drafter, layer = rnd.drafter, rnd.drafter.head.layer
    for level, f, chain_logits, hidden in head_chains_along_paths(rnd):
        node = drafter.hidden[(level - 1) * w + f]
        torch.testing.assert_close(hidden[0], node, rtol=1e-5, atol=1e-5)
        with torch.inference_mode():
            node_logits = layer.head(layer.norm(node[None]))[0]
        torch.testing.assert_close(chain_logits[0, : node_logits.shape[0]], node_logits, rtol=1e-5, atol=1e-5)
    assert drafter.hidden.std() > 0.01  # the comparison is between non-trivial numbers


@pytest.mark.parametrize("merge", ["always", "never"])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=7)])
def test_hybrid_mtp_trees_give_target_only_tokens(target, sampling, merge):
    """hybrid with hybrid_with = "mtp": the lookup's trie merged with the MTP layer's tree, or
    alone with the layer following (the oracle lookup's host rounds accept up to k drafts, so the
    layer's next extend reads paths of several tokens through the lookup's nodes), or the layer's
    tree alone."""
    proposer = ProposerSpec(kind="hybrid", hybrid_with="mtp", ngram_min=1, ngram_max=3)
    engine = Engine(tree_profile(target, 3, 2, 5, proposer, max_tokens=32, **sampling))
    prompts = lookup_prompts(engine.pair.vocab_size, 4, seed=3)
    reference = [finish(engine.decoder(target_only(engine.profile)), ids).token_ids for ids in prompts]
    rounds, accepted = {"ngram": 0, "draft": 0}, 0  # "draft": the model's, here the layer's
    for (k, w, n), oracle in [((3, 2, 5), False), ((3, 2, 5), True), ((4, 3, 12), True)]:
        profile = tree_profile(target, k, w, n, proposer, merge, max_tokens=32, **sampling)
        for prompt, want in zip(prompts, reference):
            decoder = engine.decoder(profile)
            assert isinstance(decoder.round.drafters[Mode.MODEL], HeadTreeDraft)
            assert isinstance(decoder.round.drafters[Mode.MERGED], MergedTree)
            assert set(decoder.programs) == {Mode.MODEL, Mode.MERGED if merge == "always" else Mode.HOST}
            if oracle:
                decoder.lookup = OracleLookup(engine.pair.target, engine.pair.vocab_size, k)
            done = finish(decoder, prompt)
            assert done.token_ids == want, ((k, w, n), oracle, prompt)
            for kind, count in decoder.proposer_rounds.items():
                rounds[kind] += count
            accepted += done.stats.accepted
    assert rounds["ngram"] > 5 and rounds["draft"] > 5 and accepted > 10, (rounds, accepted)


@pytest.mark.slow
def test_sampled_mtp_tree_rounds_follow_the_target_distribution(target):
    """Rejection coupling through whole MTP-drafted tree rounds (children drawn from the layer's q,
    the recursive walk): χ² of the first emitted token, and of the next one after the most
    common first, against the target's exact warped p, at α = 1e-4 each. At T = 0.5 the tiny
    target's likeliest first token is common enough for the second test."""
    profile = tree_profile(target, 3, 3, 9, max_tokens=3, temperature=0.5, top_k=40)  # a peaked p
    assert_sampled_trees_follow_p(Engine(profile), profile, [7, 8, 9], "the layer")
