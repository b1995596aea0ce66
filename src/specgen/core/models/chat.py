"""A prompt in the model's chat template, with an optional system prompt, as token ids."""

from __future__ import annotations

import json
from pathlib import Path

from specgen.core.errors import ModelError, UsageError

# where a checkpoint's tokenizer keeps its chat templates in JSON (chat_template.jinja is text)
TEMPLATE_FILES = ("tokenizer_config.json", "chat_template.json")


def check_templates(folder: Path) -> None:
    """A `chat_template` that transformers would fail on when loading the tokenizer or applying the
    template, far from the file: it must be a string, or named templates as transformers writes
    them (a list of {"name": ..., "template": ...}, or an object of name -> template)."""
    for path in (folder / name for name in TEMPLATE_FILES):
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # absent, or for the tokenizer's loader to name
        template = config.get("chat_template") if isinstance(config, dict) else None
        if template is not None and not _template_shaped(template):
            raise ModelError(f"{path}: `chat_template` is {json.dumps(template)[:40]}; expected a string, or a "
                             'list of {"name": ..., "template": ...} objects',
                             hint="fix the file, or copy the tokenizer files of the model again")


def _template_shaped(template: object) -> bool:
    if isinstance(template, str):
        return True
    if isinstance(template, list):
        return all(isinstance(entry, dict) and isinstance(entry.get("name"), str)
                   and isinstance(entry.get("template"), str) for entry in template)
    return isinstance(template, dict) and all(isinstance(t, str) for t in template.values())


def chat_ids(tokenizer, prompt: str, system: str | None = None) -> list[int]:
    """The template already holds the special tokens it wants (BOS and role markers), so the text
    is encoded without adding them again."""
    from jinja2 import TemplateError

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise UsageError("--chat was given but this tokenizer has no chat template",
                         hint="drop --chat and --system to send the prompt as plain text")
    if isinstance(template, dict) and "default" not in template:  # transformers takes the one named default
        raise UsageError(f"--chat was given but this tokenizer's chat templates ({', '.join(template)}) have "
                         "none named default", hint="drop --chat and --system to send the prompt as plain text")
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
