"""core/drafters/merge_rule.py: when a hybrid tree round merges the lookup's trie with the model's
tree, from the run's own rounds and the rounds' bytes."""

import math

import pytest

from specgen.core.drafters.merge_rule import PROBE, MergeRule, cost_ratio


def test_the_cost_ratio_is_the_bytes_of_a_merged_round_over_a_lookup_rounds():
    assert cost_ratio(200, 30, 5) == pytest.approx(350 / 230)
    assert cost_ratio(100, 0, 7) == 1.0


@pytest.mark.parametrize("choice,merge", [("always", True), ("never", False)])
def test_always_and_never_fix_the_choice(choice, merge):
    rule = MergeRule(choice, ratio=1.5)
    for emitted, source in [(5, "lookup"), (1, "model"), (1, "none")] * 3:
        assert rule.merge() is merge
        rule.update(merge, emitted, source)
    assert rule.merge() is merge


def test_auto_merges_first_then_weighs_tokens_against_the_ratio():
    rule = MergeRule("auto", ratio=1.5)
    assert rule.merge()  # nothing known
    rule.update(True, 5, "model")  # the model's nodes won: the trie alone would have given 1
    assert rule.merged == 5 and rule.alone == 1
    assert rule.merge()  # 5 >= 1.5 x 1
    rule = MergeRule("auto", ratio=1.5)
    rule.update(True, 4, "lookup")  # the lookup's nodes won: the trie alone gives as many
    assert not rule.merge()  # 4 < 1.5 x 4


def test_a_round_that_accepted_nothing_counts_one_token_for_both():
    rule = MergeRule("auto", ratio=1.2)
    rule.update(True, 1, "none")
    assert rule.merged == 1 and rule.alone == 1 and not rule.merge()


def test_lookup_rounds_feed_the_lookups_mean_and_probe_every_PROBE_rounds():
    rule = MergeRule("auto", ratio=2.0)
    rule.update(True, 3, "lookup")
    chosen = []
    for _ in range(3 * PROBE):
        merge = rule.merge()
        chosen.append(merge)
        rule.update(merge, 3, "lookup")
    # after the first merged round: PROBE - 1 lookup rounds, then a merged one, and so on
    assert chosen == ([False] * (PROBE - 1) + [True]) * 3
    assert rule.merged_rounds == 4 and rule.lookup_rounds == 3 * (PROBE - 1)


def test_the_means_follow_the_text_as_it_changes():
    """The model's nodes start winning: the lookup's mean falls round by round until merging pays."""
    rule = MergeRule("auto", ratio=1.5)
    rule.update(True, 4, "lookup")
    merges = []
    for _ in range(40):
        merge = rule.merge()
        merges.append(merge)
        rule.update(merge, 4 if merge else 1, "model" if merge else "none")
    assert not merges[0] and all(merges[-10:])


def test_a_run_starts_afresh():
    rule = MergeRule("auto", ratio=1.5)
    rule.update(True, 4, "lookup")
    rule.update(False, 4, None)
    rule.start()
    assert (rule.merged, rule.alone, rule.since, rule.merged_rounds, rule.lookup_rounds) == (None, None, 0, 0, 0)
    assert rule.merge()


@pytest.mark.parametrize("choice,ratio", [("sometimes", 1.5), ("auto", 0.0), ("auto", math.inf), ("auto", math.nan)])
def test_bad_settings_are_refused(choice, ratio):
    with pytest.raises(ValueError):
        MergeRule(choice, ratio=ratio)


def test_describe_names_the_ratio():
    assert "1.52x" in MergeRule("auto", ratio=350 / 230).describe()
    assert MergeRule("never").describe().startswith("never: no round")
