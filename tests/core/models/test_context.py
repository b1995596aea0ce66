"""Context-limit messages: each hint names a value that makes this prompt fit."""

from __future__ import annotations

import pytest

from specgen.core.models.context import context_error, keep_end


def fits(prompt_len: int, max_tokens: int, k: int, limit: int) -> bool:
    return context_error(prompt_len, max_tokens, k, limit, can_truncate=True) is None


def test_what_fits_is_no_error():
    assert context_error(100, 100, 4, None, can_truncate=True) is None
    assert fits(507, 1, 3, 512) and not fits(508, 1, 3, 512)  # prompt + max_tokens + k + 1 <= limit


def test_k_alone_too_large_names_k_not_a_negative_max_tokens():
    error = context_error(5, 8, 32, 16, can_truncate=True)
    assert error.message.startswith("k=32 does not fit the model's 16-token context")
    assert error.hint == "lower --k to at most 13"
    assert "max-tokens" not in error.hint and "-" not in error.hint.replace("--k", "")
    assert fits(1, 1, 13, 16)


def test_the_max_tokens_hint_counts_the_prompt():
    error = context_error(100, 600, 4, 512, can_truncate=True)
    assert error.message == ("max_tokens=600 leaves no room for a prompt in the model's 512-token context "
                             "(k=4 needs 5 more)")
    assert error.hint == "lower --max-tokens to at most 407 for this 100-token prompt"
    assert fits(100, 407, 4, 512) and not fits(100, 408, 4, 512)


def test_a_prompt_too_long_for_any_max_tokens():
    error = context_error(600, 600, 4, 512, can_truncate=False)
    assert error.hint == "lower --max-tokens to at most 506, and shorten the prompt"
    truncating = context_error(600, 600, 4, 512, can_truncate=True)
    assert truncating.hint.endswith("shorten the prompt or pass --truncate-prompt (keeps the prompt's end)")


@pytest.mark.parametrize("can_truncate", [True, False])
def test_a_long_prompt_suggests_truncation_only_where_the_command_offers_it(can_truncate):
    error = context_error(1700, 8, 4, 512, can_truncate)
    assert error.message == ("the prompt has 1700 tokens but only 499 fit with max_tokens=8 "
                             "in the model's 512-token context")
    assert error.hint == ("shorten the prompt to 499 tokens or pass --truncate-prompt (keeps the prompt's end)"
                          if can_truncate else "shorten the prompt to 499 tokens")
    assert fits(499, 8, 4, 512)


def test_a_prompt_that_fits_only_with_fewer_new_tokens_says_how_many():
    error = context_error(400, 200, 4, 512, can_truncate=False)
    assert error.hint == "shorten the prompt to 307 tokens or lower --max-tokens to at most 107"
    assert fits(400, 107, 4, 512) and fits(307, 200, 4, 512)


def test_keep_end_keeps_what_fits():
    ids = list(range(1000))
    kept = keep_end(ids, 8, 4, 512)
    assert kept == ids[-499:] and fits(len(kept), 8, 4, 512)
    assert keep_end(ids, 600, 4, 512) == [999]  # nothing fits: the last token, and the check says why
    assert keep_end(ids, 8, 4, None) == ids
