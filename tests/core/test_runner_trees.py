"""core/runner.py: token trees on transformers' models (EagerRunner.step_rows over a DynamicCache,
compact), on tiny fp32 checkpoints.

Each tree row's logits are the model's over the prefix and that row's path, whatever its siblings
(Llama, and DeepSeek-V3: the MTP proposer's targets run on transformers); after compact() moves an
accepted path into place, the next step is a fresh model's over the committed sequence; draft-model
trees on transformers give target-only's tokens; models with sliding windows step chains only.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from decode_helpers import finish, make_profile, random_prompts
from specgen.core.engine import Engine, target_only
from specgen.core.errors import UsageError
from specgen.core.round import TreeRound
from specgen.core.runner import EagerRunner, tree_steps_refusal
from specgen.core.settings import ProposerSpec
from specgen.core.step.rows import tree
from tiny_models import build_mtp_checkpoint, build_pair

transformers = pytest.importorskip("transformers")

# node i's parent (-1: a child of the prefix's last token); siblings at every depth, a path of 4
PARENTS = [-1, 0, 0, 1, 1, 2, 3, -1]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("transformers-trees"), noisy=0.1)  # a draft that agrees often


@pytest.fixture(scope="module", params=["llama", "deepseek_v3"])
def model(request, pair, tmp_path_factory):
    if request.param == "llama":
        folder = pair[0]
    else:
        folder = tmp_path_factory.mktemp("deepseek")
        build_mtp_checkpoint(folder)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def path(node: int) -> list[int]:
    """node's ancestors from the prefix's child down to itself."""
    out = [node]
    while PARENTS[out[-1]] >= 0:
        out.append(PARENTS[out[-1]])
    return out[::-1]


def fresh(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def tree_step(model, prefix: list[int], ids: list[int]) -> tuple[EagerRunner, torch.Tensor]:
    vocab = model.get_output_embeddings().weight.shape[0]
    runner = EagerRunner(model, vocab)
    runner.forward(torch.tensor(prefix))
    rows = tree(torch.tensor([ids]), torch.tensor(PARENTS), [len(prefix)])
    logits = torch.zeros(len(ids), vocab)
    runner.step_rows(rows, logits)
    return runner, logits


def test_each_tree_row_is_the_models_step_along_its_path(model):
    """A row seeing a sibling, another branch or its own slot's wrong position would change its logits."""
    vocab = model.get_output_embeddings().weight.shape[0]
    prefix, ids = [3, 14, 15, 9, 2], [(7 * i + 5) % vocab for i in range(len(PARENTS))]
    _, logits = tree_step(model, prefix, ids)
    for node in range(len(PARENTS)):
        torch.testing.assert_close(logits[node], fresh(model, prefix + [ids[i] for i in path(node)]),
                                   rtol=1e-5, atol=1e-5)
    assert logits.std() > 0.01  # the comparison is between non-trivial numbers


def test_compact_keeps_the_accepted_path_as_a_chain(model):
    """After the tree step, the path 0 -> 1 -> 4 moved into the slots after the prefix: the next
    step at the committed position is a fresh model's over prefix + path + the next token."""
    vocab = model.get_output_embeddings().weight.shape[0]
    prefix, ids = [8, 1, 6, 2], [(11 * i + 3) % vocab for i in range(len(PARENTS))]
    runner, _ = tree_step(model, prefix, ids)
    accepted, start = [0, 1, 4], len(prefix)
    runner.compact(torch.tensor(accepted) + start, torch.arange(len(accepted)) + start)
    runner.position.fill_(start + len(accepted))
    nxt = 17 % vocab
    got = runner.forward(torch.tensor([nxt]))[0]
    torch.testing.assert_close(got, fresh(model, prefix + [ids[i] for i in accepted] + [nxt]), rtol=1e-5, atol=1e-5)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)])
def test_draft_model_trees_on_transformers_give_target_only_tokens(pair, sampling, backend):
    """On the CPU and, where there is one, on a GPU (the CUDA backend runs transformers' tree steps
    eagerly, float32)."""
    target, draft = pair
    prompts = random_prompts(200, 3, seed=2)
    reference = None
    for k, width, nodes in [(1, 1, 0), (3, 2, 6), (4, 3, 12)]:
        profile = make_profile(target, draft, k=k, backend=backend, speculation=dict(tree_width=width, tree_nodes=nodes),
                               **sampling)
        profile = replace(profile, runtime=replace(profile.runtime, modeling="transformers"))
        engine = Engine(target_only(profile) if reference is None else profile)
        assert engine.pair.modeling == "transformers"
        decoder = engine.decoder()
        assert isinstance(decoder.round, TreeRound) == (width > 1)
        done = [finish(engine.decoder(), ids) for ids in prompts]
        got = [d.token_ids for d in done]
        reference = reference or got
        assert got == reference, (k, width, nodes)
        if width > 1:  # accepted nodes: compact() moved paths of several tokens
            assert sum(d.stats.accepted for d in done) > 10


@pytest.mark.parametrize("backend", ["torch", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("kind", ["ngram", "hybrid"])
def test_lookup_trees_on_transformers_give_target_only_tokens(pair, kind, backend):
    """Prompt lookup's trees (and hybrid's, the lookup's trie alone or the model's tree) on
    transformers' models: rounds whose lookup finds nothing step the root alone (ngram's EMPTY
    program), whose compaction names slots past the cache's entries."""
    target, draft = pair
    base = make_profile(target, draft, k=3, backend=backend, proposer=ProposerSpec(kind=kind, ngram_min=1, ngram_max=3),
                        speculation=dict(tree_width=2, tree_nodes=6), max_tokens=40)
    profile = replace(base, runtime=replace(base.runtime, modeling="transformers"))
    engine = Engine(profile)
    assert engine.pair.modeling == "transformers"
    prompts = [[5, 6, 7, 8] * 3 + [5, 6], *random_prompts(200, 2, seed=4)]
    want = [finish(engine.decoder(target_only(profile)), ids).token_ids for ids in prompts]
    decoder = engine.decoder()
    assert isinstance(decoder.round, TreeRound)
    got = [finish(decoder, ids) for ids in prompts]
    assert [d.token_ids for d in got] == want
    assert sum(decoder.proposer_rounds.values()) > 0


def test_models_with_sliding_windows_step_no_tree_rows():
    """transformers takes a tree's 4D mask as given, sliding-window layers included: refused."""
    mistral = SimpleNamespace(config=transformers.MistralConfig(sliding_window=16))
    assert tree_steps_refusal(mistral) == ("need specgen's own model step or a transformers model without sliding "
                                           "windows, and this pair runs mistral on transformers")
    gemma = SimpleNamespace(config=transformers.Gemma2Config())
    assert tree_steps_refusal(gemma).endswith("this pair runs gemma2 on transformers")
    for config in (transformers.LlamaConfig(), transformers.MistralConfig(sliding_window=None),
                   transformers.Qwen2Config(use_sliding_window=False, sliding_window=16)):
        assert tree_steps_refusal(SimpleNamespace(config=config)) == "", config.model_type
    runner = EagerRunner.__new__(EagerRunner)
    runner.model = mistral
    with pytest.raises(UsageError, match="^token trees need specgen's own model step or a transformers model"):
        runner.step_rows(None, None)
