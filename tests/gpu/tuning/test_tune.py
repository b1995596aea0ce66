"""gpu/tuning/linear_table.py and gpu/tuning/tune.py: the linear kernel's configurations as data, and their tuning.

Tuning runs the candidates in the Triton interpreter on tiny shapes with a fake timer passed in
(never real timing in a test): each candidate is checked against the torch reference, then the
cheapest by the timer wins, separately without and with split-K.
"""

from __future__ import annotations

from triton_cpu import DEVICE  # noqa: I001  (first: sets TRITON_INTERPRET without CUDA)

import dataclasses
import json

import pytest
import torch
import triton

from specgen.core.errors import UsageError
from specgen.core.settings import KernelSpec
from specgen.gpu.tuning import linear_table as T
from specgen.gpu.tuning import tune
from specgen.gpu.policy import resolve


def _fake_timer(costs: dict):
    """Seconds by configuration (others cost 1 s), summed over the row counts; records the calls."""
    seen = []

    def timer(run, calls, config):
        seen.append(config)
        return costs.get(config, 1.0)

    return timer, seen


def test_tune_picks_the_cheapest_correct_candidate(monkeypatch):
    """Two shapes, two row counts: the plain winner is the cheapest configuration without split-K,
    the split winner the cheapest of all; a candidate whose output disagrees with the reference is
    dropped before it is timed."""
    gemv, dot, split = (False, 4, 64, 4, 1), (True, 16, 32, 4, 1), (True, 16, 32, 4, 1, 2)
    wrong = (True, 32, 32, 4, 1)
    monkeypatch.setattr(tune, "candidates", lambda k, split_on: [gemv, dot, wrong] + ([split] if split_on else []))
    real = tune.linear.linear

    def broken(x, w, b=None, config=None, **kw):  # the `wrong` configuration computes garbage
        out = real(x, w, b, config, **kw)
        return out + 1.0 if config == wrong else out

    monkeypatch.setattr(tune.linear, "linear", broken)
    timer, seen = _fake_timer({gemv: 0.5, dot: 0.25, split: 0.125, wrong: 0.0})
    table, choices = tune.tune([(24, 40, False), (16, 40, True)], (1, 3), timer, device=DEVICE, dtype=torch.float32)
    linear_choice = next(c for c in choices if not c.shape[2])
    assert linear_choice.plain == dot and linear_choice.split == split
    assert linear_choice.seconds == {gemv: 1.0, dot: 0.5, split: 0.25}  # each cost at both row counts
    assert wrong not in seen[:8]  # checked, never timed, for the plain linear shape
    gated = next(c for c in choices if c.shape[2])
    assert wrong in gated.seconds  # gate_up does not go through the broken linear
    assert table.pick(24, 40, False, False) == dot and table.pick(24, 40, False, True) == split


def test_tune_picks_the_fastest_at_one_row_for_drafts(monkeypatch):
    """A matrix-vector configuration that is fastest at one row but slow at three loses `plain` and
    `split` (summed over both row counts) and wins `draft`; the table writes and reads it, and only
    for_drafts() picks it. A split-K draft pick is not a `plain` one (devices without split-K)."""
    gemv, dot, split = (False, 4, 64, 4, 1), (True, 16, 32, 4, 1), (True, 16, 32, 4, 1, 2)
    monkeypatch.setattr(tune, "candidates", lambda k, split_on: [gemv, dot] + ([split] if split_on else []))
    costs = {(gemv, 1): 0.1, (gemv, 3): 1.0, (dot, 1): 0.3, (dot, 3): 0.3, (split, 1): 0.2, (split, 3): 0.5}

    def timer(run, calls, config):
        return costs[config, run(0).shape[0]]

    table, choices = tune.tune([(24, 40, False)], (1, 3), timer, device=DEVICE, dtype=torch.float32)
    (choice,) = choices
    assert (choice.plain, choice.split, choice.draft) == (dot, dot, gemv)
    assert choice.one_row == {gemv: 0.1, dot: 0.3, split: 0.2}
    read = T.LinearTable(*_round_trip(table))
    for t in (table, read):
        assert t.pick(24, 40, False, False) == dot and t.pick(24, 40, False, True) == dot
        drafts = t.for_drafts()
        assert drafts.pick(24, 40, False, False) == gemv and drafts.pick(24, 40, False, True) == gemv
        assert drafts.source.endswith("draft picks")
        assert drafts.pick(24, 40, False, False, rows=2) == dot == drafts.pick(24, 40, False, True, rows=64)
    assert drafts.pick(2048, 8192, False, True) == T.draft_rule(2048, 8192, False)  # unlisted: the draft rule
    assert T.draft_rule(2048, 8192, False)[0] is False and T.draft_rule(100, 60, True)[1] <= 16
    split_draft = T.LinearTable(table.entries, "tuned", (((24, 40, False), split),)).for_drafts()
    assert split_draft.pick(24, 40, False, False) == dot and split_draft.pick(24, 40, False, True) == split
    _, untuned = tune.tune([(24, 40, False)], (3,), timer, device=DEVICE, dtype=torch.float32)
    assert untuned[0].draft is None  # no one-row timing, no draft pick


def _round_trip(table):
    data = json.loads(table.to_json())
    assert data["shapes"][0]["draft"] == list(table.drafts[0][1])
    return tuple((((s["n"], s["k"], s["gated"]), tuple(s["plain"]), tuple(s["split"])) for s in data["shapes"])), \
        "read", tuple((((s["n"], s["k"], s["gated"]), tuple(s["draft"])) for s in data["shapes"] if "draft" in s))


def test_package_draft_picks_reach_draft_runners_only():
    """The package's table holds draft picks for the real pairs' drafts; for_drafts() takes them
    for one-row calls and leaves calls of more rows, and the shapes without one, as they were."""
    package = T.packaged()
    assert package.drafts, "the package's table has no draft picks"
    drafts = package.for_drafts()
    for shape, config in package.drafts:
        assert drafts.pick(*shape, True) == config
    listed = {shape for shape, _ in package.drafts}
    for shape, plain, split in package.entries:
        assert drafts.pick(*shape, False, rows=2) == plain and drafts.pick(*shape, True, rows=2) == split
        if shape not in listed:
            assert drafts.pick(*shape, False) == plain and drafts.pick(*shape, True) == split


def test_a_drafts_batch_calls_take_tensor_core_tiles():
    """A draft's calls of DRAFT_TILE_ROWS rows or more (a batch's steps) take tensor-core tiles
    where the package picks a matrix-vector configuration (the rule's), and its tensor-core picks
    as they are; a target's table is the same at every row count."""
    package = T.packaged()
    drafts = package.for_drafts()
    gemv = [(shape, plain) for shape, plain, _ in package.entries if not plain[0]]
    assert gemv, "the package's table has no matrix-vector plain picks"
    for shape, plain in gemv:
        assert drafts.pick(*shape, False, rows=T.DRAFT_TILE_ROWS - 1) == plain
        assert drafts.pick(*shape, False, rows=T.DRAFT_TILE_ROWS) == T.rule(*shape, False)
        assert drafts.pick(*shape, False, rows=T.DRAFT_TILE_ROWS)[0]
        assert package.pick(*shape, False, rows=64) == plain
    for shape, plain, split in package.entries:
        if plain[0]:
            assert drafts.pick(*shape, False, rows=32) == plain


def test_model_shapes_follow_the_config():
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                         num_key_value_heads=2)
    assert T.model_shapes(config) == [(896 + 2 * 128, 896, False), (896, 896, False), (4864, 896, True),
                                         (896, 4864, False), (151936, 896, False)]


def test_candidates_hold_no_split_k_without_it():
    assert all(len(c) == 5 for c in tune.candidates(4096, split=False))
    assert any(len(c) == 6 for c in tune.candidates(4096, split=True))
    assert all(c[2] <= 128 for c in tune.candidates(100, split=False) if not c[0])  # register path: K's tile


def test_tuned_table_round_trips_and_wins_over_the_package(tmp_path):
    tuned = T.LinearTable((((6144, 4096, False), (False, 2, 2048, 4, 1), (True, 32, 128, 4, 3, 2)),), "tuned")
    (tmp_path / T.FILE).write_text(tuned.to_json(tuned_on="test"))
    table = T.for_run(str(tmp_path))
    assert table.pick(6144, 4096, False, False) == (False, 2, 2048, 4, 1)
    assert table.pick(6144, 4096, False, True) == (True, 32, 128, 4, 3, 2)
    assert table.pick(4096, 14336, False, True) == T.SPLIT_LONG_K  # the package's, for the rest
    assert table.pick(100, 60, False, False) == T.NARROW  # the rules, for shapes no table lists
    assert T.for_run(str(tmp_path / "none")) is T.packaged()
    resolved = resolve(KernelSpec(linear="kernel", tables=str(tmp_path)), "cpu", _tiny())
    assert resolved.linear_table == table and resolved.as_dict()["linear_table"].startswith(str(tmp_path))


LAUNCH = {"config": [True, 32, 128, 4, 4, 3], "rows": 128, "launch": [64, 64, 64, 4, 4]}
SPLIT_Q = (True, 32, 128, 4, 4, 3)  # Llama-3-8B q/o's split-K pick: K 4096 in chunks of 1408


def test_launches_round_trip_and_apply_by_row_class_and_configuration(tmp_path):
    """A launch applies to calls of its configuration and row class only (33-64, 65-128, 129-512
    rows); another table's launches stay under it where it lists none for the same key."""
    launch = ((4096, 4096, False), SPLIT_Q, 128, (64, 64, 64, 4, 4))
    mine = T.LinearTable((((4096, 4096, False), (True, 32, 256, 4, 4), SPLIT_Q),), "tuned", launches=(launch,))
    (tmp_path / T.FILE).write_text(mine.to_json())
    loaded = T.load(tmp_path / T.FILE)
    assert loaded.launches == (launch,) and loaded.entries == mine.entries
    assert [loaded.launch(4096, 4096, False, SPLIT_Q, rows) for rows in (5, 32, 33, 64, 65, 80, 128, 129)] == \
        [None, None, None, None, launch[3], launch[3], launch[3], None]
    assert loaded.launch(4096, 4096, False, (True, 32, 256, 4, 4), 80) is None  # another configuration's call
    assert loaded.launch(4096, 4096, True, SPLIT_Q, 80) is None  # another shape
    base = T.LinearTable(launches=(((4096, 4096, False), SPLIT_Q, 128, (128, 32, 128, 8, 2)),
                                   ((4096, 4096, False), SPLIT_Q, 512, (64, 128, 64, 8, 4))))
    both = loaded.over(base)
    assert both.launch(4096, 4096, False, SPLIT_Q, 100) == (64, 64, 64, 4, 4)  # the tuned table's wins
    assert both.launch(4096, 4096, False, SPLIT_Q, 300) == (64, 128, 64, 8, 4)  # base's where it lists none
    assert loaded.for_drafts().launches == loaded.launches


def test_chunk_width_keeps_the_configurations_boundaries():
    """K 4096 in 3 chunks of whole 128-column tiles: 1408 columns; BLOCK_K 64 tiles them (the same
    sums), 256 does not (1536-column chunks, measured unequal on an H200)."""
    assert T.chunk_width(4096, SPLIT_Q) == 1408 and T.chunk_width(4096, (True, 64, 256, 4, 4)) == 4096
    assert T.keeps_sums(4096, SPLIT_Q, (64, 64, 64, 4, 4))
    assert not T.keeps_sums(4096, SPLIT_Q, (64, 32, 256, 4, 4))
    assert not T.keeps_sums(4100, (True, 64, 256, 4, 4), (64, 64, 128, 4, 4))  # a masked tail that would move
    assert not T.keeps_sums(4096, (False, 2, 2048, 4, 1), (64, 64, 64, 4, 4))  # matrix-vector: rows one by one


def test_package_launches_keep_sums_of_picks_their_shapes_take():
    table = T.packaged()
    assert table.launches, "the package's table lists no launches"
    for (n, k, gated), config, row_class, launch in table.launches:
        assert T.keeps_sums(k, config, launch) and row_class in T.ROW_CLASSES
        assert config == table.pick(n, k, gated, True), ((n, k, gated), config)  # reachable: CUDA's split-K pick


def _table_with(**launch) -> str:
    return json.dumps({"format": 1, "shapes": [{"n": 4096, "k": 4096, "gated": False, "plain": list(SPLIT_Q[:5]),
                                                "split": list(SPLIT_Q), "launches": [{**LAUNCH, **launch}]}]})


@pytest.mark.parametrize("content,expected", [
    (_table_with(launch=[64, 32, 256, 4, 4]), "does not keep the sums"),
    (_table_with(rows=96), "a row class is one of 64, 128, 512"),
    (_table_with(launch=[48, 32, 128, 4, 4]), "tile rows one of"),
    (_table_with(launch=[64, 32, 128, 4]), "a launch is [tile rows"),
    ("not json", "Expecting value"),
    (json.dumps({"format": 2, "shapes": []}), "not a linear-kernel table of format 1"),
    (json.dumps({"format": 1, "shapes": [{"n": 1, "k": 2, "gated": False, "plain": [True, 16, 32, 4, 2, 2],
                                          "split": [True, 16, 32, 4, 2]}]}), "shapes[0]"),
    (json.dumps({"format": 1, "shapes": [{"n": 1, "k": 2, "gated": False, "plain": [True, 24, 32, 4, 2],
                                          "split": [True, 16, 32, 4, 2]}]}), "powers of 2"),
    (json.dumps({"format": 1, "shapes": [{"n": 1, "k": 2, "gated": False, "plain": [True, 16, 32, 4, 2],
                                          "split": [True, 16, 32, 4, 2], "draft": [False, 4, 64, 4, 1, 2]}]}),
     "matrix-vector"),
])
def test_a_broken_tuned_table_is_a_usage_error_naming_the_file(tmp_path, content, expected):
    (tmp_path / T.FILE).write_text(content)
    with pytest.raises(UsageError) as info:
        resolve(KernelSpec(linear="kernel", tables=str(tmp_path)), "cpu", _tiny())
    assert str(tmp_path / T.FILE) in info.value.message and expected in info.value.message
    assert "tune-kernels" in info.value.hint


def _tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def test_head_shapes_are_the_calls_rewire_head_makes():
    from tiny_models import tiny_head_config

    config = tiny_head_config()  # width 32, 4 heads of 8 over 2 KV heads, target 48 wide, 24 draft ids
    assert T.head_shapes(config) == [(32, 3 * 48, False), (4 * 8 + 2 * 2 * 8, 2 * 32, False), (32, 32, False),
                                        (64, 32, True), (32, 64, False), (24, 32, False)]


@pytest.mark.parametrize("kind", ["eagle", "draft"])
def test_tune_kernels_times_the_head_when_the_proposer_drafts_with_it(kind, tmp_path, monkeypatch):
    """The profile's target shapes, plus the head's (`[proposer] head`) with the eagle proposer,
    or the draft model's with the draft proposer; the table goes to `[kernels] tables`."""
    from transformers import LlamaConfig

    from specgen.cli import tune as cli_tune
    from specgen.core.drafters.head_formats import save_speculators
    from specgen.core.profile import load_profile
    from tiny_models import build_head, tiny_head_config, write_profile

    for name, width in (("target", 48), ("draft", 24)):
        LlamaConfig(vocab_size=40, hidden_size=width, intermediate_size=2 * width, num_attention_heads=4,
                    num_key_value_heads=2, num_hidden_layers=4).save_pretrained(tmp_path / name)
    save_speculators(build_head(), tmp_path / "head", "tiny")
    profile = write_profile(tmp_path / "pair.toml", tmp_path / "target", tmp_path / "draft",
                            proposer={"kind": kind, "head": str(tmp_path / "head")},
                            kernels={"tables": str(tmp_path / "tables")})
    timed = []

    def fake_tune(shapes, rows, timer, **_):
        timed.extend(shapes)
        return T.LinearTable(), []

    monkeypatch.setattr(tune, "tune", fake_tune)
    path, lines = cli_tune.run(load_profile(str(profile)), (1, 5), DEVICE)
    target = T.model_shapes(LlamaConfig.from_pretrained(tmp_path / "target"))
    other = (T.head_shapes(tiny_head_config()) if kind == "eagle"
             else T.model_shapes(LlamaConfig.from_pretrained(tmp_path / "draft")))
    assert timed == target + other and lines == []
    assert path == str(tmp_path / "tables" / T.FILE)
    T.load(tmp_path / "tables" / T.FILE)  # written, and readable as a table (else a UsageError)


# -- launches for tall calls (tune_launches; fake timers, the Triton interpreter) ----------------------

DOT = (True, 16, 32, 4, 2)
FAST, SLIGHT, SLOW = (64, 32, 32, 4, 3), (128, 16, 32, 8, 2), (64, 64, 32, 4, 2)


def _launch_timer(ratios: dict):
    """Seconds a call: 1 for the pick's own tile, ratios[launch] for a launch (1.0 if unlisted)."""
    seen = []

    def timer(run, calls, label):
        config, launch = label
        run(0)
        seen.append(label)
        return 1.0 if launch is None else ratios.get(launch, 1.0)

    return timer, seen


def test_tune_launches_keeps_the_fastest_launch_that_gains_enough():
    """Per row class, the fastest candidate (every one keeps the rows' bits here) is kept where it
    takes 3% or more off the pick's own tile: FAST at 33-64 rows; at 65-128 rows the best, SLIGHT,
    gains 1% and is reported, not kept. Each candidate and the pick are timed at both row counts."""
    shape = (24, 64, True)
    table = T.LinearTable(((shape, DOT, DOT),))
    ratios = {FAST: 0.8, SLIGHT: 0.99, SLOW: 1.2}
    timer, seen = _launch_timer(ratios)
    tuned, choices = tune.tune_launches(table, [shape], timer, device=DEVICE, classes=(64, 128),
                                        candidates_of=lambda k, config, row_class: [SLOW, SLIGHT] if row_class > 64
                                        else [SLOW, FAST])
    assert [(c.row_class, c.launch, c.kept) for c in choices] == [(64, FAST, True), (128, SLIGHT, False)]
    assert tuned.launches == ((shape, DOT, 64, FAST),) and tuned.entries == table.entries
    assert tuned.launch(*shape, DOT, 40) == FAST and tuned.launch(*shape, DOT, 80) is None
    assert len(seen) == 2 * (1 + 2) * 2 and all(c.unequal == 0 for c in choices)
    assert tune.launch_line(choices[0]).endswith("1000000.0/1000000.0 us in its own tile, launch [64, 32, 32, 4, 3] "
                                                 "800000.0/800000.0 us")
    assert "not kept" in tune.launch_line(choices[1])


def test_tune_launches_passes_over_matrix_vector_picks_and_float32():
    gemv = (False, 2, 64, 4, 1)
    timer, seen = _launch_timer({})
    tuned, choices = tune.tune_launches(T.LinearTable((((24, 64, False), gemv, gemv),)), [(24, 64, False)], timer,
                                        device=DEVICE)
    assert choices == [] and seen == [] and tuned.launches == ()
    tuned, choices = tune.tune_launches(T.LinearTable((((24, 64, False), DOT, DOT),)), [(24, 64, False)], timer,
                                        device=DEVICE, dtype=torch.float32)
    assert choices == [] and seen == []


def test_launch_candidates_keep_the_sums_and_classes_follow_the_runs():
    split = (True, 32, 128, 4, 4, 3)
    assert all(T.keeps_sums(4096, split, c) for c in tune.launch_candidates(4096, split, 128))
    assert not any(c[2] == 256 for c in tune.launch_candidates(4096, split, 64))  # 1408-column chunks
    assert any(c[0] == 128 for c in tune.launch_candidates(4096, split, 128))
    assert not any(c[0] == 128 for c in tune.launch_candidates(4096, split, 64))
    assert tune.launch_classes((1, 5), batch=False) == (64,)  # a prompt's prefill chunks
    assert tune.launch_classes((1, 5, 33), batch=False) == (64,)
    assert tune.launch_classes((1, 7, 80), batch=False) == (64, 128)
    assert tune.launch_classes((1, 5), batch=True) == T.ROW_CLASSES  # group prefill: up to 512 rows


# -- a draft's picks chosen inside its step (tune_in_step; fake step timers, never real timing) ----

A, B = (24, 40, False), (48, 24, True)
X, Y, Z = (False, 2, 64, 4, 1), (False, 4, 64, 4, 1), (False, 8, 64, 4, 1)
START = {A: (False, 1, 64, 4, 1), B: (False, 1, 32, 4, 1)}


def _step_timer(cost):
    """A StepTimer from cost(picks, call number) in seconds; records the picks of every call."""
    calls = []

    def timer(picks):
        calls.append(dict(picks))
        return cost(picks, len(calls))

    return timer, calls


def test_in_step_descent_takes_clear_gains_and_leaves_noise():
    """A: X takes 1% off the step (taken), Y 0.1% (under the margin: left); B: nothing gains. Every
    candidate's timing is followed by one of the current picks, and B is tried with A's new pick."""
    gains = {(A, X): 0.01, (A, Y): 0.001}

    def cost(picks, _):
        return 1.0 - sum(gains.get((shape, config), 0.0) for shape, config in picks.items())

    timer, calls = _step_timer(cost)
    found = tune.tune_in_step([A, B], START, timer, candidates_of=lambda *shape: [X, Y, Z])
    assert found.picks == {A: X, B: START[B]}
    assert found.before == 1.0 and found.after == pytest.approx(0.99)
    once = [(shape, config) for shape, config, _, _ in found.trials]
    assert once[:3] == [(A, X), (A, Y), (A, Z)]
    for i in range(0, 6, 2):  # the first six calls: A's candidates, each beside the start
        assert calls[i + 1] == START and calls[i] != START
    b_calls = [c for c in calls if c[B] != START[B]]
    assert b_calls and all(c[A] == X for c in b_calls)


def test_in_step_descent_rejects_a_win_that_does_not_repeat():
    """Z beats the current picks in its one timing only (a slow replay of the current picks):
    the confirmation, alternating three times, keeps the current pick."""
    def cost(picks, n):
        return 1.05 if n == 6 else 1.0  # call 6: the current picks' timing beside Z (A's third candidate)

    timer, _ = _step_timer(cost)
    found = tune.tune_in_step([A], {A: START[A]}, timer, candidates_of=lambda *shape: [X, Y, Z])
    assert found.picks == {A: START[A]}
    shortlisted = [t for t in found.trials if t[1] == Z]
    assert len(shortlisted) == 2 and shortlisted[1][2] == shortlisted[1][3] == 1.0


def test_in_step_descent_passes_over_a_candidate_that_fails():
    """A candidate whose step raises (a configuration the GPU cannot compile) is skipped; the next
    one is still tried and taken."""
    def cost(picks, _):
        if picks[A] == X:
            raise RuntimeError("out of resources")
        return 0.9 if picks[A] == Y else 1.0

    timer, _ = _step_timer(cost)
    found = tune.tune_in_step([A], {A: START[A]}, timer, candidates_of=lambda *shape: [X, Y])
    assert found.picks == {A: Y} and [t[1] for t in found.trials][0] == Y


def test_step_candidates_are_matrix_vector_and_bounded():
    for n, k, gated in ((3072, 2048, False), (8192, 2048, True), (896, 4864, False), (1152, 896, False)):
        found = tune.step_candidates(n, k, gated)
        assert found and all(c[0] is False and c[4] == 1 and c[3] in (4, 8) for c in found)
        assert all(c[1] * c[2] <= (4096 if gated else 8192) for c in found)
        assert max(c[2] for c in found) <= triton.next_power_of_2(k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_draft_step_timer_times_a_captured_step_with_the_picks():
    """On a GPU: a tiny Llama's captured one-token step is timed with each pick set, and the
    descent returns a pick for every shape."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gpu_helpers import owned
    from specgen.gpu.workspace import Workspace

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = owned(LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval())  # as the loader gives it
    kernels = resolve(KernelSpec(), torch.device("cuda"), model)
    kernels = dataclasses.replace(kernels, linear_table=kernels.linear_table.for_drafts())
    shapes = T.model_shapes(config)
    start = {shape: kernels.linear_table.pick(*shape, kernels.split_k, 1) for shape in shapes}
    timer = tune.draft_step_timer(model, 256, kernels, Workspace("cuda"), capacity=128, position=64, steps=2,
                                  repeats=1)
    assert timer(start) > 0
    found = tune.tune_in_step(shapes[:1], start, timer, confirm=1)
    assert set(found.picks) == set(shapes) and found.after > 0


def test_tune_kernels_chooses_the_drafts_picks_inside_its_step(tmp_path, monkeypatch):
    """With a draft model and in_step, the table written holds the draft's one-row picks the step
    timer chose (here: two columns a program for q/k/v, 1% faster), the others left as tuned, and
    the report says what changed and the step's time before and after. Without in_step, or with
    the draft on the CPU, the draft's picks stay as the per-shape tuning left them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specgen.cli import tune as cli_tune
    from specgen.core.profile import load_profile
    from tiny_models import write_profile

    for name, width in (("target", 48), ("draft", 24)):
        config = LlamaConfig(vocab_size=40, hidden_size=width, intermediate_size=2 * width, num_attention_heads=4,
                             num_key_value_heads=2, num_hidden_layers=2)
        LlamaForCausalLM(config).save_pretrained(tmp_path / name)
    profile = load_profile(str(write_profile(tmp_path / "pair.toml", tmp_path / "target", tmp_path / "draft",
                                             kernels={"tables": str(tmp_path / "tables")})))
    shapes = T.model_shapes(LlamaConfig.from_pretrained(tmp_path / "draft"))
    gemv, dot, better = (False, 1, 32, 4, 1), (True, 16, 32, 4, 4), (False, 2, 32, 4, 1)

    def fake_tune(listed, rows, timer, **_):
        entries = tuple(sorted((shape, dot, dot) for shape in dict.fromkeys(listed)))
        return T.LinearTable(entries, "tuned", tuple(sorted((shape, gemv) for shape in dict.fromkeys(listed)))), []

    monkeypatch.setattr(tune, "tune", fake_tune)
    seen = []

    def step_timer(picks):
        seen.append(picks)
        return 0.99 if picks[shapes[0]] == better else 1.0

    heard = []
    path, lines = cli_tune.run(profile, (1, 5), DEVICE, in_step=True, step_timer=step_timer, progress=heard.append)
    assert heard[0].startswith("draft step: choosing") and heard[1:] == lines[:-1]  # the change, as it happens
    drafts = dict(T.load(path).drafts)
    assert drafts[shapes[0]] == better and all(drafts[shape] == gemv for shape in shapes[1:])
    assert set(seen[0]) == set(shapes)
    assert any("-> [False, 2, 32, 4, 1]" in line for line in lines) and "1000.0000 ms" in lines[-1]
    path, lines = cli_tune.run(profile, (1, 5), DEVICE, step_timer=step_timer)
    assert dict(T.load(path).drafts)[shapes[0]] == gemv and lines == []
    path, lines = cli_tune.run(profile, (1, 5), DEVICE, in_step=True)  # no timer, and the draft on the CPU
    assert dict(T.load(path).drafts)[shapes[0]] == gemv
    assert lines == ["draft on cpu: its picks are chosen inside its step only on a CUDA GPU"]


def test_tune_kernels_writes_the_targets_launches(tmp_path, monkeypatch):
    """With launches, the table written holds each target shape's launch for the row classes its
    runs use (one prompt at a time: 64, the prefill chunks), and stdout a line per shape and class;
    on a CPU with no timer given it says launches are tuned on a CUDA GPU only."""
    from transformers import LlamaConfig

    from specgen.cli import tune as cli_tune
    from specgen.core.profile import load_profile
    from tiny_models import write_profile

    for name, width in (("target", 64), ("draft", 24)):
        LlamaConfig(vocab_size=40, hidden_size=width, intermediate_size=2 * width, num_attention_heads=4,
                    num_key_value_heads=2, num_hidden_layers=1).save_pretrained(tmp_path / name)
    profile = load_profile(str(write_profile(tmp_path / "pair.toml", tmp_path / "target", tmp_path / "draft",
                                             kernels={"tables": str(tmp_path / "tables")})))
    targets = T.model_shapes(LlamaConfig.from_pretrained(tmp_path / "target"))

    def fake_tune(listed, rows, timer, **_):
        return T.LinearTable(tuple(sorted((shape, DOT, DOT) for shape in dict.fromkeys(listed))), "tuned"), []

    monkeypatch.setattr(tune, "tune", fake_tune)
    monkeypatch.setattr(tune, "launch_candidates", lambda k, config, row_class: [FAST])
    timer, seen = _launch_timer({FAST: 0.5})
    path, lines = cli_tune.run(profile, (1, 5), DEVICE, launches=True, launch_timer=timer)
    assert T.load(path).launches == tuple(sorted((shape, DOT, 64, FAST) for shape in targets))
    assert len(lines) == len(targets) and all(line.startswith("launch: N=") for line in lines)
    path, lines = cli_tune.run(profile, (1, 5), DEVICE, launches=True)
    assert lines == ["launches on cpu: tuned only on a CUDA GPU"]
