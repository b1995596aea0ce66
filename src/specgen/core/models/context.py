"""Does a prompt fit the target's context, and if not, what should the user change?

A run needs prompt + max_tokens + k + 1 positions: the last round may score k + 1 positions past
the output's end. The hints name the one value to change, with a number that works for this
prompt: a "lower --max-tokens below X" that ignores the prompt, or suggests a negative X when k
alone is too large, sends the user round in circles.
"""

from __future__ import annotations

from specgen.core.errors import UsageError


def context_error(prompt_len: int, max_tokens: int, k: int, limit: int | None,
                  can_truncate: bool) -> UsageError | None:
    """The error for a prompt of prompt_len tokens that does not fit, else None.
    can_truncate: whether the command offers --truncate-prompt (keep the prompt's end)."""
    if limit is None or prompt_len + max_tokens + k + 1 <= limit:
        return None
    round_room = k + 1
    if 1 + 1 + round_room > limit:  # not even a 1-token prompt and 1 new token: k is the problem
        return UsageError(f"k={k} does not fit the model's {limit}-token context (a round needs k+1 = "
                          f"{round_room} positions past the output)", hint=f"lower --k to at most {limit - 3}")
    room = limit - max_tokens - round_room  # prompt tokens that fit with this max_tokens
    tokens_for_prompt = limit - prompt_len - round_room  # max_tokens that fits with this prompt
    truncate = " or pass --truncate-prompt (keeps the prompt's end)" if can_truncate else ""
    if room < 1:
        message = (f"max_tokens={max_tokens} leaves no room for a prompt in the model's {limit}-token context "
                   f"(k={k} needs {round_room} more)")
        if tokens_for_prompt >= 1:
            return UsageError(message, hint=f"lower --max-tokens to at most {tokens_for_prompt} for this "
                                            f"{prompt_len}-token prompt")
        return UsageError(message, hint=f"lower --max-tokens to at most {limit - round_room - 1}, and shorten the "
                                        f"prompt{truncate}")
    message = (f"the prompt has {prompt_len} tokens but only {room} fit with max_tokens={max_tokens} "
               f"in the model's {limit}-token context")
    fixes = [f"shorten the prompt to {room} tokens"]
    if tokens_for_prompt >= 1:
        fixes.append(f"lower --max-tokens to at most {tokens_for_prompt}")
    if can_truncate:
        fixes.append("pass --truncate-prompt (keeps the prompt's end)")
    return UsageError(message, hint=", ".join(fixes[:-1]) + " or " + fixes[-1] if len(fixes) > 1 else fixes[0])


def keep_end(ids: list[int], max_tokens: int, k: int, limit: int | None) -> list[int]:
    """--truncate-prompt: the end of the prompt that fits (at least its last token)."""
    if limit is None:
        return ids
    room = limit - max_tokens - k - 1
    return ids[-max(room, 1):]
