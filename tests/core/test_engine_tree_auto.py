"""tree_width / tree_nodes auto through the engine (core/engine.py `resolve`): from the facts bench
kept for this pair on this device (core/measured.py), on tiny float32 models on the CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from decode_helpers import BACKENDS, finish, make_profile, random_prompts
from specgen.core import measured
from specgen.core.engine import Engine, device_name, target_only
from specgen.core.round import Round, TreeRound
from specgen.core.settings import ProposerSpec, RuntimeSpec
from tiny_models import build_pair, head_for

AUTO = dict(tree_width="auto", tree_nodes="auto")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("auto"), noisy=0.1)


def auto_profile(pair, folder, backend: str = "torch", **speculation):
    profile = make_profile(*pair, k=3, backend=backend, speculation=speculation or AUTO)
    return replace(profile, runtime=RuntimeSpec(threads=1, measured=str(folder)))


def keep(engine: Engine, folder, tree_tokens: float, alone_ms: float, proposer: str = "draft",
         head: str | None = None) -> None:
    """Synthetic bench rows for this engine's pair and device: a chain of k = 3 and a width-2 tree
    of 5 nodes, equal in cost, the tree accepting `tree_tokens`; target-only at alone_ms a round.
    proposer, head: whose rows (a head's carry its folder, "-" none at all: kept before they did)."""
    ms = {"draft": 0.2, "verify": 0.3, "sample": 0.05, "other": 0.0, "total": 0.55}
    result = {"proposer": proposer, "temperature": 0.0, "coupling": None, "k": 3, "mean_accepted_length": 2.0,
              "round_ms": ms, "per_position_acceptance": [0.5, 0.3, 0.2], "counts": {"rounds": 40}}
    if head != "-":
        result["head"] = head
    profile = engine.profile
    document = {"created": None, "profile": {"target": profile.target.path,
                                             "draft": profile.draft.path if profile.draft else None},
                "environment": {"device_name": device_name(engine.pair.device), "dtype": "float32"},
                "settings": {"max_tokens": 128}, "prompts": [{"index": 0, "tokens": 20}],
                "results": [{**result, "tree_width": 1, "tree_nodes": 3},
                            {**result, "tree_width": 2, "tree_nodes": 5, "mean_accepted_length": tree_tokens}],
                "baselines": [{"method": "target-only", "temperature": 0.0, "coupling": None, "available": True,
                               "rounds": 90, "round_ms": {"draft": 0.0, "verify": alone_ms, "sample": 0.0,
                                                          "other": 0.0, "total": alone_ms}}]}
    measured.save(str(folder), document)


def test_auto_with_nothing_measured_is_a_chain_and_says_so(pair, tmp_path):
    engine = Engine(auto_profile(pair, tmp_path))
    assert type(engine.decoder().round) is Round
    described = engine.describe()
    assert (described["tree_width"], described["tree_nodes"]) == (1, 3)
    assert described["tree_auto"].startswith("nothing measured for target + draft on ")
    assert "a chain (specgen bench" in described["tree_auto"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_takes_the_shape_measured_fastest(pair, tmp_path, backend):
    """On the CUDA backend too: the facts are keyed by the GPU's name, and the tree round chosen is
    captured as any other."""
    engine = Engine(auto_profile(pair, tmp_path, backend))
    keep(engine, tmp_path, tree_tokens=2.6, alone_ms=0.5)
    engine = Engine(auto_profile(pair, tmp_path, backend))  # facts are read once per engine
    decoder = engine.decoder()
    assert isinstance(decoder.round, TreeRound) and (decoder.round.tree.w, decoder.round.tree.n) == (2, 5)
    assert (engine.describe()["tree_width"], engine.describe()["tree_nodes"]) == (2, 5)
    assert engine.describe()["tree_auto"].startswith("a tree of width 2, 5 nodes (bench's measurements")
    prompts = random_prompts(200, 2, seed=3)  # greedy: whatever the shape, target-only's tokens
    reference = [finish(engine.decoder(target_only(engine.profile)), ids).token_ids for ids in prompts]
    assert [finish(decoder, ids).token_ids for ids in prompts] == reference
    # only what is auto is chosen: a fixed node budget the chosen width holds stays
    resolved, choice = engine.resolve(auto_profile(pair, tmp_path, backend, tree_width="auto", tree_nodes=4))
    assert (resolved.speculation.tree_width, resolved.speculation.tree_nodes) == (2, 4)
    assert "w=2 n=4" in choice.reason and "(modelled)" in choice.reason


def test_auto_leaves_out_trees_measured_far_shorter_than_the_run(pair, tmp_path):
    """The run's reach (generate passes its longest prompt's positions) against the bench's: a tree
    measured where generations reached about 150 positions is not chosen for a run of 2,000, whose
    decoder is then the chain, and the report says so."""
    engine = Engine(auto_profile(pair, tmp_path))
    keep(engine, tmp_path, tree_tokens=2.6, alone_ms=0.5)  # the bench's prompts: 20 tokens, max_tokens 128
    engine = Engine(auto_profile(pair, tmp_path))
    assert isinstance(engine.decoder(positions=300).round, TreeRound)
    assert type(engine.decoder(positions=2000).round) is Round
    described = engine.describe(positions=2000)
    assert (described["tree_width"], described["tree_nodes"]) == (1, 3)
    assert "trees left out: measured where generations reached about 148 positions" in described["tree_auto"]


def test_auto_chooses_no_speculation_where_target_only_is_faster(pair, tmp_path):
    engine = Engine(auto_profile(pair, tmp_path))
    keep(engine, tmp_path, tree_tokens=2.1, alone_ms=0.2)
    engine = Engine(auto_profile(pair, tmp_path))
    resolved, choice = engine.resolve(engine.profile)
    assert not choice.speculate and resolved.proposer.kind == "none"
    assert engine.decoder().round.k == 0
    assert engine.describe()["tree_auto"].startswith("no speculation, target-only is faster")


def test_auto_is_a_chain_where_trees_cannot_run(pair, tmp_path):
    """Trees take no draft_p_min yet: with it auto is the chain, not an error."""
    profile = replace(auto_profile(pair, tmp_path), proposer=ProposerSpec(kind="draft", draft_p_min=0.3))
    engine = Engine(profile)
    assert type(engine.decoder().round) is Round
    assert engine.describe()["tree_auto"].startswith("a chain: token trees do not take draft_p_min yet")


@pytest.fixture(scope="module")
def heads(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("tree-auto-heads")
    return head_for(pair[0], root / "head"), head_for(pair[0], root / "other", seed=5)


def eagle_profile(pair, folder, head):
    profile = auto_profile(pair, folder)
    return replace(profile, draft=None, proposer=ProposerSpec(kind="eagle", head=str(head)))


def test_auto_with_a_head_reads_that_heads_tree_rows(pair, heads, tmp_path):
    """An eagle run's auto reads the rows bench kept for its head: not the draft model's, not
    another head's, not a head's kept before rows carried one (whose head is unknown)."""
    head, other = heads
    engine = Engine(eagle_profile(pair, tmp_path, head))
    keep(engine, tmp_path, tree_tokens=3.0, alone_ms=0.5, proposer="eagle", head="-")  # kept without a head
    keep(engine, tmp_path, tree_tokens=3.0, alone_ms=0.5, proposer="draft")
    nothing = Engine(eagle_profile(pair, tmp_path, head)).describe()["tree_auto"]
    assert nothing.startswith("nothing measured for target + no draft on ")
    assert ", EAGLE-3 head head, greedy: a chain" in nothing
    keep(engine, tmp_path, tree_tokens=2.6, alone_ms=0.5, proposer="eagle", head=str(head))  # the tree wins
    keep(engine, tmp_path, tree_tokens=2.0, alone_ms=0.5, proposer="eagle", head=str(other))  # the chain does
    mine, theirs = (Engine(eagle_profile(pair, tmp_path, h)) for h in (head, other))
    assert (mine.describe()["tree_width"], mine.describe()["tree_nodes"]) == (2, 5)
    assert mine.describe()["tree_auto"].startswith("a tree of width 2, 5 nodes (bench's measurements, target + "
                                                   "no draft on ")
    assert ", EAGLE-3 head head, T=0)" in mine.describe()["tree_auto"]
    assert theirs.describe()["tree_width"] == 1 and ", EAGLE-3 head other, T=0)" in theirs.describe()["tree_auto"]
