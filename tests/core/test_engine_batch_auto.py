"""batch_size through the engine (core/engine.py `resolve_batch`): a number stands; auto from the
batch rows bench kept for this pair on this device (core/measured.py), capped by memory on a GPU;
the caches a run reserves, and the memory estimate against what a row's caches take. With
--proposer eagle, auto reads the rows bench kept for that head (and target-only's), never the
draft model's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from decode_helpers import BACKENDS, CUDA, make_profile
from specgen.core import measured
from specgen.core.batch_cost import BatchChoice
from specgen.core.engine import Engine, batch_row_bytes, device_name
from specgen.core.round.batch_round import SLACK
from specgen.core.settings import ProposerSpec, RuntimeSpec
from tiny_models import build_pair, head_for


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch-auto"), noisy=0.1)


def profile_of(pair, folder, batch_size="auto", backend: str = "torch", **proposer):
    profile = make_profile(*pair, k=3, backend=backend, proposer=ProposerSpec(**proposer) if proposer else None,
                           max_tokens=10)
    return replace(profile, runtime=RuntimeSpec(threads=1, measured=str(folder), batch_size=batch_size))


def keep(engine: Engine, folder, tps: dict, proposer: str = "draft", head: str | None = None) -> None:
    """Synthetic batch bench rows for this engine's pair and device: {(batch, k): tokens/s}, or
    {(batch, k, tree_width, tree_nodes): tokens/s} for a tree's."""
    profile = engine.profile
    document = {"proposer": proposer,
                "pair": {"target": profile.target.path, "draft": profile.draft.path if profile.draft else None,
                         "head": head, "device_name": device_name(engine.pair.device), "dtype": "float32"},
                "temperature": 0.0, "coupling": None, "max_tokens": 10,
                "results": [{"batch_size": key[0], "k": key[1], "tokens_per_second": v,
                             **(dict(tree_width=key[2], tree_nodes=key[3]) if len(key) == 4 else {})}
                            for key, v in tps.items()]}
    measured.save_batches(str(folder), document)


WORK = (20, 18)  # 20 prompts, the longest 8 tokens and max_tokens 10


def test_a_number_stands(pair, tmp_path):
    engine = Engine(profile_of(pair, tmp_path, 4))
    choice = engine.resolve_batch(engine.profile, *WORK)
    assert (choice.batch, choice.measured, choice.reason) == (4, False, None)
    assert engine.batch_profile(engine.profile, choice) is engine.profile


def test_auto_takes_the_measured_choice_and_its_k(pair, tmp_path):
    engine = Engine(profile_of(pair, tmp_path))
    nothing = engine.resolve_batch(engine.profile, *WORK)
    assert (nothing.batch, nothing.measured) == (1, False)
    assert nothing.reason.startswith("nothing measured for target + draft on ")
    keep(engine, tmp_path, {(1, 0): 10, (1, 2): 30, (4, 0): 50, (4, 2): 90, (8, 0): 80, (8, 2): 70})
    engine = Engine(profile_of(pair, tmp_path))
    choice = engine.resolve_batch(engine.profile, *WORK)
    assert (choice.batch, choice.speculate, choice.k, choice.measured) == (4, True, 2, True)
    assert choice.reason.startswith("batch 4, k=2 (bench's measurements, target + draft on ")
    resolved = engine.batch_profile(engine.profile, choice)
    assert resolved.speculation.k == 2 and resolved.proposer.kind == "draft"
    assert engine.resolve_batch(engine.profile, 3, 18).batch == 3  # never more rows than prompts
    assert engine.resolve_batch(engine.profile, 1, 18).batch == 1


def test_auto_takes_a_measured_tree_only_with_tree_width_auto(pair, tmp_path):
    """Rows of a tree at batch (bench --batch-size --tree-width): tree_width 1 chooses among the
    chains, tree_width auto takes the tree where it was fastest, and the run decodes that shape."""
    engine = Engine(profile_of(pair, tmp_path))
    keep(engine, tmp_path, {(4, 0): 100.0, (4, 2): 150.0, (4, 2, 2, 4): 180.0})
    chain = engine.resolve_batch(engine.profile, *WORK)
    assert (chain.batch, chain.k, chain.tree_width) == (4, 2, 1)
    assert engine.batch_profile(engine.profile, chain).speculation.tree_width == 1
    auto = replace(engine.profile, speculation=replace(engine.profile.speculation, tree_width="auto"))
    tree = engine.resolve_batch(auto, *WORK)
    assert (tree.batch, tree.k, tree.tree_width, tree.tree_nodes) == (4, 2, 2, 4)
    assert tree.reason.startswith("batch 4, k=2 w=2 n=4 (bench's measurements")
    spec = engine.batch_profile(auto, tree).speculation
    assert (spec.k, spec.tree_width, spec.tree_nodes) == (2, 2, 4)
    assert type(engine.batch_decoder(4, engine.batch_profile(auto, tree)).round).__name__ == "BatchTreeRound"


def test_a_set_batch_size_takes_its_measured_tree_shape_where_the_shape_is_auto(pair, tmp_path):
    """batch_size 16 with tree_width auto: the fastest speculative run measured at the nearest
    batch size (4 here), its k and tree, the batch size standing; tree_nodes auto with width 2:
    that width's node budgets only; nothing measured: a chain, said in the reason."""
    engine = Engine(profile_of(pair, tmp_path, 16))
    spec = engine.profile.speculation
    auto = replace(engine.profile, speculation=replace(spec, tree_width="auto"))
    none = engine.resolve_batch(auto, *WORK)
    assert (none.batch, none.measured) == (16, False) and "nothing measured" in none.reason
    assert engine.batch_profile(auto, none) is auto  # left auto: the batch decodes it as a chain
    keep(engine, tmp_path, {(1, 0): 50.0, (1, 3): 90.0, (4, 0): 100.0, (4, 2): 150.0, (4, 3, 2, 6): 180.0,
                            (4, 2, 4, 5): 170.0})
    choice = engine.resolve_batch(auto, *WORK)
    assert (choice.batch, choice.k, choice.tree_width, choice.tree_nodes) == (16, 3, 2, 6)
    assert choice.reason.startswith("batch 16, k=3 w=2 n=6 (bench's measurements") and "at batch 4" in choice.reason
    resolved = engine.batch_profile(auto, choice).speculation
    assert (resolved.k, resolved.tree_width, resolved.tree_nodes) == (3, 2, 6)
    width4 = replace(engine.profile, speculation=replace(spec, tree_width=4, tree_nodes="auto"))
    four = engine.resolve_batch(width4, *WORK)
    assert (four.k, four.tree_width, four.tree_nodes) == (2, 4, 5)
    assert engine.resolve_batch(engine.profile, *WORK) == BatchChoice(16)  # no auto: the number alone


def test_auto_is_batch_one_where_batches_cannot_run(pair, tmp_path):
    profile = profile_of(pair, tmp_path, kind="hybrid")
    trees = replace(profile, speculation=replace(profile.speculation, tree_width=2, tree_nodes=4,
                                                 hybrid_merge="always"))
    engine = Engine(trees)
    choice = engine.resolve_batch(engine.profile, *WORK)
    assert (choice.batch, choice.measured) == (1, False)
    assert choice.reason == ("batch 1: batches take hybrid's trees with hybrid_merge = never only (each row the "
                             "lookup's trie or the model's tree), not always")


def test_auto_with_hybrid_reads_hybrids_rows_of_its_model(pair, tmp_path):
    """hybrid's rows (bench --batch-size --proposer hybrid) are its model's: a hybrid run with the
    draft model reads none of hybrid's rows measured with an EAGLE-3 head."""
    engine = Engine(profile_of(pair, tmp_path, kind="hybrid"))
    nothing = engine.resolve_batch(engine.profile, *WORK)
    assert (nothing.batch, nothing.measured) == (1, False)
    assert nothing.reason.startswith("nothing measured for target + draft on ")
    keep(engine, tmp_path, {(1, 0): 10, (1, 2): 30, (4, 0): 50, (4, 2): 90}, proposer="hybrid", head="some/head")
    engine = Engine(profile_of(pair, tmp_path, kind="hybrid"))
    assert engine.resolve_batch(engine.profile, *WORK).measured is False  # a head's hybrid rows, not this run's
    keep(engine, tmp_path, {(1, 0): 10, (1, 2): 30, (4, 0): 50, (4, 3): 95})  # the draft proposer's: not hybrid's
    keep(engine, tmp_path, {(1, 0): 10, (1, 2): 30, (4, 0): 50, (4, 2): 90}, proposer="hybrid")
    choice = Engine(profile_of(pair, tmp_path, kind="hybrid")).resolve_batch(engine.profile, *WORK)
    assert (choice.batch, choice.speculate, choice.k, choice.measured) == (4, True, 2, True)


def test_a_run_reserves_its_caches_before_the_first_prompt(pair, tmp_path):
    engine = Engine(profile_of(pair, tmp_path, 2))
    decoder = engine.batch_decoder(2, room=300)
    rnd = decoder.round
    assert rnd.capacity == 300 + rnd.reach + SLACK
    generation = rnd.generation
    list(decoder.run([([1, 2, 3], engine.profile.sampling)] * 3))
    assert rnd.generation == generation  # not grown while it ran


def test_the_row_estimate_covers_a_rows_caches(pair, tmp_path):
    """batch_row_bytes counts at least what the round's caches take per row at their capacity."""
    engine = Engine(profile_of(pair, tmp_path, 2))
    rnd = engine.batch_decoder(2, room=100).round
    cached = sum(t.numel() * t.element_size() for cache in rnd.caches
                 for t in (*cache.keys, *cache.values, *cache.copies.values())) // rnd.batch
    estimate = batch_row_bytes((engine.pair.target, engine.pair.draft), rnd.capacity, rnd.k, engine.width)
    assert cached <= estimate < 4 * cached + 10 * 4 * (3 * (rnd.k + 1) + 3) * engine.width


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_caps_auto_on_a_gpu_only(pair, tmp_path, backend):
    """On the CPU memory is not capped; on a GPU the reason says how many rows fit, and a row as
    long as the free memory fits nowhere: batch 1."""
    engine = Engine(profile_of(pair, tmp_path, backend=backend))
    keep(engine, tmp_path, {(1, 0): 10, (1, 2): 30, (4, 0): 50, (4, 2): 90})
    engine = Engine(profile_of(pair, tmp_path, backend=backend))
    choice = engine.resolve_batch(engine.profile, *WORK)
    assert choice.batch == 4
    if backend == "torch":
        assert choice.reason.endswith("; memory not capped on cpu")
        return
    assert "; memory holds " in choice.reason and "GiB free" in choice.reason
    free, _ = torch.cuda.mem_get_info(engine.pair.device)
    models = (engine.pair.target, engine.pair.draft)
    position = batch_row_bytes(models, 2, 3, engine.width) - batch_row_bytes(models, 1, 3, engine.width)
    huge = 2 * free // position + 10  # prompts whose caches alone outgrow the free memory
    capped = engine.resolve_batch(engine.profile, 20, huge)
    assert capped.batch == 1 and "no measured batch fits" in capped.reason


@pytest.fixture(scope="module")
def heads(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-auto-heads")
    return head_for(pair[0], root / "head"), head_for(pair[0], root / "other", seed=5)


def eagle_profile(pair, folder, head, batch_size="auto", backend: str = "torch"):
    profile = profile_of(pair, folder, batch_size, backend, kind="eagle", head=str(head))
    return replace(profile, draft=None)


def test_auto_with_a_head_reads_that_heads_rows(pair, heads, tmp_path):
    """The draft model's rows say nothing of a head's batches: with only those kept, an eagle run
    has nothing measured (batch 1, and the reason says how to measure a head's); with the head's
    rows it chooses from them as a draft run does from its own; another head's rows stay apart."""
    head, other = heads
    engine = Engine(eagle_profile(pair, tmp_path, head))
    draft_engine = Engine(profile_of(pair, tmp_path))
    keep(engine, tmp_path, {(1, 0): 10, (4, 0): 50, (8, 0): 80})  # target-only rows
    keep(engine, tmp_path, {(1, 2): 300, (4, 2): 900, (8, 2): 1000}, proposer="draft")  # not the head's
    nothing = engine.resolve_batch(engine.profile, *WORK)
    assert (nothing.batch, nothing.measured) == (1, False)
    assert nothing.reason.startswith("nothing measured for target + no draft on ")
    assert ", EAGLE-3 head head, greedy: batch 1 (specgen bench --batch-size 1,4,8,16 --proposer eagle " \
           "measures batches)" in nothing.reason
    keep(engine, tmp_path, {(1, 3): 30, (4, 3): 90, (8, 3): 70}, proposer="eagle", head=str(head))
    keep(engine, tmp_path, {(1, 3): 5, (4, 3): 5, (8, 3): 500}, proposer="eagle", head=str(other))
    engine = Engine(eagle_profile(pair, tmp_path, head))
    choice = engine.resolve_batch(engine.profile, *WORK)
    assert (choice.batch, choice.speculate, choice.k, choice.measured) == (4, True, 3, True)
    assert choice.reason.startswith("batch 4, k=3 (bench's measurements, target + no draft on ")
    assert "batch 1 k=3 30 tok/s, batch 4 k=3 90 tok/s, batch 8 target-only 80 tok/s" in choice.reason
    resolved = engine.batch_profile(engine.profile, choice)
    assert resolved.proposer.kind == "eagle" and resolved.speculation.k == 3
    mine = Engine(eagle_profile(pair, tmp_path, other))
    assert mine.resolve_batch(mine.profile, *WORK).batch == 8  # the other head's rows: B = 8 at 500 tok/s
    # the draft model's run of the same target (another key: it has a draft) reads none of these
    assert draft_engine.resolve_batch(draft_engine.profile, *WORK).measured is False


def test_the_row_estimate_covers_a_heads_cache(pair, heads, tmp_path):
    """With a head, batch_row_bytes counts its one layer's cache at the round's capacity and its
    tap's target states, beside the target's cache: at least what the round holds per row."""
    engine = Engine(eagle_profile(pair, tmp_path, heads[0], 2))
    rnd = engine.batch_decoder(2, room=100).round
    drafter = rnd.drafter
    held = sum(t.numel() * t.element_size() for cache in rnd.caches
               for t in (*cache.keys, *cache.values, *cache.copies.values()))
    held += sum(t.numel() * t.element_size() for t in (*drafter.cache.keys, *drafter.cache.values, drafter.tap.out))
    head = engine.heads["eagle"].head
    estimate = batch_row_bytes((engine.pair.target, None), rnd.capacity, rnd.k, engine.width, head)
    without = batch_row_bytes((engine.pair.target, None), rnd.capacity, rnd.k, engine.width)
    assert held // rnd.batch <= estimate
    c = head.config
    assert estimate - without == (rnd.capacity * 2 * c.num_key_value_heads * c.head_dim
                                  + (rnd.k + 1) * 3 * c.target_hidden_size) * head.fc.weight.element_size()


@pytest.mark.parametrize("backend", [pytest.param("cuda", marks=CUDA)])
def test_memory_caps_a_heads_auto_with_its_cache(pair, heads, tmp_path, backend):
    """On a GPU the eagle run's cap counts the head's cache per row (not a draft model's)."""
    engine = Engine(eagle_profile(pair, tmp_path, heads[0], backend=backend))
    keep(engine, tmp_path, {(1, 0): 10, (1, 2): 30, (4, 0): 50, (4, 2): 90}, proposer="eagle", head=str(heads[0]))
    choice = engine.resolve_batch(engine.profile, *WORK)
    assert choice.batch == 4 and "; memory holds " in choice.reason
    head = engine.heads["eagle"].head
    positions = WORK[1] + 3 + 3 + SLACK  # the longest, k + 3, the slack
    per_row = batch_row_bytes((engine.pair.target, None), positions, 3, engine.width, head)
    assert f"{per_row / 2**20:,.1f} MiB a row at {positions:,} positions" in choice.reason
