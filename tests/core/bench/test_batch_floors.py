"""core/bench/batches.py's rounds against their floor (tiny models, CPU): RoundMeter counts the rounds
and sums, on the device before each launch, the rows and cached positions the floor reads; the
sums equal a hand count where the positions are known (a draft that is the target: every draft
accepted), and what the host sees before each launch with two rounds in flight. The CPU has no
copy bandwidth: the floor's ms is null there, and a stand-in bandwidth gives it. An EAGLE-3 head
drafting the batch: its bytes a call and a position equal a hand count of the tiny head, and its
calls' floor is what the host sees the rows hold before each launch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from decode_helpers import BACKENDS, CUDA, make_profile
from specgen.core.bench import batches, floors
from specgen.core.engine import Engine
from specgen.core.settings import ProposerSpec
from tiny_models import build_pair, head_for

K = 2
MAX_TOKENS = 7  # k = 2, all accepted: rounds of 3, 3 and 1 tokens (the last round's budget is 0)
PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def same_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("batch-floors-same"), same=True)


@pytest.fixture(scope="module")
def same_engine(same_pair):
    return Engine(make_profile(*same_pair, k=K, max_tokens=MAX_TOKENS, speculation=dict(pipeline="off")))


@pytest.fixture(scope="module", params=BACKENDS)
def noisy_engine(request, tmp_path_factory):
    target, draft = build_pair(tmp_path_factory.mktemp("batch-floors-noisy"), noisy=0.1)
    return Engine(make_profile(target, draft, k=3, max_tokens=9, backend=request.param,
                               speculation=dict(pipeline="on")))


def target_only(profile):
    return replace(profile, proposer=replace(profile.proposer, kind="none"))


def steps(engine) -> tuple[floors.StepBytes, floors.StepBytes]:
    pair = engine.pair
    return tuple(floors.StepBytes(floors.streamed_bytes(m), floors.cache_bytes_per_position(m.config, m.dtype.itemsize))
                 for m in (pair.target, pair.draft))


def test_a_target_only_batch_reads_each_rows_positions_round_by_round(same_engine):
    """B = 3, every prompt at once: round r reads L - 1 + r positions of a row of L prompt ids."""
    result = batches.run(same_engine, target_only(same_engine.profile), 3, PROMPTS, warmup=0)
    target, _ = steps(same_engine)
    assert result["rounds"] == MAX_TOKENS and result["rows_per_round"] == 3
    positions = sum(len(p) - 1 + r for p in PROMPTS for r in range(MAX_TOKENS))
    assert result["round_floor_bytes"] == {
        "target": (MAX_TOKENS * target.weights + target.per_position * positions) / MAX_TOKENS, "draft": None}
    assert result["round_ms"] > 0
    assert result["round_floor_ms"] is None and result["round_over_floor"] is None  # no bandwidth on the CPU


def test_a_speculative_batch_reads_the_drafts_positions_too(same_engine):
    """k = 2, every draft accepted: a row of L ids holds L - 1 + g target positions and L - 2 + g
    draft positions after g generated tokens, g = 0, 3, 6 (three rounds to 7 tokens)."""
    result = batches.run(same_engine, same_engine.profile, 3, PROMPTS, warmup=0, bandwidth=5e8)
    target, draft = steps(same_engine)
    assert result["rounds"] == 3 and result["rows_per_round"] == 3
    assert result["mean_accepted_length"] == pytest.approx(7 / 3)  # tokens a round: 3, 3, 1
    target_positions = sum(len(p) - 1 + g for p in PROMPTS for g in (0, 3, 6))
    draft_positions = sum(len(p) - 2 + g for p in PROMPTS for g in (0, 3, 6))
    rows = 9
    draft_read = K * draft_positions + rows * (K - 1) * (K + 2) // 2  # a row at P: P, P + 2 (k = 2)
    expected = {"target": 3 * target.weights + target.per_position * target_positions,
                "draft": K * 3 * draft.weights + draft.per_position * draft_read}
    assert expected == floors.batch_bytes(target, draft, K, 3, rows, target_positions, draft_positions)
    assert result["round_floor_bytes"] == {name: v / 3 for name, v in expected.items()}
    floor = sum(expected.values()) / 3 / 5e8 * 1e3
    assert result["round_floor_ms"] == pytest.approx(floor)
    assert result["round_over_floor"] == pytest.approx(result["round_ms"] / floor)


def test_batch_one_is_the_single_prompt_decoder(same_engine, monkeypatch):
    """At B = 1 the prompts run one after another through the decoder `generate` runs at batch 1,
    never the batch decoder; the floor counts each round's row where the batch counts it (k = 2,
    every draft accepted: rounds at g = 0, 3, 6 generated tokens)."""
    def refused(*args, **kwargs):
        raise AssertionError("batch 1 ran the batch decoder")

    monkeypatch.setattr(same_engine, "batch_decoder", refused)
    result = batches.run(same_engine, same_engine.profile, 1, PROMPTS, warmup=1, bandwidth=5e8)
    assert result["decoder"] == "single" and result["batch_size"] == 1 and result["prompts"] == 3
    assert result["tokens"] == 3 * MAX_TOKENS and result["seconds"] > 0
    assert result["rounds"] == 9 and result["rows_per_round"] == 1
    assert result["mean_accepted_length"] == pytest.approx(7 / 3)  # tokens a round: 3, 3, 1
    target, draft = steps(same_engine)
    target_positions = sum(len(p) - 1 + g for p in PROMPTS for g in (0, 3, 6))
    draft_positions = sum(len(p) - 2 + g for p in PROMPTS for g in (0, 3, 6))
    expected = floors.batch_bytes(target, draft, K, 9, 9, target_positions, draft_positions)
    assert result["round_floor_bytes"] == {name: v / 9 for name, v in expected.items()}
    assert result["round_ms"] > 0 and result["round_over_floor"] == pytest.approx(
        result["round_ms"] / (sum(expected.values()) / 9 / 5e8 * 1e3))


def test_a_batch_row_names_its_decoder(same_engine):
    result = batches.run(same_engine, target_only(same_engine.profile), 2, PROMPTS, warmup=0)
    assert result["decoder"] == "batch" and result["k"] == 0 and result["tree_nodes"] == 0


class Watched(batches.RoundMeter):
    """RoundMeter that also reads, on the host, what each launch's rows hold (a sync, for the test)."""

    def __init__(self, program, rnd):
        super().__init__(program, rnd)
        self.seen = [0, 0, 0, 0]  # rows, target positions, draft model positions, a head's origins P - e

    def launch(self):
        self.rnd.flush()  # the rows' recorded starts and stops: what the launch reads
        live = self.rnd.active.tolist()
        positions = self.rnd.positions.tolist()
        emitted = self.rnd.emitted.tolist()
        self.seen[0] += sum(live)
        for which in (0, 1):  # a round without a draft model: the target's positions twice
            self.seen[which + 1] += sum(p for p, on in zip(positions[min(which, len(positions) - 1)], live) if on)
        self.seen[3] += sum(max(p - e, 0) for p, e, on in zip(positions[0], emitted, live) if on)
        super().launch()


def test_with_two_rounds_in_flight_the_sums_are_what_each_launch_reads(noisy_engine, monkeypatch):
    """Pipelined (rows end mid-flight and run one round on, refills between): the device's sums
    are what the rows held at each launch, rounds and rows included."""
    meters = []

    def watched(program, rnd):
        meters.append(Watched(program, rnd))
        return meters[-1]

    monkeypatch.setattr(batches, "RoundMeter", watched)
    prompts = PROMPTS + [[21, 22], [23, 24, 25, 26], [27]]
    result = batches.run(noisy_engine, noisy_engine.profile, 2, prompts, warmup=1)
    meter = meters[0]
    assert list(meter.totals()) == meter.seen and meter.seen[0] > 0
    assert result["rounds"] == meter.rounds > 0
    assert result["rows_per_round"] == pytest.approx(meter.seen[0] / meter.rounds)
    target, draft = steps(noisy_engine)
    parts = floors.batch_bytes(target, draft, 3, meter.rounds, *meter.seen[:3])
    assert result["round_floor_bytes"] == {name: v / meter.rounds for name, v in parts.items()}


def test_floor_facts_of_the_document(same_engine):
    results = [batches.run(same_engine, target_only(same_engine.profile), 2, PROMPTS, warmup=0)]
    doc = batches.document(results, same_engine, 0.0, 0.0, len(PROMPTS), MAX_TOKENS, bandwidth=None)
    target, draft = steps(same_engine)
    assert doc["proposer"] == "draft" and doc["pair"]["head"] is None
    assert doc["floor"] == {"copy_bandwidth_bytes_per_s": None,
                            "streamed_bytes": {"target": target.weights, "draft": draft.weights},
                            "first_call_bytes": {"target": 0, "draft": 0},
                            "cache_bytes_per_position": {"target": target.per_position, "draft": draft.per_position}}
    config = same_engine.pair.target.config
    assert target.per_position == (config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
                                   * same_engine.pair.target.dtype.itemsize)


@pytest.mark.parametrize("pipeline", [pytest.param("off", marks=CUDA), pytest.param("on", marks=CUDA)])
def test_on_the_gpu_the_floor_has_its_ms(same_pair, pipeline):
    """The CUDA backend (captured rounds, events around each replay): the same hand count of the
    positions as on the CPU with one round in flight, and the floor's ms from the measured
    bandwidth. Two in flight: rows that ended run one round on, so only the bounds are known."""
    import torch

    engine = Engine(make_profile(*same_pair, k=K, max_tokens=MAX_TOKENS, backend="cuda",
                                 speculation=dict(pipeline=pipeline)))
    bandwidth = floors.copy_bandwidth(torch.device("cuda"))
    assert bandwidth is not None
    result = batches.run(engine, engine.profile, 3, PROMPTS, warmup=1, bandwidth=bandwidth)
    target, draft = steps(engine)
    if pipeline == "off":
        assert result["rounds"] == 3 and result["rows_per_round"] == 3
        target_positions = sum(len(p) - 1 + g for p in PROMPTS for g in (0, 3, 6))
        draft_positions = sum(len(p) - 2 + g for p in PROMPTS for g in (0, 3, 6))
        expected = floors.batch_bytes(target, draft, K, 3, 9, target_positions, draft_positions)
        assert result["round_floor_bytes"] == {name: v / 3 for name, v in expected.items()}
    else:
        assert result["rounds"] >= 3
    assert 0 < result["round_floor_ms"] < result["round_ms"]  # a floor: the round cannot beat it
    assert result["round_over_floor"] == pytest.approx(result["round_ms"] / result["round_floor_ms"])
    alone = batches.run(engine, engine.profile, 1, PROMPTS, warmup=1, bandwidth=bandwidth)
    assert alone["decoder"] == "single" and alone["rounds"] == 9 and alone["tokens"] == 3 * MAX_TOKENS
    assert 0 < alone["round_floor_ms"] < alone["round_ms"]


@pytest.fixture(scope="module")
def eagle_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-floors-eagle")
    target, _ = build_pair(root, noisy=0.1)
    head = head_for(target, root / "head", draft_vocab=150)
    return Engine(make_profile(target, None, k=3, max_tokens=9, proposer=ProposerSpec(kind="eagle", head=str(head)),
                               speculation=dict(pipeline="on")))


def test_a_heads_bytes_are_a_hand_count_of_the_tiny_head(eagle_engine):
    """The head's weights: fc (3 target widths to H) once a round, and each call its layer (q, k, v
    over [embedding | feature], 2H wide; o; the gated MLP), its three norms and the final one, and
    lm_head over the draft vocabulary; the target's embedding it gathers from is not the head's.
    Its cache: one layer's keys and values, kv heads x head dim each, in fc's dtype."""
    head = eagle_engine.heads["eagle"].head
    c, e = head.config, head.fc.weight.element_size()
    hidden, kv, q = c.hidden_size, c.num_key_value_heads * c.head_dim, c.num_attention_heads * c.head_dim
    layer = 2 * hidden * (q + 2 * kv) + q * hidden + 3 * hidden * c.intermediate_size + 3 * hidden
    call = (layer + hidden + hidden * c.draft_vocab_size) * e
    fc = 3 * c.target_hidden_size * hidden * e
    assert c.draft_vocab_size == 150 != c.target_vocab_size  # a reduced vocabulary: lm_head is the head's own
    assert floors.head_step_bytes(head) == floors.StepBytes(call, 2 * kv * e, first=fc)
    target, drafter = batches.step_bytes(eagle_engine, "eagle")
    assert drafter == floors.head_step_bytes(head) and target == batches.model_bytes(eagle_engine.pair.target)


def test_a_heads_calls_read_by_hand():
    """k = 3, one row at P = 10 that emitted e = 2: call 0 reads the 8 positions before P - e,
    calls 1 and 2 step at 10 and 11, reading 10 and 11: 29 positions; fc once, the rest 3 times."""
    head = floors.StepBytes(weights=100, per_position=7, first=40)
    assert floors.head_batch_bytes(head, 3, 1, 1, 10, 8) == 3 * 100 + 40 + 7 * (8 + 10 + 11)
    # two rounds of two rows: the sums over them, k = 4 (calls 1..3 at P, P + 1, P + 2)
    assert floors.head_batch_bytes(head, 4, 2, 4, 50, 30) == 8 * 100 + 2 * 40 + 7 * (30 + 3 * 50 + 4 * 3)
    assert floors.head_batch_bytes(floors.StepBytes(100, None, 40), 3, 1, 1, 10, 8) is None


def test_a_head_batchs_floor_is_what_each_launch_reads(eagle_engine, monkeypatch):
    """Pipelined, rows refilled: the device's sums (the head's origins P - e included) are what the
    host sees before each launch, and the floor's parts are the target's and the head's from them."""
    meters = []

    def watched(program, rnd):
        meters.append(Watched(program, rnd))
        return meters[-1]

    monkeypatch.setattr(batches, "RoundMeter", watched)
    prompts = PROMPTS + [[21, 22], [23, 24, 25, 26], [27]]
    result = batches.run(eagle_engine, eagle_engine.profile, 2, prompts, warmup=1, bandwidth=5e8)
    meter = meters[0]
    assert list(meter.totals()) == meter.seen and meter.seen[0] > 0
    assert meter.seen[2] == meter.seen[1] and meter.seen[3] < meter.seen[1]  # no draft model; origins below P
    assert result["proposer"] == "eagle" and result["k"] == 3 and result["rounds"] == meter.rounds
    target, head = batches.step_bytes(eagle_engine, "eagle")
    rows, positions, _, origins = meter.seen
    expected = {"target": meter.rounds * target.weights + target.per_position * positions,
                "draft": floors.head_batch_bytes(head, 3, meter.rounds, rows, positions, origins)}
    assert result["round_floor_bytes"] == {name: v / meter.rounds for name, v in expected.items()}
    assert result["round_floor_ms"] == pytest.approx(sum(expected.values()) / meter.rounds / 5e8 * 1e3)
    doc = batches.document([result], eagle_engine, 0.0, 0.0, len(prompts), 9, proposer="eagle")
    assert doc["proposer"] == "eagle" and doc["pair"]["head"] == eagle_engine.profile.proposer.head
    assert doc["floor"]["streamed_bytes"]["draft"] == floors.streamed_bytes(eagle_engine.heads["eagle"].head)
    assert doc["floor"]["first_call_bytes"]["draft"] == head.first
    assert doc["floor"]["cache_bytes_per_position"]["draft"] == head.per_position


@pytest.mark.parametrize("backend", [pytest.param("cuda", marks=CUDA)])
def test_on_the_gpu_a_heads_round_is_above_its_floor(tmp_path, backend):
    """The CUDA backend (captured rounds, the head's calls in them): the head batch's floor from the
    measured bandwidth, which its rounds cannot beat."""
    import torch

    target, _ = build_pair(tmp_path, noisy=0.1)
    head = head_for(target, tmp_path / "head", draft_vocab=150)
    engine = Engine(make_profile(target, None, k=3, max_tokens=9, backend=backend,
                                 proposer=ProposerSpec(kind="eagle", head=str(head))))
    bandwidth = floors.copy_bandwidth(torch.device("cuda"))
    assert bandwidth is not None
    result = batches.run(engine, engine.profile, 3, PROMPTS, warmup=1, bandwidth=bandwidth)
    assert result["proposer"] == "eagle" and result["rounds"] > 0
    assert result["round_floor_bytes"]["draft"] > 0
    assert 0 < result["round_floor_ms"] < result["round_ms"]
