"""Options shared by generate, bench and inspect-acceptance: one definition each.

Each maps to a dotted profile key; `overrides()` turns the given ones into load_profile overrides,
so every CLI option overrides the profile and goes through the profile's validation.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup


def _panel(title: str):
    """Options under one heading of --help. Each panel is its own table, so a long option name in
    one does not squeeze (and cut) the names of another at 80 columns."""
    return lambda *names, **kwargs: typer.Option(*names, rich_help_panel=title, **kwargs)


_models, _speculation, _sampling = _panel("Models"), _panel("Speculation"), _panel("Sampling")
prompts_option, output_option = _panel("Prompts"), _panel("Output")  # also for a command's own options

def _profile_value(ctx: typer.Context, value: Optional[str]) -> Optional[str]:
    """-p is llama.cpp's prompt: a value that finds no profile and reads like a prompt is refused as
    soon as the command line is read (before a terminal's stdin is waited for as the prompt)."""
    if value is not None:
        from specgen.core.profile import mistaken_prompt

        mistaken_prompt(value, positional="prompt" in {param.name for param in ctx.command.params},
                        command=ctx.command_path)
    return value


Profile = Annotated[Optional[str], typer.Option(
    "--profile", "-p", callback=_profile_value, help="Profile name or .toml path (default: demo).")]
Target = Annotated[Optional[str], _models("--target", help="Target checkpoint: local folder or cached hub id.")]
Draft = Annotated[Optional[str], _models("--draft", help="Draft checkpoint: local folder or cached hub id.")]
Proposer = Annotated[Optional[str], _speculation(
    "--proposer", help="draft | ngram | hybrid (n-gram, else draft) | eagle (a head, --head) | mtp | none.")]
Head = Annotated[Optional[str], _models("--head", help="EAGLE-3 head folder (for --proposer eagle).")]
K = Annotated[Optional[int], _speculation("--k", help="Draft tokens per round (1..32).")]
TreeWidth = Annotated[Optional[str], _speculation(
    "--tree-width", help="Children a draft node may have (1 = a chain; every proposer; auto: from what bench "
    "measured).")]
TreeNodes = Annotated[Optional[str], _speculation(
    "--tree-nodes", help="Tokens the target verifies per round besides the root (0 = k; auto: from what "
    "bench measured).")]
DraftPMin = Annotated[Optional[float], _speculation(
    "--draft-p-min", help="Stop a round's drafting when the draft's p(next) is below this (0 = off).")]
AdaptiveK = Annotated[Optional[bool], _speculation(
    "--adaptive-k/--no-adaptive-k", help="Adapt k per round from recent acceptance (at most --k).")]
Temperature = Annotated[Optional[float], _sampling(
    "--temperature", "-t", help="0 = greedy; a warning above 2 (-t is not threads here: see --threads).")]
TopP = Annotated[Optional[float], _sampling("--top-p", help="Nucleus mass in (0, 1].")]
TopK = Annotated[Optional[int], _sampling("--top-k", help="Keep the k most likely tokens; -1 = off.")]
MinP = Annotated[Optional[float], _sampling("--min-p", help="Drop tokens below min_p * max p.")]
RepetitionPenalty = Annotated[Optional[float], _sampling("--repetition-penalty", help="> 1 discourages repeats.")]
PresencePenalty = Annotated[Optional[float], _sampling("--presence-penalty", help="In [-2, 2].")]
FrequencyPenalty = Annotated[Optional[float], _sampling("--frequency-penalty", help="In [-2, 2].")]
Seed = Annotated[Optional[int], _sampling(
    "--seed", help="0 to 2**64-1. Same seed, same settings (k and proposer too), same text on the same device.")]
MaxTokens = Annotated[Optional[int], _sampling("--max-tokens", "-n", help="Tokens to generate at most.")]
MinTokens = Annotated[Optional[int], _sampling("--min-tokens", help="No EOS/stop id before this many tokens.")]
Stop = Annotated[Optional[list[str]], _sampling(
    "--stop", metavar="<str>", help="Stop string (repeatable); not included in the output.")]
StopTokenId = Annotated[Optional[list[int]], _sampling(
    "--stop-token-id", metavar="<int>", help="Stop token id (repeatable).")]
IgnoreEos = Annotated[Optional[bool], _sampling("--ignore-eos/--no-ignore-eos", help="Keep going past EOS.")]
Dtype = Annotated[Optional[str], _models("--dtype", help="auto | float32 | bfloat16 | float16 (every model loaded).")]
Device = Annotated[Optional[str], _models("--device", help="auto | cpu | cuda | cuda:N (every model loaded).")]
# Retired with torch.compile: kept, hidden, so that a script passing them gets the one-line error
# that says so (core/profile.py's _RETIRED), not "no such option".
Compile = Annotated[Optional[bool], _models("--compile/--no-compile", hidden=True)]
Autotune = Annotated[Optional[bool], _models("--autotune/--no-autotune", hidden=True)]
Threads = Annotated[Optional[int], _models(
    "--threads", help="CPU threads for torch; 0 = auto (half the CPUs, at least 1).")]
Logprobs = Annotated[Optional[int], output_option(
    "--logprobs", help="Also report the N most likely tokens' logprobs per token (0..20).")]
Coupling = Annotated[Optional[str], _sampling(
    "--coupling", help="Sampled tokens: rejection (most accepted drafts) | gumbel (the text target-only "
    "decoding gives with this seed, whatever k and the proposer).")]
LogprobsMode = Annotated[Optional[str], output_option(
    "--logprobs-mode", help="warped (default: the distribution tokens are drawn from) | raw (the model's own).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Nothing on stderr but errors.")]
Chat = Annotated[bool, prompts_option("--chat", help="Wrap each prompt in the model's chat template.")]
System = Annotated[Optional[str], prompts_option(
    "--system", help="System prompt for the chat template (implies --chat).")]
PromptsFile = Annotated[Optional[Path], prompts_option(
    "--prompts-file", help="One prompt per line, or JSONL with a 'prompt' field.")]
# The name bench and inspect-acceptance had: still accepted, no longer shown.
PromptsAlias = Annotated[Optional[Path], typer.Option("--prompts", hidden=True)]
BatchSize = Annotated[Optional[str], prompts_option(
    "--batch-size", help="Prompts of --prompts-file decoded at once (1..256, or auto; default 1).")]
TruncatePrompt = Annotated[bool, prompts_option(
    "--truncate-prompt", help="Keep the end of a prompt that is too long for the context.")]
Download = Annotated[Optional[bool], _models(
    "--download/--no-download", help="Fetch a hub id missing from the local cache (default: never use the network).")]
TrustRemoteCode = Annotated[bool, _models("--trust-remote-code", help="Allow checkpoint code to run (risky).")]
AllowPickle = Annotated[bool, _models("--allow-pickle", help="Allow pickle-based weights (.bin/.pt).")]


def _print_version(value: bool) -> None:
    if value:
        from specgen import __version__

        print(f"specgen {__version__}")
        raise typer.Exit()


Version = Annotated[bool, typer.Option(
    "--version", "-V", is_eager=True, callback=_print_version, help="Print the version and exit.")]


class _Switches:
    """Switches (--quiet, --chat/--no-chat, -h/--help) shown as the switches they are: Typer would
    print a `<bool>` value placeholder after each, as if they took one."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


# Other tools' spellings of specgen's options with the same meaning, accepted (not shown in --help):
# llama.cpp's --temp and --n-predict, vLLM's --num-speculative-tokens, transformers' max_new_tokens.
ALIASES = {"temp": "temperature", "n-predict": "max-tokens", "num-speculative-tokens": "k",
           "max-new-tokens": "max-tokens"}

# Spellings of llama.cpp and vLLM whose meaning differs, or that specgen splits in two: refused,
# with what to write instead (cli/errors.py puts it in the hint).
FOREIGN = {
    "--model": "specgen runs two models: --target (whose output you get) and --draft (the small one that proposes)",
    "-m": "specgen runs two models: --target (whose output you get) and --draft (the small one that proposes)",
    "--model-draft": "the draft model is --draft",
    "--speculative-model": "the draft model is --draft",
    "--speculative-config": "specgen takes --draft (or --proposer ngram | eagle --head DIR | mtp) and --k",
    "--draft-max": "the draft tokens per round are --k",
    "--draft-n": "the draft tokens per round are --k",
    "--repeat-penalty": "use --repetition-penalty (vLLM's: over the prompt and the output, not llama.cpp's last "
                        "64 tokens)",
    "-s": "the seed is --seed",
    "--file": "a file of prompts is --prompts-file FILE (one prompt a line, or JSONL)",
    "--ctx-size": "specgen takes the context from the model; --max-tokens bounds the output",
    "--max-model-len": "specgen takes the context from the model; --max-tokens bounds the output",
}


def foreign_hint(option: str, ctx) -> str | None:
    """What to write instead of another tool's option, for the command (click context) it was given to."""
    if option == "--prompt":
        positional = ctx is not None and "prompt" in {param.name for param in ctx.command.params}
        return (f"the prompt is the positional argument: {ctx.command_path} \"TEXT\"" if positional
                else "give the prompts in a file: --prompts-file FILE")
    return FOREIGN.get(option)


class Command(_Switches, TyperCommand):
    def make_context(self, info_name, args, parent=None, **extra):
        """With ALIASES read as the option each stands for, where this command has that option."""
        names = {name for param in self.params for name in getattr(param, "opts", ())}
        extra.setdefault("token_normalize_func", lambda name: _alias(name, names))
        return super().make_context(info_name, args, parent, **extra)


def _alias(name: str, names: set[str]) -> str:
    """Click's token normalizer: an option's name without its dashes (also a choice's value, which
    no alias equals)."""
    meant = ALIASES.get(name)
    return meant if meant is not None and f"--{meant}" in names else name


class Group(_Switches, TyperGroup):
    pass


def prompts_path(prompts_file: Path | None, prompts: Path | None) -> Path | None:
    """--prompts-file, or its older name --prompts; not both."""
    from specgen.core.errors import UsageError

    if prompts_file is not None and prompts is not None:
        raise UsageError("give --prompts-file once (--prompts is its old name)")
    return prompts_file if prompts_file is not None else prompts


def comma_list(text: str, option: str, example: str) -> list[str]:
    """The entries of a comma-separated option value, stripped. An empty entry (`4,,5`, a trailing
    comma) is refused, not dropped: it is more likely a value left out than one too many."""
    from specgen.core.errors import UsageError

    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise UsageError(f"{option} is empty", hint=f"e.g. {option} {example}")
    if not all(parts):
        raise UsageError(f"{option} {text!r} has an empty entry", hint=f"e.g. {option} {example}")
    return parts


HIGH_TEMPERATURE = 2.0


def warn_settings(settings, quiet: bool) -> None:
    """Settings that are valid but most likely a typo: a warning line on stderr, unless --quiet."""
    temperature = settings.sampling.temperature
    if temperature > HIGH_TEMPERATURE and not quiet:
        print(f"specgen: warning: temperature {temperature:g} is above {HIGH_TEMPERATURE:g}, close to uniform "
              "sampling; -t is --temperature in specgen (CPU threads: --threads)", file=sys.stderr)


def overrides(**options) -> dict:
    """Keyword names as above (snake_case) -> dotted profile keys; None means not given."""
    keys = {
        "target": "target.path", "draft": "draft.path", "proposer": "proposer.kind", "head": "proposer.head",
        "k": "speculation.k", "tree_width": "speculation.tree_width", "tree_nodes": "speculation.tree_nodes",
        "draft_p_min": "proposer.draft_p_min", "adaptive_k": "proposer.adaptive_k",
        "temperature": "sampling.temperature", "top_p": "sampling.top_p", "top_k": "sampling.top_k",
        "min_p": "sampling.min_p", "repetition_penalty": "sampling.repetition_penalty",
        "presence_penalty": "sampling.presence_penalty", "frequency_penalty": "sampling.frequency_penalty",
        "seed": "sampling.seed", "max_tokens": "sampling.max_tokens", "min_tokens": "sampling.min_tokens",
        "stop": "sampling.stop", "stop_token_id": "sampling.stop_token_ids", "ignore_eos": "sampling.ignore_eos",
        "logprobs": "sampling.logprobs", "logprobs_mode": "sampling.logprobs_mode", "coupling": "sampling.coupling",
        "compile": "speculation.compile", "autotune": "speculation.autotune",
        "threads": "runtime.threads", "download": "runtime.download", "batch_size": "runtime.batch_size",
    }
    out = {keys[name]: value for name, value in options.items() if name in keys and value not in (None, [])}
    for name in ("dtype", "device"):
        if options.get(name) is not None:
            out[f"target.{name}"] = options[name]
            out[f"draft.{name}"] = options[name]
    if options.get("trust_remote_code"):
        out["target.trust_remote_code"] = True
        out["draft.trust_remote_code"] = True
    return out
