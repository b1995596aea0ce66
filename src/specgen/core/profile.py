"""Profiles: TOML files naming a target, a draft and the settings of a run.

load_profile() turns a profile plus command-line overrides into the frozen dataclasses of
core/settings.py. Every error says where the bad value came from, so the user knows what to edit:
a file value is named `file:line: table.key`, a command-line value by its option (`--top-p`).
The format is documented in docs/profiles.md; keep the two in step.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from specgen.core.errors import ProfileError, SpecgenError, UsageError
from specgen.core.settings import (
    AUTO,
    FUSIONS,
    MAX_TREE_NODES,
    MAX_TREE_WIDTH,
    KernelSpec,
    ModelSpec,
    Profile,
    MODEL_PROPOSERS,
    PROPOSER_KINDS,
    ProposerSpec,
    RuntimeSpec,
    SamplingSpec,
    SpeculationSpec,
    tree_envelope,
)

DEFAULT_PROFILE = "demo"
BUILTIN_SOURCE = "<built-in>"

_TABLES = {
    "target": ModelSpec,
    "draft": ModelSpec,
    "proposer": ProposerSpec,
    "speculation": SpeculationSpec,
    "sampling": SamplingSpec,
    "runtime": RuntimeSpec,
    "kernels": KernelSpec,
}
_TOP_LEVEL = ("name", "description")
# settings.py uses postponed annotations, so each field's type is its annotation string.
_FIELDS = {
    table: {field.name: field.type for field in dataclasses.fields(cls)}
    for table, cls in _TABLES.items()
}
_ALL_KEYS = [f"{table}.{name}" for table, fields in _FIELDS.items() for name in fields]

# Options whose name is not `--` + the key's last part (cli/options.py defines the options).
_OPTIONS = {
    "target.path": "--target",
    "draft.path": "--draft",
    "proposer.kind": "--proposer",
    "sampling.stop_token_ids": "--stop-token-id",  # repeatable, one id each
}


# ---------------------------------------------------------------- public API


def load_profile(
    name_or_path: str | None = None, overrides: Mapping[str, object] | None = None
) -> Profile:
    """Find, parse and validate a profile, then apply CLI overrides (dotted key -> value).

    None values in `overrides` mean "option not given" and are skipped.
    """
    located = _locate(DEFAULT_PROFILE if name_or_path is None else name_or_path)
    origin = _Origin(located.source, located.text)
    data = _parse(origin)
    merged = _Merged(origin)
    _merge_file(merged, data, located.base)
    _merge_overrides(merged, overrides or {})
    profile = _build(merged, data.get("name", located.name))
    _check_together(profile, merged)
    return profile


def mistaken_prompt(name: str, positional: bool, command: str) -> None:
    """Refuse a --profile value that finds no profile and reads like a prompt (words, code): -p is
    llama.cpp's prompt option. positional: the command (`specgen generate`) takes its prompt as an
    argument."""
    prose = any(c.isspace() or c in "()[]{}:;,=<>\"'" for c in name) and not name.endswith(".toml")
    if not prose or _findable(name):
        return
    where = "the prompt is the positional argument" if positional else f"{command} reads prompts from --prompts-file"
    hint = (f"{command} {shlex.quote(name)}" if positional
            else "give -p a profile name (`specgen profiles list`) or a .toml file")
    raise UsageError(f"`{name}` was taken as a profile name (-p is --profile in specgen), and no profile has it; "
                     f"{where}", hint=hint)


def _findable(name: str) -> bool:
    try:
        _locate(name)
    except ProfileError:
        return False
    return True


def list_profiles() -> list[tuple[str, str]]:
    """(name, source) of every profile reachable by name, in lookup order: built-in, then each of
    _profile_folders(). A profile named like one found earlier is left out: the name finds that one.
    """
    found = {
        entry.name[: -len(".toml")]: f"{BUILTIN_SOURCE}/{entry.name}"
        for entry in _builtin_dir().iterdir()
        if entry.name.endswith(".toml")
    }
    listed = sorted(found.items())
    for folder in _profile_folders():
        more = sorted((path.stem, str(path)) for path in folder.glob("*.toml") if path.stem not in found)
        found.update(more)
        listed += more
    return listed


def user_profile_dir() -> Path:
    """$SPECGEN_PROFILE_DIR, else $XDG_CONFIG_HOME/specgen/profiles, else ~/.config/..."""
    if os.environ.get("SPECGEN_PROFILE_DIR"):
        return Path(os.environ["SPECGEN_PROFILE_DIR"]).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or "~/.config"  # XDG: empty means unset
    return Path(config).expanduser() / "specgen" / "profiles"


def repository_profile_dir() -> Path | None:
    """The profiles/ folder of the checkout specgen runs from (installed with `pip install -e .`, or
    on PYTHONPATH), so that its examples are found by name there; None for an installed package."""
    root = _builtin_base().parents[2]  # src/specgen/builtin -> the checkout
    folder = root / "profiles"
    return folder if (root / "pyproject.toml").is_file() and folder.is_dir() else None


def profile_as_dict(profile: Profile) -> dict:
    """The resolved settings as nested dicts (draft is None without one; stop lists are tuples)."""
    data = dataclasses.asdict(profile)
    del data["options"]  # how the settings were given, not a setting
    return data


def origin(profile: Profile, key: str) -> str:
    """Where a dotted key's value was given, as a message names it: its option (`--target`) when the
    command line set it, else the key in the profile (`path` in [target] of p.toml)."""
    if key in profile.options:
        return _option(key)
    table, _, name = key.rpartition(".")
    return f"`{name}` in [{table}] of {profile.source}"


def profile_as_toml(profile: Profile) -> str:
    """The resolved settings as a TOML profile that loads back to the same settings."""
    data = profile_as_dict(profile)
    lines = [f"name = {_toml_value(data['name'])}", f"# source: {data['source']}"]
    for table in _TABLES:
        if data[table] is None:
            lines += ["", f"# no [{table}]"]
            continue
        lines += ["", f"[{table}]"]
        for key, value in data[table].items():
            lines.append(f"# {key}: not set" if value is None else f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- finding the file


@dataclasses.dataclass(frozen=True)
class _Located:
    name: str  # lookup name: the file name without .toml
    source: str  # as shown in messages
    text: str
    base: Path  # folder that relative model paths are resolved against


def _locate(name_or_path: str) -> _Located:
    path = Path(name_or_path).expanduser()
    if path.is_file() or name_or_path.endswith(".toml") or "/" in name_or_path:
        if path.is_dir():
            raise ProfileError(f"profile {name_or_path} is a directory", hint="give the path of a .toml file")
        if not path.is_file():
            raise ProfileError(f"profile file {name_or_path} not found")
        return _Located(path.stem, name_or_path, _read(path, name_or_path), path.absolute().parent)
    builtin = _builtin_dir() / f"{name_or_path}.toml"
    if builtin.is_file():
        source = f"{BUILTIN_SOURCE}/{name_or_path}.toml"
        return _Located(name_or_path, source, builtin.read_text("utf-8"), _builtin_base())
    for folder in _profile_folders():
        path = folder / f"{name_or_path}.toml"
        if path.is_file():
            return _Located(name_or_path, str(path), _read(path, str(path)), path.absolute().parent)
    raise _unknown_profile(name_or_path)


def _profile_folders() -> list[Path]:
    """Where a name is looked up after the built-in profiles: the user's folder, then the checkout's
    examples (a user's copy of an example, edited, is the one a name finds)."""
    return [folder for folder in (user_profile_dir(), repository_profile_dir()) if folder is not None]


def _read(path: Path, source: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark (Windows editors) is dropped
    except UnicodeDecodeError:
        raise ProfileError(f"{source}: not UTF-8 text; save the profile as UTF-8") from None
    except OSError as error:
        raise ProfileError(f"cannot read profile file {source}: {error.strerror}") from None


def _builtin_dir():
    # importlib.resources, so the packaged profiles are found however specgen is installed.
    return resources.files("specgen") / "builtin"


def _builtin_base() -> Path:
    return Path(str(_builtin_dir())).absolute()


def _unknown_profile(name: str) -> ProfileError:
    names = [known for known, _ in list_profiles()]
    close = difflib.get_close_matches(name, names, n=1)
    guess = f" (did you mean `{close[0]}`?)" if close else ""
    return ProfileError(
        f"unknown profile `{name}`{guess}; available: {', '.join(names) or 'none'}",
        hint=f"Put your own profiles in {user_profile_dir()} or pass a path to a .toml file.",
    )


# ---------------------------------------------------------------- parsing and merging


@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where values came from: a profile file, or the command line (source None)."""

    source: str | None = None
    text: str = ""

    def subject(self, key: str, value: object) -> str:
        if self.source is None:
            return f"{_option(key)} {value}"
        return f"`{key} = {_toml_value(value)}`"

    def name(self, key: str) -> str:
        return _option(key) if self.source is None else f"`{key}`"

    def error(self, key: str, message: str) -> SpecgenError:
        if self.source is None:
            return UsageError(message)
        line = _line_of(self.text, key)
        return ProfileError(f"{self.source}{f':{line}' if line else ''}: {message}")


_CLI = _Origin()

# A prompts file's JSON line may carry its own values of these [sampling] keys (docs/cli.md).
PROMPT_SETTINGS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop")


class _PromptLine(_Origin):
    """A JSON line of a prompts file (`where` = FILE:LINE): its keys are named as they are written."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def subject(self, key: str, value: object) -> str:
        return f'"{key.partition(".")[2]}": {json.dumps(value)}'

    def error(self, key: str, message: str) -> SpecgenError:
        return UsageError(f"{self.where}: {message}")


def prompt_settings(record: dict, where: str) -> dict:
    """The [sampling] values a prompts file's JSON line gives for its own prompt, validated as the
    profile's keys are; where: FILE:LINE, for the one-line error."""
    origin = _PromptLine(where)
    return {name: _validated(f"sampling.{name}", record[name], origin) for name in PROMPT_SETTINGS if name in record}


def with_prompt_settings(profile: Profile, values: dict, where: str) -> Profile:
    """The profile as one prompt's own settings change it (a UsageError naming `where` when they
    contradict the profile's)."""
    if not values:
        return profile
    sampling = dataclasses.replace(profile.sampling, **values)
    if sampling.min_tokens > sampling.max_tokens:
        raise UsageError(f'{where}: "max_tokens": {sampling.max_tokens} is below the profile\'s min_tokens '
                         f"({sampling.min_tokens})", hint="raise the line's max_tokens, or lower min_tokens")
    return dataclasses.replace(profile, sampling=sampling)


@dataclasses.dataclass
class _Merged:
    """Validated settings by dotted key, remembering which came from the command line."""

    file: _Origin
    values: dict[str, object] = dataclasses.field(default_factory=dict)
    tables: set[str] = dataclasses.field(default_factory=set)  # tables written in the file
    from_cli: set[str] = dataclasses.field(default_factory=set)

    def table(self, table: str) -> dict[str, object]:
        prefix = f"{table}."
        return {k[len(prefix) :]: v for k, v in self.values.items() if k.startswith(prefix)}

    def blame(self, *keys: str) -> _Origin:
        return _CLI if self.from_cli.intersection(keys) else self.file


def _parse(origin: _Origin) -> dict:
    try:
        return tomllib.loads(origin.text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        where = re.search(r" \(at line (\d+), column (\d+)\)$", message)
        if where:
            line, column = where.groups()
            reason = message[: where.start()]
            raise ProfileError(f"{origin.source}:{line}:{column}: invalid TOML: {reason}") from None
        raise ProfileError(f"{origin.source}: invalid TOML: {message}") from None


def _merge_file(merged: _Merged, data: dict, base: Path) -> None:
    origin = merged.file
    for key, value in data.items():
        if key in _TOP_LEVEL:
            _checked_type(key, value, "str", origin)
        elif key not in _TABLES:
            is_table = isinstance(value, dict)
            raise origin.error(key, _unknown_table(key) if is_table else _unknown_key(key))
        elif not isinstance(value, dict):
            raise origin.error(key, f"`{key}` must be a table ([{key}]), not {_type_name(value)}")
        else:
            merged.tables.add(key)
            for name, setting in value.items():
                if not _retired(f"{key}.{name}", setting, origin):
                    merged.values[f"{key}.{name}"] = _validated(f"{key}.{name}", setting, origin)
    for key in ("target.path", "draft.path"):
        if key in merged.values:
            merged.values[key] = _resolve_model_path(merged.values[key], base)
    if merged.values.get("proposer.head"):  # a folder, never a hub id: always next to the profile
        merged.values["proposer.head"] = os.path.abspath(base / Path(merged.values["proposer.head"]).expanduser())


def _merge_overrides(merged: _Merged, overrides: Mapping[str, object]) -> None:
    for key, value in overrides.items():
        if value is None or _retired(key, value, _CLI):
            continue
        merged.values[key] = _validated(key, value, _CLI)
        merged.from_cli.add(key)


def _resolve_model_path(path: str, base: Path) -> str:
    """A folder next to the profile becomes absolute; anything else may be a hub id, kept as is."""
    expanded = Path(path).expanduser()
    if expanded.is_absolute():
        return str(expanded)
    if path.startswith(("./", "../")) or (base / path).exists():
        return os.path.abspath(base / path)
    return path


def _build(merged: _Merged, name: str) -> Profile:
    return Profile(
        name=name,
        source=merged.file.source,
        target=_model_spec(merged, "target"),
        # CLI options such as --dtype set both models; without a draft they set only the target.
        draft=_model_spec(merged, "draft") if _has_draft(merged) else None,
        proposer=ProposerSpec(**merged.table("proposer")),
        speculation=SpeculationSpec(**merged.table("speculation")),
        sampling=SamplingSpec(**merged.table("sampling")),
        runtime=RuntimeSpec(**merged.table("runtime")),
        kernels=KernelSpec(**merged.table("kernels")),
        options=frozenset(merged.from_cli),
    )


def _model_spec(merged: _Merged, table: str) -> ModelSpec:
    settings = merged.table(table)
    if "path" in settings:
        return ModelSpec(**settings)
    option = _option(f"{table}.path")
    if table in merged.tables:
        message = f"[{table}] has no `path`: set `path = ...` in it, or pass {option} PATH"
    else:
        message = f"no [{table}]: add a [{table}] table with `path = ...`, or pass {option} PATH"
    raise merged.file.error(table, message)


def _check_tree(spec: SpeculationSpec, merged: _Merged) -> None:
    """A node budget the tree can hold; with tree_width auto, the widest tree's (auto picks a
    width that holds it, or the chain)."""
    if spec.tree_nodes == AUTO:
        return
    top = min(tree_envelope(spec.k, MAX_TREE_WIDTH if spec.tree_width == AUTO else spec.tree_width), MAX_TREE_NODES)
    if spec.tree_nodes and not spec.k <= spec.tree_nodes <= top:
        origin = merged.blame("speculation.tree_nodes", "speculation.tree_width", "speculation.k")
        raise origin.error(
            "speculation.tree_nodes",
            f"{origin.name('speculation.tree_nodes')} ({spec.tree_nodes}) must be 0 (= k) or from "
            f"{origin.name('speculation.k')} ({spec.k}) to {top}, the nodes a tree of that depth "
            + (f"and width {spec.tree_width} holds" if spec.tree_width != AUTO else
               f"holds at the widest width auto may choose ({MAX_TREE_WIDTH})"),
        )


def _has_draft(merged: _Merged) -> bool:
    return "draft" in merged.tables or "draft.path" in merged.values


def _check_together(profile: Profile, merged: _Merged) -> None:
    sampling, proposer = profile.sampling, profile.proposer
    if sampling.min_tokens > sampling.max_tokens:
        origin = merged.blame("sampling.min_tokens", "sampling.max_tokens")
        raise origin.error(
            "sampling.min_tokens",
            f"{origin.name('sampling.min_tokens')} ({sampling.min_tokens}) must be <= "
            f"{origin.name('sampling.max_tokens')} ({sampling.max_tokens})",
        )
    if proposer.ngram_max < proposer.ngram_min:
        origin = merged.blame("proposer.ngram_min", "proposer.ngram_max")
        raise origin.error(
            "proposer.ngram_max",
            f"{origin.name('proposer.ngram_max')} ({proposer.ngram_max}) must be >= "
            f"{origin.name('proposer.ngram_min')} ({proposer.ngram_min})",
        )
    _check_tree(profile.speculation, merged)
    if proposer.uses_draft and profile.draft is None:
        origin = merged.blame("proposer.kind")
        raise origin.error(
            "proposer.kind",
            f"the {proposer.kind} proposer needs a draft model: add a [draft] table with `path = ...`, "
            "pass --draft PATH, or use --proposer ngram",
        )
    for table, spec in (("target", profile.target), ("draft", profile.draft)):
        if spec is not None and spec.max_memory and spec.device_map not in _STRATEGIES:
            origin = merged.blame(f"{table}.max_memory", f"{table}.device_map")
            raise origin.error(
                f"{table}.max_memory",
                f"{origin.name(f'{table}.max_memory')} needs a device_map that places the model by it: set "
                f"`device_map = \"auto\"` (or balanced, balanced_low_0, sequential) in [{table}]",
            )
    if proposer.drafter() == "eagle" and not proposer.head:
        origin = merged.blame("proposer.kind")
        raise origin.error(
            "proposer.kind",
            f"the {proposer.kind} proposer needs an EAGLE-3 head: set `head = \"FOLDER\"` in [proposer] or pass "
            "--head FOLDER (`specgen train-head` writes one)",
        )


# ---------------------------------------------------------------- one value

# Keys specgen no longer has: key -> (the value that asked for nothing, what to do instead). A
# profile written before (profile_as_toml writes every key) still loads when it holds that value;
# any other value is a one-line error, never silently ignored.
_RETIRED: dict[str, tuple[object, str]] = {
    "speculation.compile": (False, "torch.compile was removed: captured steps on specgen's kernels ran as fast "
                                   "without it and started 6 s sooner (docs/benchmarks.md, decisions); remove it"),
    "speculation.autotune": (False, "autotune (an option of compile) was removed with compile; remove it"),
    "speculation.compile_cache": ("", "compile's cache folder was removed with compile; remove it"),
    **{f"kernels.{key}": ("auto", f"was replaced by `disable = [\"{fusion}\"]` in [kernels] (the fusion is on "
                                  "wherever it applies; the list turns it off); remove it")
       for key, fusion in (("rope", "rope"), ("split_k", "split_k"), ("warp", "round"), ("norm", "norm"),
                           ("head", "head"), ("step_io", "step_io"), ("dependent_launch", "dependent_launch"))},
}


def _retired(key: str, value: object, origin: _Origin) -> bool:
    """True for a retired key holding its no-op value (skip it); raises for any other value."""
    if key not in _RETIRED:
        return False
    inert, message = _RETIRED[key]
    if value == inert and type(value) is type(inert):
        return True
    raise origin.error(key, f"{origin.name(key)}: {message}")


def _validated(key: str, value: object, origin: _Origin) -> object:
    table, _, name = key.partition(".")
    kind = _FIELDS.get(table, {}).get(name)
    if kind is None:
        raise origin.error(key, _unknown_key(key))
    converted = _checked_type(key, value, kind, origin)
    check, allowed = _RULES.get(key, (None, ""))
    if check is not None and not check(converted):
        raise origin.error(key, f"{origin.subject(key, value)} is not allowed: {allowed}")
    return converted


_INVALID = object()


def _to_str(value: object) -> object:
    return value if isinstance(value, str) else _INVALID


def _to_bool(value: object) -> object:
    return value if isinstance(value, bool) else _INVALID


def _to_int(value: object) -> object:
    # bool is an int subclass in Python, but `k = true` is a mistake, not 1.
    return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID


def _to_float(value: object) -> object:
    if _to_int(value) is _INVALID and not isinstance(value, float):
        return _INVALID
    return float(value) if math.isfinite(value) else _INVALID


def _to_count_or_auto(value: object) -> object:
    """An integer, or "auto"; a string of digits (as the command line gives it) is that integer."""
    if isinstance(value, str):
        return int(value) if value.isdigit() else value
    return _to_int(value)


def _to_strs(value: object) -> object:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return _INVALID


_MEMORY_KEY = re.compile(r"(?:cuda:)?(\d+)|cpu")
_MEMORY_SIZE = re.compile(r"\d+(\.\d+)?\s*([KMGT]i?B|B)?", re.IGNORECASE)


def _to_sizes(value: object) -> object:
    """max_memory: a table (or the (device, size) pairs profile_as_toml writes back) -> pairs with
    GPUs by index ("cuda:1" -> "1") and sizes as strings (bytes as an integer -> "123")."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return _INVALID
    pairs = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            return _INVALID
        device, size = item
        if not isinstance(device, str) or _to_int(size) is _INVALID and not isinstance(size, str):
            return _INVALID
        match = _MEMORY_KEY.fullmatch(device)
        pairs.append(((match.group(1) or "cpu") if match else device, str(size)))
    return tuple(pairs)


def _sizes_ok(pairs: tuple) -> bool:
    return all(_MEMORY_KEY.fullmatch(device) and _MEMORY_SIZE.fullmatch(size) for device, size in pairs)


def _to_ints(value: object) -> object:
    if isinstance(value, (list, tuple)) and all(_to_int(item) is not _INVALID for item in value):
        return tuple(value)
    return _INVALID


# annotation string in settings.py -> (converter, what the message says is expected)
_TYPES: dict[str, tuple[Callable[[object], object], str]] = {
    "str": (_to_str, "a string"),
    "str | None": (_to_str, "a string"),
    "bool": (_to_bool, "true or false"),
    "int": (_to_int, "an integer"),
    "int | None": (_to_int, "an integer"),
    "int | str": (_to_count_or_auto, "an integer or auto"),
    "float": (_to_float, "a finite number"),
    "tuple[str, ...]": (_to_strs, "a string or an array of strings"),
    "tuple[int, ...]": (_to_ints, "an array of integers"),
    "tuple[tuple[str, str], ...] | None": (_to_sizes, 'a table of sizes by device: { "0" = "70GiB", cpu = "64GiB" }'),
}


def _checked_type(key: str, value: object, kind: str, origin: _Origin) -> object:
    convert, expected = _TYPES[kind]
    converted = convert(value)
    if converted is _INVALID:
        message = f"{origin.subject(key, value)} is {_type_name(value)}; expected {expected}"
        raise origin.error(key, message)
    return converted


_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "an array",
    tuple: "an array",
    dict: "a table",
}


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), f"a {type(value).__name__}")


def _one_of(*choices: str) -> tuple[Callable[[object], bool], str]:
    return (lambda value: value in choices), f"must be one of {', '.join(choices)}"


def _for_models(field: str, rule: tuple[Callable[[object], bool], str]) -> dict:
    return {f"{table}.{field}": rule for table in ("target", "draft")}


_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# accelerate's named strategies, or one device for the whole model
_DEVICE_MAP = re.compile(r"auto|balanced|balanced_low_0|sequential|cpu|cuda(:\d+)?")
_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # the device_maps that read max_memory

# dotted key -> (check, what is allowed); types are already checked when these run.
_RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    **_for_models("path", (bool, "must not be empty")),
    **_for_models("dtype", _one_of("auto", "float32", "float16", "bfloat16")),
    **_for_models("device", (_DEVICE.fullmatch, "must be auto, cpu, cuda or cuda:N")),
    **_for_models("device_map", (_DEVICE_MAP.fullmatch,
                                 "must be auto, balanced, balanced_low_0, sequential, cpu, cuda or cuda:N")),
    **_for_models("max_memory", (_sizes_ok, 'devices are GPU indices ("0", "1") or cpu, sizes like "70GiB", '
                                            '"512MB" or a number of bytes')),
    "proposer.kind": _one_of(*PROPOSER_KINDS),
    "proposer.hybrid_with": _one_of(*MODEL_PROPOSERS),
    "proposer.ngram_min": (lambda v: v >= 1, "must be >= 1"),
    "proposer.ngram_max": (lambda v: v <= 32, "must be <= 32"),
    "proposer.draft_p_min": (lambda v: 0 <= v < 1, "must be in [0, 1) (0 = off)"),
    "speculation.k": (lambda v: 1 <= v <= 32, "must be from 1 to 32"),
    "speculation.draft_sampling": _one_of("auto", "argmax", "sample", "temperature"),
    "speculation.pipeline": _one_of("auto", "on", "off"),
    "speculation.hybrid_merge": _one_of("never", "always", "auto"),
    "speculation.tree_width": (lambda v: v == "auto" or isinstance(v, int) and 1 <= v <= MAX_TREE_WIDTH,
                               f"must be auto or from 1 (a chain) to {MAX_TREE_WIDTH}"),
    "speculation.tree_nodes": (lambda v: v == "auto" or isinstance(v, int) and 0 <= v <= MAX_TREE_NODES,
                               f"must be auto or from 0 (= k) to {MAX_TREE_NODES}"),
    # finite bounds: the warp runs in float32, where 1e300 is infinite; at 100 sampling is already
    # close to uniform, and 0.01 / 100 scale a repeated token's logit a hundredfold
    "sampling.temperature": (lambda v: 0 <= v <= 100, "must be from 0 (greedy) to 100"),
    "sampling.top_k": (lambda v: v == -1 or v >= 1, "must be -1 (off) or >= 1"),
    "sampling.top_p": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "sampling.min_p": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    "sampling.repetition_penalty": (lambda v: 0.01 <= v <= 100, "must be from 0.01 to 100 (1 = off)"),
    "sampling.presence_penalty": (lambda v: -2 <= v <= 2, "must be in [-2, 2]"),
    "sampling.frequency_penalty": (lambda v: -2 <= v <= 2, "must be in [-2, 2]"),
    "sampling.seed": (lambda v: 0 <= v < 2**64, "must be from 0 to 2**64 - 1"),  # torch's seed range
    "sampling.max_tokens": (lambda v: v >= 1, "must be >= 1"),
    "sampling.min_tokens": (lambda v: v >= 0, "must be >= 0"),
    "sampling.stop": (all, "must not contain an empty string"),  # "" would stop at once
    "sampling.stop_token_ids": (lambda v: all(i >= 0 for i in v), "must be token ids >= 0"),
    "sampling.logprobs": (lambda v: 0 <= v <= 20, "must be from 0 to 20"),
    "sampling.logprobs_mode": _one_of("warped", "raw"),
    "sampling.coupling": _one_of("rejection", "gumbel"),
    "runtime.threads": (lambda v: 0 <= v <= 1024, "must be from 0 (auto) to 1024"),
    "runtime.modeling": _one_of("auto", "transformers"),
    "runtime.batch_size": (lambda v: v == "auto" or isinstance(v, int) and 1 <= v <= 256,
                           "must be auto or from 1 to 256"),
    "kernels.attention": _one_of("auto", "kernel", "sdpa"),
    "kernels.linear": _one_of("auto", "kernel", "torch"),
    "kernels.disable": (lambda v: set(v) <= set(FUSIONS), f"names fusions among {', '.join(FUSIONS)}"),
}


# ---------------------------------------------------------------- messages


def _option(key: str) -> str:
    return _OPTIONS.get(key) or "--" + key.rpartition(".")[2].replace("_", "-")


def _unknown_key(key: str) -> str:
    guess = _suggest(key)
    if guess:
        return f"unknown key `{key}`; did you mean `{guess}`?"
    table = key.partition(".")[0]
    if "." in key and table in _FIELDS:
        return f"unknown key `{key}`; [{table}] allows: {', '.join(_FIELDS[table])}"
    return f"unknown key `{key}`; the top level allows {', '.join(_TOP_LEVEL)} and tables"


def _unknown_table(table: str) -> str:
    close = difflib.get_close_matches(table, list(_TABLES), n=1)
    if close:
        return f"unknown table [{table}]; did you mean [{close[0]}]?"
    return f"unknown table [{table}]; tables are {', '.join(f'[{t}]' for t in _TABLES)}"


def _suggest(key: str) -> str | None:
    table, _, name = key.rpartition(".")
    siblings = _FIELDS.get(table, _TOP_LEVEL if not table else ())
    typo = difflib.get_close_matches(name, siblings, n=1)
    if typo:
        return f"{table}.{typo[0]}" if table else typo[0]
    # A known key in the wrong table: `[sampling] k` means `speculation.k`.
    moved = [known for known in _ALL_KEYS if known.rpartition(".")[2] == name]
    # Only near-certain matches on whole keys: a shared `sampling.` prefix makes any two alike.
    close = moved or difflib.get_close_matches(key, _ALL_KEYS, n=1, cutoff=0.85)
    return close[0] if close else None


_HEADER = re.compile(r"\s*\[\s*([A-Za-z0-9_.-]+)\s*\]")
_KEY = re.compile(r"""\s*["']?([A-Za-z0-9_-]+)["']?\s*=""")


def _line_of(text: str, key: str) -> int | None:
    """Line of `key` in plain `[table]` / `key = value` layout; None when written otherwise."""
    table, _, name = key.rpartition(".")
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            if current == key:
                return number
        elif current == table and (match := _KEY.match(line)) and match.group(1) == name:
            return number
    return None


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # JSON string escapes are TOML basic-string escapes, except that TOML wants DEL escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, tuple) for item in value):
        return "{ " + ", ".join(f"{_toml_value(k)} = {_toml_value(v)}" for k, v in value) + " }"  # max_memory
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ ... }"
    return repr(value)
