"""core/round/head_tree.py: token trees drafted by an EAGLE-3 head, end to end on tiny fp32 models.

Greedy and Gumbel-coupled head trees give target-only's tokens; sampled rejection coupling
follows the target's warped p (χ² of whole rounds); each stepped node's hidden state is the head's
own chain along its path (tree rows, parents' states), and after a run the head's cache holds what
a fresh head computes over the committed sequence (MTP layers' trees: test_mtp_tree_round.py).
On a GPU: captured rounds equal eager ones, and bf16 greedy trees give target-only's tokens.
"""

from __future__ import annotations

import triton_cpu  # noqa: F401, I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest
import torch

from dataclasses import replace

from decode_helpers import assert_sampled_trees_follow_p, finish, make_profile, random_prompts
from specgen.core.engine import Engine, target_only
from specgen.core.errors import UsageError
from specgen.core.events import RoundEvent
from specgen.core.round import TreeRound
from specgen.core.round.head_tree import HeadTreeDraft
from specgen.core.settings import ProposerSpec
from round_helpers import head_chains_along_paths
from tiny_models import build_pair, head_for

AUX = (0, 1, 1)  # head_for's aux layers on the tiny 2-layer target
SHAPES = [(2, 3, 5), (3, 2, 6), (4, 3, 12)]  # (k, width, nodes)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def headed(tmp_path_factory):
    root = tmp_path_factory.mktemp("head-trees")
    target, _ = build_pair(root)
    return target, head_for(target, root / "whole"), head_for(target, root / "reduced", draft_vocab=150)


def tree_profile(target, head, k: int, width: int, nodes: int, backend: str = "torch", **sampling):
    return make_profile(target, None, k=k, backend=backend, proposer=ProposerSpec(kind="eagle", head=str(head)),
                        speculation=dict(tree_width=width, tree_nodes=nodes), **sampling)


def check_identity(target, head, shapes, backend: str = "torch", **sampling) -> None:
    prompts = random_prompts(200, 3, seed=len(shapes))
    plain = target_only(tree_profile(target, head, 1, 1, 0, backend=backend, **sampling))
    reference = [finish(Engine(plain).decoder(), ids).token_ids for ids in prompts]
    for k, width, nodes in shapes:
        engine = Engine(tree_profile(target, head, k, width, nodes, backend=backend, **sampling))
        decoder = engine.decoder()
        assert isinstance(decoder.round, TreeRound) and isinstance(decoder.round.drafter, HeadTreeDraft)
        if backend == "cuda":  # the whole tree round captured, not run eagerly
            assert all(getattr(program, "eager", None) is None and program.graphs
                       for program in decoder.programs.values())
        assert [finish(engine.decoder(), ids).token_ids for ids in prompts] == reference, (k, width, nodes)


@pytest.mark.parametrize("vocab", ["whole", "reduced"])
def test_greedy_head_trees_give_target_only_tokens(headed, vocab):
    target, whole, reduced = headed
    check_identity(target, whole if vocab == "whole" else reduced, SHAPES)


def test_gumbel_head_trees_give_target_only_text(headed):
    target, _, reduced = headed
    check_identity(target, reduced, SHAPES[:2], temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)


def decoded(target, head, k: int, width: int, nodes: int, prompt: list[int], backend: str = "torch", **sampling):
    """(engine, its round, the committed sequence) after one request, one round at a time."""
    profile = tree_profile(target, head, k, width, nodes, backend=backend, max_tokens=17, **sampling)
    profile = replace(profile, speculation=replace(profile.speculation, pipeline="off"))
    engine = Engine(profile)
    decoder = engine.decoder()
    return engine, decoder.round, prompt + finish(decoder, prompt).token_ids


def test_each_node_is_the_heads_chain_along_its_path(headed):
    """One more draft after a run: the root's children are the top-w of the head's log q after its
    extend, and every stepped node's output hidden state is the head stepped as a chain over its
    path's tokens (each on the one before's state, at positions P, P + 1, ...)."""
    target, _, reduced = headed
    k, w = 4, 3
    engine, rnd, _ = decoded(target, reduced, k, w, 12, [5, 9, 17, 33, 2])
    for level, f, _, hidden in head_chains_along_paths(rnd):
        torch.testing.assert_close(hidden[0], rnd.drafter.hidden[(level - 1) * w + f], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=3)])
def test_the_heads_cache_is_a_fresh_heads_over_the_committed_sequence(headed, sampling, backend):
    """After tree rounds (greedy; sampled rejection with drawn children), the head's rows below
    the last round's start hold what a fresh head computes over the committed sequence with the
    target's states: the tap copied the tree step's rows (on a GPU, inside the captured round), the
    accepted path's features were gathered in order, the tree's nodes left nothing behind."""
    from transformers import AutoModelForCausalLM

    from specgen.core.drafters.head_formats import load_head

    target, whole, _ = headed
    engine, rnd, sequence = decoded(target, whole, 3, 3, 8, [3, 14, 15, 92, 65, 35], backend, **sampling)
    held = int(rnd.target.position - rnd.emitted)  # the last round's start: rows below it extended
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    fresh = load_head(whole, embedding=model.get_input_embeddings().weight, capacity=256)
    with torch.no_grad():
        states = model(torch.tensor([sequence[:-1]]), output_hidden_states=True).hidden_states
        features = torch.cat([states[i][0] for i in AUX], dim=-1)
        fresh(torch.tensor(sequence[1:held + 1]), features[:held], torch.arange(held))
    head = rnd.drafter.head.head
    close = 1e-4 if backend == "torch" else 1e-2  # the GPU's kernels against the CPU's fresh head
    for got, want in ((head.k_cache, fresh.k_cache), (head.v_cache, fresh.v_cache)):
        torch.testing.assert_close(got[:, :, :held].cpu(), want[:, :, :held], rtol=close, atol=close)


# Drawn children only: where the children are the head's top-w (deterministic), the walk's law does
# not depend on the drafter (test_tree_round.py's top-w case covers it), and a random head's top-w
# are too rarely accepted here to test acceptance at all
DRAWN_CASES = {  # (shape, sampling, head)
    "drawn": ((3, 3, 9), dict(temperature=1.0), "reduced"),
    "drawn, warped q, budget below the stepped nodes": ((3, 3, 4), dict(temperature=0.8, top_k=40, top_p=0.9),
                                                        "whole"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DRAWN_CASES))
def test_sampled_head_tree_rounds_follow_the_target_distribution(headed, case):
    """Rejection coupling through whole head-drafted tree rounds (children drawn from the head's q,
    the recursive walk): χ² of the first emitted token, and of the next
    one after the most common first, against the target's exact warped p. α = 1e-4 per test
    (4 tests): false failures below 4e-4."""
    target, whole, reduced = headed
    shape, sampling, vocab = DRAWN_CASES[case]
    profile = tree_profile(target, whole if vocab == "whole" else reduced, *shape, max_tokens=3, **sampling)
    assert_sampled_trees_follow_p(Engine(profile), profile, [7, 8, 9], "the head")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, the captured tests below run the kernels")
def test_head_trees_on_the_kernel_table_give_target_only_tokens(headed):
    """The head's calls on the step's Triton table (here in the interpreter, uncaptured): its
    levels' tree rows through the attention kernel's tails over its own cache, the target's tree
    step through the runners a GPU captures. Greedy output is still target-only's."""
    from gpu_helpers import KernelRunners, kernels

    class HeadKernels(KernelRunners):
        def head_ops(self, head):
            from specgen.gpu.ops import TritonOps

            head.layers[0].self_attn.fuse()
            return TritonOps(self.kernels)

    target, _, reduced = headed
    profile = tree_profile(target, reduced, 3, 3, 8, max_tokens=6)
    prompt = random_prompts(200, 1, seed=4)[0]
    reference = finish(Engine(target_only(profile)).decoder(), prompt).token_ids
    engine = Engine(profile, backend=HeadKernels(kernels(attention=True, rope=True)))
    assert engine.describe()["heads"] == {"eagle": "kernels"}
    assert finish(engine.decoder(), prompt).token_ids == reference


def test_head_trees_with_insight_stage_each_rounds_tree(headed):
    """Insight takes head trees as it takes the draft model's: the same tokens as without it; each
    round's staged tree holds its accepted tokens along its path, q in (0, 1] below the root."""
    target, whole, _ = headed
    engine = Engine(tree_profile(target, whole, 3, 2, 5, max_tokens=16, temperature=1.0, seed=4))
    for ids in random_prompts(200, 2, seed=5):
        plain = finish(engine.decoder(), ids)
        events = list(engine.decoder(insight=True).run(ids))
        assert events[-1].token_ids == plain.token_ids
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert events[-1].stats.tree_rounds == len(rounds) > 0
        for r in rounds:
            view = r.tree
            path = [view.tokens[row] for row in view.path]  # a draw taken outside the tree is no row
            assert path == r.token_ids[: len(path)] and len(path) == r.num_accepted - (view.taken is not None)
            assert all(0 < q <= 1 for q in view.q[1:])


def test_head_trees_refuse_draft_p_min(headed):
    target, whole, _ = headed
    profile = tree_profile(target, whole, 3, 2, 4)
    profile = replace(profile, proposer=replace(profile.proposer, draft_p_min=0.3))
    with pytest.raises(UsageError, match="do not take draft_p_min yet"):
        Engine(profile).decoder()


# -- on a GPU ----------------------------------------------------------------------------------------


@CUDA
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)])
def test_captured_head_tree_rounds_give_target_only_tokens(headed, sampling):
    """The whole round captured (the head's extend and tree levels on the kernel table, the
    target's tree step with the tap armed, the walk, the commit's gather): target-only's tokens."""
    target, _, reduced = headed
    check_identity(target, reduced, SHAPES + [(4, 4, 40)], backend="cuda", **sampling)


@CUDA
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=5)])
def test_captured_head_tree_rounds_are_the_eager_ones(headed, sampling):
    """The captured round against its body run eagerly on the same backend (same kernels, same
    buffers): the same rounds (drafts shown, tokens, fates), sampled rejection coupling with drawn
    children included."""
    from specgen.core.backend import EagerProgram

    target, _, reduced = headed
    profile = tree_profile(target, reduced, 3, 3, 9, backend="cuda", max_tokens=24, **sampling)
    profile = replace(profile, speculation=replace(profile.speculation, pipeline="off"))
    engine = Engine(profile)
    runs = []
    for captured in (True, False):
        decoder = engine.decoder()
        rnd = decoder.round
        assert all(program.graphs for program in decoder.programs.values())
        if not captured:
            decoder.programs = {mode: EagerProgram(lambda mark, mode=mode: rnd.body(mode, mark))
                                for mode in decoder.programs}
        runs.append([[(e.token_ids, e.drafted_ids, e.fates) for e in decoder.run(prompt) if isinstance(e, RoundEvent)]
                     for prompt in random_prompts(200, 3, seed=2)])
    assert runs[0] == runs[1]


@CUDA
def test_bf16_greedy_head_trees_give_target_only_tokens(headed):
    """bf16 with every kernel: a tree node's logits are the one-token step's on its path, bit for
    bit (tests/gpu/test_gpu_ops.py), so greedy trees still give target-only's tokens."""
    target, whole, _ = headed
    prompts = random_prompts(200, 4, seed=6)
    reference = None
    for k, width, nodes in [(1, 1, 0), (3, 3, 9), (4, 4, 24)]:
        profile = tree_profile(target, whole, k, width, nodes, backend="cuda", max_tokens=32)
        profile = replace(profile, target=replace(profile.target, dtype="bfloat16"))
        engine = Engine(target_only(profile) if reference is None else profile)
        got = [finish(engine.decoder(), ids).token_ids for ids in prompts]
        reference = reference or got
        assert got == reference, (k, width, nodes)
