"""The launches of a tree round's sample phase (the walk, the commit), counted on the CPU on the
GPU's tables (tests/launch_count.py): bounded, so that they cannot silently grow back.

Why: captured, each launch is a graph node and a gap of a few µs; the sample phase was some 60 of
them (0.10 ms of the bench pair's round on an H200, against 0.015 ms for a chain round's commit)
before the commit's bookkeeping became one op (core/sampling/bookkeeping.py's tree_commit). A
count is not a timing: these bounds say how many kernels the phase may launch, and that none of
them waits for the host.

What each case launches now: the warp (stats, probs; with top-p its cut), the walk, the commit,
each cache's compaction, the logits of the path's rows for the host's logprobs; sampled rejection
with drawn children gathers q by tree row (three ops) and runs its walk's node passes first (a
launch a drafted lane: three at width 3, gpu/kernels/tree_walk.py), Gumbel coupling the noise by
depth (two).

And a hybrid merged round's draft phase: its model round's, then the merge in one launch
(gpu/kernels/tree_merge.py) and the draft count's maximum; the reference's torch ops were some 120
launches (k = 3, width 3, 8 nodes: 431 draft-phase launches against the model round's 312).
"""

from __future__ import annotations

import triton_cpu  # noqa: I001  (first: TRITON_INTERPRET before Triton is imported, on a CPU)
import pytest

from decode_helpers import make_profile, random_prompts
from launch_count import CountingBackend, LaunchCounter, count_round
from specgen.core.engine import Engine
from specgen.core.round import Mode, TreeRound
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair, head_for

# the counts run the round's kernels on CPU tensors in the interpreter; with CUDA, Triton compiles
# them for the GPU instead (the captured rounds' own tests run there)
pytestmark = pytest.mark.skipif(not triton_cpu.INTERPRETED, reason="counted in the Triton interpreter, on a CPU")

SAMPLED = dict(temperature=0.9, top_p=0.95, seed=3)
GUMBEL = dict(temperature=0.9, top_p=0.95, coupling="gumbel", seed=11)
# (proposer, sampling, the mode counted, the sample phase's launches at most)
CASES = {
    "draft-greedy": ("draft", {}, Mode.MODEL, 7),
    "draft-rejection": ("draft", SAMPLED, Mode.MODEL, 14),
    "draft-gumbel": ("draft", GUMBEL, Mode.MODEL, 10),
    "eagle-greedy": ("eagle", {}, Mode.MODEL, 7),
    "lookup-greedy": ("ngram", {}, Mode.HOST, 6),
    "lookup-empty": ("ngram", {}, Mode.EMPTY, 6),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree_launches")
    target, draft = build_pair(root, noisy=0.1)
    return target, draft, head_for(target, root / "head")


def counted(models, proposer: str, sampling: dict, mode: Mode) -> LaunchCounter:
    target, draft, head = models
    kinds = {"draft": (draft, ProposerSpec()), "eagle": (None, ProposerSpec(kind="eagle", head=str(head))),
             "ngram": (None, ProposerSpec(kind="ngram", ngram_min=1, ngram_max=3)),
             "hybrid": (draft, ProposerSpec(kind="hybrid", ngram_min=1, ngram_max=3))}
    model, proposer_spec = kinds[proposer]
    merge = dict(hybrid_merge="always") if proposer == "hybrid" else {}  # every lookup's round merged
    profile = make_profile(target, model, k=3, proposer=proposer_spec, max_tokens=20,
                           speculation=dict(tree_width=3, tree_nodes=8, **merge), **sampling)
    decoder = Engine(profile, backend=CountingBackend()).decoder()
    assert isinstance(decoder.round, TreeRound)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6] + random_prompts(200, 1, seed=4)[0]  # lookups find some, miss some
    return count_round(decoder, prompt, after=2, mode=mode)  # past any first round's one-off work


@pytest.mark.parametrize("case", list(CASES))
def test_the_sample_phase_launches_a_bounded_number_of_kernels(models, case):
    proposer, sampling, mode, bound = CASES[case]
    counter = counted(models, proposer, sampling, mode)
    launches = counter.launches("sample")
    assert launches <= bound, f"{launches} launches: {dict(counter.ops['sample'])} {dict(counter.triton['sample'])}"
    assert counter.triton["sample"]["_tree_commit_kernel"] == 1 and counter.triton["sample"]["_walk_kernel"] == 1
    assert counter.triton["sample"]["_node_kernel"] == (3 if case == "draft-rejection" else 0)  # width 3
    assert not any(counter.syncs[phase] for phase in ("target", "sample")), counter.syncs


@pytest.mark.parametrize("sampling", [{}, SAMPLED], ids=["greedy", "rejection"])
def test_a_merged_tree_drafts_in_two_launches_more_than_its_model_tree(models, sampling):
    model, merged = (counted(models, "hybrid", sampling, mode) for mode in (Mode.MODEL, Mode.MERGED))
    extra = merged.launches("draft") - model.launches("draft")
    assert extra <= 2, f"{extra} more: {dict(merged.ops['draft'] - model.ops['draft'])}"
    assert merged.triton["draft"]["_merge_kernel"] == 1 and not merged.syncs["draft"], merged.syncs


def test_the_counter_counts_aten_ops_and_triton_launches_not_views():
    """The counter itself: a view launches nothing, an op one, a Triton kernel one (its
    interpreter's own torch calls not counted)."""
    import torch
    from specgen.gpu.kernels import commit as gpu_commit

    counter = LaunchCounter()
    x = torch.arange(6)
    args = (torch.ones(3, dtype=torch.bool), torch.tensor([3], dtype=torch.int32), torch.tensor(9), torch.tensor(0),
            torch.zeros(1, dtype=torch.int32))
    with counter:
        counter.mark()
        y = x.view(2, 3)[0]  # views: nothing
        z = y + 1  # one op
        torch.empty(4)  # an allocation: nothing
        gpu_commit.count_drafts(*args)  # one launch
    assert dict(counter.ops["draft"]) == {"add.Tensor": 1} and dict(counter.triton["draft"]) == {"_count_kernel": 1}
    assert z.tolist() == [1, 2, 3] and args[-1].item() == 3
