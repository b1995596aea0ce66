"""The shipped demo pair, loaded through the normal loader as the built-in default profile.

Acceptance floor: on the first 8 held-out prompts × 32 greedy tokens at k = 3 the measured
acceptance rate was 0.42 and the first-position acceptance 0.61 (2026-11-22, deterministic: greedy,
float32). The floors below leave room for float32 differences between CPUs and library versions.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specgen.core.events import Finished
from specgen.core.engine import Engine, target_only
from specgen.core.profile import load_profile
from specgen.core.settings import SpeculationSpec
from specgen.core.stats import AcceptanceStats

ACCEPTANCE_FLOOR = 0.33
FIRST_POSITION_FLOOR = 0.50


@pytest.fixture(scope="module")
def demo():
    engine = Engine(load_profile())  # no name: the built-in default
    prompts_file = engine.profile.target.path + "/../prompts.jsonl"
    prompts = [json.loads(line)["prompt"] for line in open(prompts_file, encoding="utf-8")][:8]
    return engine, prompts


def _finish(decoder, ids) -> Finished:
    return list(decoder.run(ids))[-1]


def test_default_profile_is_the_shipped_demo_pair(demo):
    engine, _ = demo
    assert engine.profile.name == "demo"
    assert engine.pair.draft is not None
    assert engine.pair.vocab_size == 4096


def test_demo_greedy_speculative_equals_target_only_and_accepts_enough(demo):
    engine, prompts = demo
    profile = replace(engine.profile, speculation=SpeculationSpec(k=3),
                      sampling=replace(engine.profile.sampling, max_tokens=32, ignore_eos=True))
    total = AcceptanceStats()
    for prompt in prompts:
        ids = engine.encode(prompt)
        spec = _finish(engine.decoder(profile), ids)
        base = _finish(engine.decoder(target_only(profile)), ids)
        assert spec.token_ids == base.token_ids
        assert spec.text == base.text
        total.merge(spec.stats)
    print(f"demo acceptance {total.acceptance_rate:.3f}, per position {total.per_position}")
    assert total.acceptance_rate >= ACCEPTANCE_FLOOR
    assert total.per_position[0] >= FIRST_POSITION_FLOOR
