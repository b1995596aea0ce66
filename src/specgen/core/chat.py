"""A prompt in the model's chat template, with an optional system prompt, as token ids."""

from __future__ import annotations

from specgen.core.errors import UsageError


def chat_ids(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    """The template already holds the special tokens it wants (BOS and role markers), so the text
    is encoded without adding them again."""
    from jinja2 import TemplateError

    if not getattr(tokenizer, "chat_template", None):
        raise UsageError("--chat was given but this tokenizer has no chat template",
                         hint="drop --chat and --system to send the prompt as plain text")
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": prompt})
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except TemplateError as exc:
        if system is None:  # the template itself is broken or unsafe: the caller names the checkpoint
            raise
        raise UsageError(f"the model's chat template refused the prompt: {exc}",
                         hint="drop --system: this model may take no system prompt") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"]
