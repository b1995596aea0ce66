"""Profiles: lookup, parsing, validation, overrides, path resolution and `specgen profiles`."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.cli.profiles import app
from repo_paths import REPO
from specgen.core.errors import ProfileError, UsageError
from specgen.core import profile as profile_module
from specgen.core.profile import (
    list_profiles,
    load_profile,
    profile_as_dict,
    profile_as_toml,
    repository_profile_dir,
    user_profile_dir,
)
from specgen.core.settings import (
    KernelSpec,
    ModelSpec,
    Profile,
    ProposerSpec,
    RuntimeSpec,
    SamplingSpec,
    SpeculationSpec,
)

MODELS = {"target.path": '"org/target"', "draft.path": '"org/draft"'}


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch) -> Path:
    """An empty user profile folder, so the tests never see the real ~/.config."""
    folder = tmp_path / "user-profiles"
    folder.mkdir()
    monkeypatch.setenv("SPECGEN_PROFILE_DIR", str(folder))
    return folder


def write(folder: Path, text: str, name: str = "p.toml") -> str:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def toml_of(settings: dict[str, str | None]) -> str:
    """TOML text from dotted key -> TOML literal, with the models of MODELS unless set to None."""
    tables: dict[str, list[str]] = {}
    for key, literal in {**MODELS, **settings}.items():
        table, _, name = key.partition(".")
        if literal is not None:
            tables.setdefault(table, []).append(f"{name} = {literal}")
    return "".join(f"[{table}]\n" + "\n".join(lines) + "\n" for table, lines in tables.items())


def load_with(tmp_path: Path, settings: dict[str, str | None], overrides=None) -> Profile:
    return load_profile(write(tmp_path, toml_of(settings)), overrides)


# ---------------------------------------------------------------- defaults and tables


def test_missing_keys_take_the_dataclass_defaults(tmp_path):
    profile = load_with(tmp_path, {})
    assert profile.target == ModelSpec(path="org/target")
    assert profile.draft == ModelSpec(path="org/draft")
    assert profile.proposer == ProposerSpec()
    assert profile.speculation == SpeculationSpec()
    assert profile.sampling == SamplingSpec()
    assert profile.runtime == RuntimeSpec(threads=0, download=False)  # auto threads, no network
    assert profile.kernels == KernelSpec()
    assert profile.name == "p"  # the file name when the profile has no `name`


def test_every_key_of_every_table_is_read(tmp_path):
    text = """
name = "full"
description = "all keys"
[target]
path = "org/t"
revision = "v2"
dtype = "bfloat16"
device = "cuda:1"
device_map = "balanced"
trust_remote_code = true
max_memory = { "0" = "20GiB", "cuda:1" = "70GiB", cpu = 1000 }
[draft]
path = "org/d"
dtype = "float16"
device = "cpu"
[proposer]
kind = "ngram"
ngram_min = 2
ngram_max = 5
draft_p_min = 0.3
adaptive_k = true
[speculation]
k = 7
draft_sampling = "sample"
cuda_graphs = false
[sampling]
temperature = 0.8
top_k = 50
top_p = 0.9
min_p = 0.05
repetition_penalty = 1.1
presence_penalty = -0.5
frequency_penalty = 1.5
seed = 7
max_tokens = 300
min_tokens = 10
stop = ["\\n\\n", "END"]
stop_token_ids = [2, 3]
ignore_eos = true
logprobs = 5
logprobs_mode = "raw"
[runtime]
threads = 3
download = true
[kernels]
attention = "sdpa"
linear = "torch"
disable = ["rope", "round"]
"""
    path = write(tmp_path, text)
    assert load_profile(path) == Profile(
        name="full",
        source=path,
        target=ModelSpec("org/t", "v2", "bfloat16", "cuda:1", "balanced", True,
                             (("0", "20GiB"), ("1", "70GiB"), ("cpu", "1000"))),
        draft=ModelSpec("org/d", dtype="float16", device="cpu"),
        proposer=ProposerSpec("ngram", 2, 5, 0.3, True),
        speculation=SpeculationSpec(7, "sample", False),
        sampling=SamplingSpec(
            0.8, 50, 0.9, 0.05, 1.1, -0.5, 1.5, 7, 300, 10, ("\n\n", "END"), (2, 3), True, 5, "raw"
        ),
        runtime=RuntimeSpec(threads=3, download=True),
        kernels=KernelSpec("sdpa", "torch", disable=("rope", "round")),
    )


def test_int_is_accepted_for_float_and_a_stop_string_becomes_a_tuple(tmp_path):
    sampling = load_with(tmp_path, {"sampling.temperature": "1", "sampling.stop": '"###"'}).sampling
    assert sampling.temperature == 1.0 and isinstance(sampling.temperature, float)
    assert sampling.stop == ("###",)


def test_a_profile_without_draft_needs_another_proposer(tmp_path):
    profile = load_with(tmp_path, {"draft.path": None, "proposer.kind": '"ngram"'})
    assert profile.draft is None and profile.proposer.kind == "ngram"


# ---------------------------------------------------------------- built-in and example profiles


def test_builtin_demo_is_the_default():
    profile = load_profile()
    assert profile.name == "demo"
    assert profile.source == "<built-in>/demo.toml"
    assert (profile.speculation.k, profile.sampling.temperature) == (4, 0.0)
    assert profile.sampling.max_tokens == 64
    builtin = REPO / "src" / "specgen" / "builtin"
    assert profile.target.path == str(builtin / "demo" / "target")
    assert profile.draft.path == str(builtin / "demo" / "draft")
    assert load_profile("demo") == profile


EXAMPLES = sorted((REPO / "profiles").glob("*.toml"))


def test_the_documented_examples_exist():
    names = {path.name for path in EXAMPLES}
    assert {"llama-3.1-8b-instruct.toml", "qwen2.5-7b-instruct.toml", "qwen3-8b.toml", "gemma-2-9b-it.toml"} <= names
    assert "ngram-prompt-lookup.toml" in names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_every_example_profile_loads(path):
    profile = load_profile(str(path))
    assert profile.name == path.stem
    assert profile.target.path
    assert (profile.draft is not None) == (profile.proposer.kind == "draft")


# ---------------------------------------------------------------- lookup


def test_lookup_by_path(tmp_path):
    path = write(tmp_path, toml_of({"speculation.k": "9"}), name="mine")  # no .toml suffix
    assert load_profile(path).speculation.k == 9


def test_lookup_by_name_in_the_user_folder(user_dir):
    path = write(user_dir, toml_of({"speculation.k": "3"}), name="fast.toml")
    profile = load_profile("fast")
    assert (profile.name, profile.source, profile.speculation.k) == ("fast", path, 3)
    assert ("fast", path) in list_profiles()


def test_user_folder_falls_back_to_xdg_config_home(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECGEN_PROFILE_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert user_profile_dir() == tmp_path / "xdg" / "specgen" / "profiles"
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    assert user_profile_dir() == Path("~/.config/specgen/profiles").expanduser()


def test_a_builtin_name_wins_over_a_user_profile_of_that_name(user_dir):
    write(user_dir, toml_of({"speculation.k": "3"}), name="demo.toml")
    assert load_profile("demo").source == "<built-in>/demo.toml"
    sources = [source for name, source in list_profiles() if name == "demo"]
    assert sources == ["<built-in>/demo.toml"]


def test_the_checkout_finds_its_example_profiles_by_name(user_dir):
    """From the checkout (`pip install -e .`, or PYTHONPATH=src) `-p qwen2.5-7b-instruct` is
    profiles/qwen2.5-7b-instruct.toml; a user's profile of that name comes first."""
    assert repository_profile_dir() == REPO / "profiles"
    example = str(REPO / "profiles" / "qwen2.5-7b-instruct.toml")
    assert load_profile("qwen2.5-7b-instruct").source == example
    assert ("qwen2.5-7b-instruct", example) in list_profiles()
    assert "qwen2.5-7b-instruct" in runner.invoke(app, ["list"]).stdout
    mine = write(user_dir, toml_of({}), name="qwen2.5-7b-instruct.toml")
    assert load_profile("qwen2.5-7b-instruct").source == mine
    assert [source for name, source in list_profiles() if name == "qwen2.5-7b-instruct"] == [mine]


def test_an_installed_package_has_no_example_profiles(tmp_path, monkeypatch):
    (tmp_path / "profiles").mkdir()  # a folder of that name beside site-packages is not a checkout
    monkeypatch.setattr(profile_module, "_builtin_base", lambda: tmp_path / "site-packages" / "specgen" / "builtin")
    assert repository_profile_dir() is None


def test_missing_profile_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ProfileError, match=f"profile file {missing} not found"):
        load_profile(missing)


def test_unknown_name_lists_the_profiles_and_suggests_a_close_one(user_dir):
    write(user_dir, toml_of({}), name="llama.toml")
    with pytest.raises(ProfileError) as caught:
        load_profile("lamma")
    assert "unknown profile `lamma`" in caught.value.message
    assert "did you mean `llama`?" in caught.value.message
    assert "available: demo, llama" in caught.value.message
    assert str(user_dir) in caught.value.hint


# ---------------------------------------------------------------- malformed files and keys


def test_malformed_toml_names_file_line_and_column(tmp_path):
    path = write(tmp_path, '[target]\npath = "t"\n[sampling]\ntemperature = = 1\n')
    with pytest.raises(ProfileError, match=rf"^{path}:4:15: invalid TOML: Invalid value$"):
        load_profile(path)


def test_non_utf8_file_is_reported(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[target]\npath = "caf\xe9"\n')
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "[sampling]\ntemprature = 0.7\n",
            6,
            "unknown key `sampling.temprature`; did you mean `sampling.temperature`?",
        ),
        ("[sampling]\nk = 8\n", 6, "unknown key `sampling.k`; did you mean `speculation.k`?"),
        (
            "[sampling]\nwobble = 1\n",
            6,
            "unknown key `sampling.wobble`; [sampling] allows: temperature, top_k",
        ),
        ("[samplng]\ntemperature = 0.7\n", 5, "unknown table [samplng]; did you mean [sampling]?"),
        ("[wobble]\nx = 1\n", 5, "unknown table [wobble]; tables are [target], [draft]"),
        ("temperature = 1\n", 1, "unknown key `temperature`; did you mean `sampling.temperature`?"),
    ],
)
def test_unknown_keys_and_tables_are_named_with_a_suggestion(tmp_path, text, line, message):
    models = '[target]\npath = "t"\n[draft]\npath = "d"\n'
    # top-level keys must come before the first table
    path = write(tmp_path, text + models if line == 1 else models + text)
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    assert caught.value.message.startswith(f"{path}:{line}: {message}")


@pytest.mark.parametrize(
    ("key", "literal", "found", "expected"),
    [
        ("sampling.temperature", '"0.7"', "a string", "a finite number"),
        ("sampling.temperature", "nan", "a float", "a finite number"),
        ("speculation.k", "true", "a boolean", "an integer"),  # bool is not an int
        ("speculation.k", "4.0", "a float", "an integer"),
        ("sampling.seed", "1.5", "a float", "an integer"),
        ("sampling.logprobs", "false", "a boolean", "an integer"),
        ("sampling.top_k", "[1]", "an array", "an integer"),
        ("target.trust_remote_code", '"yes"', "a string", "true or false"),
        ("target.path", "3", "an integer", "a string"),
        ("draft.revision", "1", "an integer", "a string"),
        ("proposer.kind", "{ a = 1 }", "a table", "a string"),
        ("sampling.stop", "3", "an integer", "a string or an array of strings"),
        ("sampling.stop", '["a", 1]', "an array", "a string or an array of strings"),
        ("sampling.stop_token_ids", '"2"', "a string", "an array of integers"),
        ("sampling.stop_token_ids", "[true]", "an array", "an array of integers"),
    ],
)
def test_wrong_types_name_the_key_the_type_found_and_the_type_expected(
    tmp_path, key, literal, found, expected
):
    with pytest.raises(ProfileError) as caught:
        load_with(tmp_path, {key: literal})
    assert f"`{key} = " in caught.value.message
    assert caught.value.message.endswith(f" is {found}; expected {expected}")


def test_a_table_written_as_a_value_is_a_type_error(tmp_path):
    path = write(tmp_path, 'sampling = 3\n[target]\npath = "t"\n')
    expected = r":1: `sampling` must be a table \(\[sampling\]\), not an integer"
    with pytest.raises(ProfileError, match=expected):
        load_profile(path)


def test_top_level_name_must_be_a_string(tmp_path):
    path = write(tmp_path, 'name = 3\n[target]\npath = "t"\n')
    with pytest.raises(ProfileError, match="`name = 3` is an integer; expected a string"):
        load_profile(path)


# ---------------------------------------------------------------- range checks

OUT_OF_RANGE = [
    ("speculation.k", "0", "must be from 1 to 32"),
    ("speculation.k", "33", "must be from 1 to 32"),
    ("sampling.temperature", "-0.1", "must be from 0 (greedy) to 100"),
    ("sampling.temperature", "1e300", "must be from 0 (greedy) to 100"),
    ("sampling.top_p", "0", "must be in (0, 1]"),
    ("sampling.top_p", "1.01", "must be in (0, 1]"),
    ("sampling.top_k", "0", "must be -1 (off) or >= 1"),
    ("sampling.top_k", "-2", "must be -1 (off) or >= 1"),
    ("sampling.min_p", "-0.1", "must be in [0, 1]"),
    ("sampling.min_p", "1.5", "must be in [0, 1]"),
    ("sampling.repetition_penalty", "0", "must be from 0.01 to 100 (1 = off)"),
    ("sampling.repetition_penalty", "1e300", "must be from 0.01 to 100 (1 = off)"),
    ("sampling.repetition_penalty", "1e-300", "must be from 0.01 to 100 (1 = off)"),
    ("sampling.presence_penalty", "-2.5", "must be in [-2, 2]"),
    ("sampling.presence_penalty", "2.5", "must be in [-2, 2]"),
    ("sampling.frequency_penalty", "-3", "must be in [-2, 2]"),
    ("sampling.frequency_penalty", "2.1", "must be in [-2, 2]"),
    ("sampling.max_tokens", "0", "must be >= 1"),
    ("sampling.min_tokens", "-1", "must be >= 0"),
    ("sampling.logprobs", "-1", "must be from 0 to 20"),
    ("sampling.logprobs", "21", "must be from 0 to 20"),
    ("sampling.logprobs_mode", '"processed"', "must be one of warped, raw"),
    ("sampling.seed", "-1", "must be from 0 to 2**64 - 1"),
    ("sampling.seed", "18446744073709551616", "must be from 0 to 2**64 - 1"),
    ("target.device_map", '"bogus"', "must be auto, balanced, balanced_low_0, sequential, cpu, cuda"),
    ("draft.device_map", '"cuda:"', "must be auto, balanced, balanced_low_0, sequential, cpu, cuda"),
    ("sampling.stop", '["a", ""]', "must not contain an empty string"),
    ("sampling.stop_token_ids", "[-1]", "must be token ids >= 0"),
    ("target.dtype", '"fp16"', "must be one of auto, float32, float16, bfloat16"),
    ("draft.dtype", '"int8"', "must be one of auto, float32, float16, bfloat16"),
    ("target.device", '"gpu"', "must be auto, cpu, cuda or cuda:N"),
    ("draft.device", '"cuda:x"', "must be auto, cpu, cuda or cuda:N"),
    ("target.path", '""', "must not be empty"),
    ("proposer.kind", '"medusa"', "must be one of draft, ngram, hybrid, eagle, mtp, none"),
    ("proposer.ngram_min", "0", "must be >= 1"),
    ("proposer.ngram_max", "33", "must be <= 32"),
    ("proposer.draft_p_min", "1.0", "must be in [0, 1)"),
    ("proposer.draft_p_min", "-0.1", "must be in [0, 1)"),
    ("speculation.draft_sampling", '"greedy"', "must be one of auto, argmax, sample, temperature"),
    ("speculation.pipeline", '"two"', "must be one of auto, on, off"),
    ("speculation.hybrid_merge", '"sometimes"', "must be one of never, always, auto"),
    ("speculation.tree_width", "0", "must be auto or from 1 (a chain) to 8"),
    ("speculation.tree_width", "9", "must be auto or from 1 (a chain) to 8"),
    ("speculation.tree_width", '"wide"', "must be auto or from 1 (a chain) to 8"),
    ("speculation.tree_nodes", "64", "must be auto or from 0 (= k) to 63"),
    ("speculation.tree_nodes", '"Auto"', "must be auto or from 0 (= k) to 63"),
    ("runtime.threads", "-1", "must be from 0 (auto) to 1024"),
    ("kernels.attention", '"flash"', "must be one of auto, kernel, sdpa"),
    ("kernels.linear", '"cublas"', "must be one of auto, kernel, torch"),
    ("kernels.disable", '["rope", "fused"]', "names fusions among rope, norm, head, step_io"),
]


def test_kernel_settings_are_validated_with_file_and_line(tmp_path):
    """[kernels] takes the same line-precise checks as every table: a bad value, a wrong type and an
    unknown key each name the file and the line, and the CLI exits 2 on them."""
    models = '[target]\npath = "t"\n[draft]\npath = "d"\n'
    cases = [
        ('[kernels]\nlinear = "kernel"\nattention = "flash"\n', 7, "`kernels.attention = \"flash\"` is not allowed"),
        ("[kernels]\nattention = true\n", 6, "`kernels.attention = true` is a boolean; expected a string"),
        ('[kernels]\ndisabled = ["rope"]\n', 6, "unknown key `kernels.disabled`; did you mean `kernels.disable`?"),
        ('[kernels]\ndisable = ["rope", "warp"]\n', 6, '`kernels.disable = ["rope", "warp"]` is not allowed: names'),
        ('[kernels]\nrope = "model"\n', 6, '`kernels.rope`: was replaced by `disable = ["rope"]` in [kernels]'),
        ('[kernels]\nwarp = "torch"\n', 6, '`kernels.warp`: was replaced by `disable = ["round"]` in [kernels]'),
    ]
    for text, line, message in cases:
        path = write(tmp_path, models + text)
        with pytest.raises(ProfileError) as caught:
            load_profile(path)
        assert caught.value.message.startswith(f"{path}:{line}: {message}"), caught.value.message
    assert ProfileError.exit_code == 2


@pytest.mark.parametrize(("key", "literal", "allowed"), OUT_OF_RANGE)
def test_out_of_range_values_say_what_is_allowed(tmp_path, key, literal, allowed):
    with pytest.raises(ProfileError) as caught:
        load_with(tmp_path, {key: literal})
    assert f"`{key} = " in caught.value.message
    assert f" is not allowed: {allowed}" in caught.value.message


@pytest.mark.parametrize(
    ("key", "literal"),
    [
        ("speculation.k", "1"),
        ("speculation.k", "32"),
        ("sampling.temperature", "0"),
        ("sampling.top_p", "1"),
        ("sampling.top_k", "-1"),
        ("sampling.top_k", "1"),
        ("sampling.min_p", "1"),
        ("sampling.presence_penalty", "-2"),
        ("sampling.frequency_penalty", "2"),
        ("sampling.logprobs", "0"),
        ("sampling.logprobs", "20"),
        ("sampling.logprobs_mode", '"warped"'),
        ("sampling.logprobs_mode", '"raw"'),
        ("sampling.seed", "0"),
        ("sampling.seed", "18446744073709551615"),
        ("target.device_map", '"balanced_low_0"'),
        ("draft.device_map", '"cuda:1"'),
        ("sampling.max_tokens", "1"),
        ("target.device", '"cuda:3"'),
        ("draft.device", '"cuda"'),
        ("proposer.kind", '"none"'),
        ("proposer.ngram_max", "32"),
        ("proposer.draft_p_min", "0.99"),
        ("runtime.threads", "0"),
        ("runtime.threads", "1"),
        ("kernels.attention", '"kernel"'),
        ("kernels.disable", '["rope", "norm", "head", "step_io", "dependent_launch", "split_k", "round"]'),
    ],
)
def test_boundary_values_are_accepted(tmp_path, key, literal):
    profile = load_with(tmp_path, {key: literal})
    table, _, name = key.partition(".")
    value = json.loads(literal)
    assert getattr(getattr(profile, table), name) == (tuple(value) if isinstance(value, list) else value)


def test_a_bad_device_map_names_file_and_line(tmp_path):
    path = write(tmp_path, '[target]\npath = "t"\ndevice_map = "bogus"\n[proposer]\nkind = "none"\n')
    with pytest.raises(ProfileError, match=rf"^{path}:3: `target.device_map = \"bogus\"` is not allowed"):
        load_profile(path)


def test_min_tokens_must_not_exceed_max_tokens(tmp_path):
    expected = r"`sampling.min_tokens` \(9\) must be <= `sampling.max_tokens` \(8\)"
    with pytest.raises(ProfileError, match=expected):
        load_with(tmp_path, {"sampling.min_tokens": "9", "sampling.max_tokens": "8"})
    equal = load_with(tmp_path, {"sampling.min_tokens": "8", "sampling.max_tokens": "8"})
    assert equal.sampling.min_tokens == 8


def test_ngram_max_must_not_be_below_ngram_min(tmp_path):
    expected = r"`proposer.ngram_max` \(2\) must be >= `proposer.ngram_min` \(3\)"
    with pytest.raises(ProfileError, match=expected):
        load_with(tmp_path, {"proposer.ngram_min": "3", "proposer.ngram_max": "2"})


def test_tree_nodes_must_fit_the_tree_envelope(tmp_path):
    """k = 3, width 2: the root's 2 children and 2 * 2 more per later level, 10 nodes at most; at
    least k, and with width 1 the chain's k."""
    expected = r"`speculation.tree_nodes` \(11\) must be 0 \(= k\) or from `speculation.k` \(3\) to 10"
    with pytest.raises(ProfileError, match=expected):
        load_with(tmp_path, {"speculation.k": "3", "speculation.tree_width": "2", "speculation.tree_nodes": "11"})
    with pytest.raises(ProfileError, match=r"from `speculation.k` \(3\) to 3, .* width 1"):
        load_with(tmp_path, {"speculation.k": "3", "speculation.tree_nodes": "4"})
    with pytest.raises(UsageError, match=r"--tree-nodes \(2\) must be 0"):
        load_with(tmp_path, {"speculation.k": "3", "speculation.tree_width": "2"}, {"speculation.tree_nodes": 2})
    tree = load_with(tmp_path, {"speculation.k": "3", "speculation.tree_width": "2", "speculation.tree_nodes": "10"})
    assert (tree.speculation.nodes, load_with(tmp_path, {"speculation.k": "3"}).speculation.nodes) == (10, 3)


def test_tree_shape_auto_is_validated_and_one_line_errors_name_the_key(tmp_path):
    """tree_width / tree_nodes take auto (a profile's string, the command line's word); anything
    else is one line naming the key (its file and line, or its option). With tree_width auto a
    node budget must fit the widest tree auto may choose."""
    both = load_with(tmp_path, {"speculation.tree_width": '"auto"', "speculation.tree_nodes": '"auto"'})
    assert (both.speculation.tree_width, both.speculation.tree_nodes, both.speculation.auto_tree) == ("auto", "auto", True)
    cli = load_with(tmp_path, {}, {"speculation.tree_width": "auto", "speculation.tree_nodes": "12"})
    assert (cli.speculation.tree_width, cli.speculation.tree_nodes) == ("auto", 12)
    assert not load_with(tmp_path, {}).speculation.auto_tree
    for overrides, option in (({"speculation.tree_width": "-1"}, "--tree-width -1"),
                              ({"speculation.tree_nodes": "many"}, "--tree-nodes many")):
        with pytest.raises(UsageError) as caught:
            load_with(tmp_path, {}, overrides)
        assert "\n" not in caught.value.message and caught.value.message.startswith(f"{option} is not allowed")
    with pytest.raises(ProfileError) as caught:
        load_with(tmp_path, {"speculation.tree_width": "true"})
    assert "\n" not in str(caught.value) and "`speculation.tree_width = true` is a boolean" in str(caught.value)
    with pytest.raises(UsageError, match=r"--tree-nodes \(2\) must be 0 \(= k\) or from --k \(4\) to 63, .*"
                                         r"holds at the widest width auto may choose \(8\)"):
        load_with(tmp_path, {"speculation.k": "4"}, {"speculation.tree_width": "auto", "speculation.tree_nodes": "2"})


def test_draft_proposer_without_draft_says_how_to_fix_it(tmp_path):
    with pytest.raises(ProfileError) as caught:
        load_with(tmp_path, {"draft.path": None})
    assert "add a [draft] table" in caught.value.message
    assert "--proposer ngram" in caught.value.message


def test_draft_table_without_path_is_an_error(tmp_path):
    path = write(tmp_path, '[target]\npath = "t"\n[draft]\ndtype = "float16"\n')
    with pytest.raises(ProfileError, match=r":3: \[draft\] has no `path`"):
        load_profile(path)


def test_missing_target_is_an_error(tmp_path):
    path = write(tmp_path, '[proposer]\nkind = "none"\n')
    expected = r"no \[target\]: add a \[target\] table .* or pass --target PATH"
    with pytest.raises(ProfileError, match=expected):
        load_profile(path)


# ---------------------------------------------------------------- overrides


def test_threads_option_overrides_the_runtime_table(tmp_path):
    assert load_with(tmp_path, {"runtime.threads": "4"}, {"runtime.threads": 1}).runtime.threads == 1
    with pytest.raises(UsageError, match="--threads -2 is not allowed"):
        load_with(tmp_path, {}, {"runtime.threads": -2})


def test_overrides_win_over_the_file_and_none_means_not_given(tmp_path):
    settings = {"speculation.k": "4", "sampling.temperature": "0.5", "sampling.stop": '"x"'}
    overrides = {"speculation.k": 8, "sampling.temperature": None, "sampling.stop": ["a", "b"]}
    profile = load_with(tmp_path, settings, overrides)
    assert profile.speculation.k == 8
    assert profile.sampling.temperature == 0.5
    assert profile.sampling.stop == ("a", "b")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("speculation.k", 0, "--k 0 is not allowed: must be from 1 to 32"),
        ("sampling.logprobs_mode", "logits", "--logprobs-mode logits is not allowed: must be one of warped, raw"),
        ("sampling.seed", 2**64, f"--seed {2**64} is not allowed: must be from 0 to 2**64 - 1"),
        ("sampling.top_p", 0, "--top-p 0 is not allowed: must be in (0, 1]"),
        ("sampling.min_p", 2.0, "--min-p 2.0 is not allowed: must be in [0, 1]"),
        ("sampling.temperature", "hot", "--temperature hot is a string; expected a finite number"),
        ("proposer.kind", "medusa", "--proposer medusa is not allowed: must be one of draft, ngram"),
        ("target.path", "", "--target  is not allowed: must not be empty"),
        ("sampling.stop_token_ids", [-3], "--stop-token-id [-3] is not allowed: must be token"),
        ("sampling.temprature", 1.0, "unknown key `sampling.temprature`; did you mean `sampling.tem"),
    ],
)
def test_bad_overrides_are_usage_errors_naming_the_option(tmp_path, key, value, message):
    with pytest.raises(UsageError) as caught:
        load_with(tmp_path, {}, {key: value})
    assert not isinstance(caught.value, ProfileError)
    assert caught.value.message.startswith(message)


def test_cross_checks_blame_the_option_when_an_override_is_involved(tmp_path):
    with pytest.raises(UsageError, match=r"--min-tokens \(5\) must be <= --max-tokens \(4\)"):
        load_with(tmp_path, {"sampling.min_tokens": "5"}, {"sampling.max_tokens": 4})
    with pytest.raises(UsageError, match="--proposer ngram"):
        draftless = {"draft.path": None, "proposer.kind": '"ngram"'}
        load_with(tmp_path, draftless, {"proposer.kind": "draft"})


def test_proposer_override_makes_a_draftless_profile_valid(tmp_path):
    profile = load_with(tmp_path, {"draft.path": None}, {"proposer.kind": "ngram"})
    assert profile.proposer.kind == "ngram" and profile.draft is None


def test_draft_override_creates_a_draft_with_defaults(tmp_path):
    profile = load_with(tmp_path, {"draft.path": None}, {"draft.path": "org/small"})
    assert profile.draft == ModelSpec(path="org/small")


def test_draft_options_without_a_draft_model_set_only_the_target(tmp_path):
    # cli/options.py sends --dtype to both target.dtype and draft.dtype.
    settings = {"draft.path": None, "proposer.kind": '"ngram"'}
    profile = load_with(tmp_path, settings, {"target.dtype": "float16", "draft.dtype": "float16"})
    assert profile.draft is None and profile.target.dtype == "float16"
    with pytest.raises(UsageError, match="--dtype fp8 is not allowed"):
        load_with(tmp_path, settings, {"draft.dtype": "fp8"})


def test_a_draft_table_from_the_file_gets_draft_options(tmp_path):
    profile = load_with(tmp_path, {}, {"target.device": "cpu", "draft.device": "cpu"})
    assert (profile.target.device, profile.draft.device) == ("cpu", "cpu")


def test_target_override_replaces_a_missing_target(tmp_path):
    path = write(tmp_path, '[proposer]\nkind = "none"\n')
    assert load_profile(path, {"target.path": "org/t"}).target.path == "org/t"


# ---------------------------------------------------------------- model paths


def test_model_paths_resolve_against_the_profile_folder(tmp_path):
    (tmp_path / "models" / "draft").mkdir(parents=True)
    settings = {"target.path": '"./models/target"', "draft.path": '"models/draft"'}
    profile = load_with(tmp_path, settings)
    # ./ resolves even when the folder is missing; a bare name resolves because it exists.
    assert profile.target.path == str(tmp_path / "models" / "target")
    assert profile.draft.path == str(tmp_path / "models" / "draft")


def test_parent_relative_absolute_and_home_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = {"target.path": '"../shared/target"', "draft.path": '"~/models/draft"'}
    folder = tmp_path / "profiles"
    folder.mkdir()
    profile = load_profile(write(folder, toml_of(settings)))
    assert profile.target.path == str(tmp_path / "shared" / "target")
    assert profile.draft.path == str(tmp_path / "home" / "models" / "draft")
    absolute = str(tmp_path / "elsewhere")
    assert load_with(tmp_path, {"target.path": json.dumps(absolute)}).target.path == absolute


def test_a_path_that_is_not_a_folder_stays_a_hub_id(tmp_path):
    assert load_with(tmp_path, {"target.path": '"meta-llama/Llama-3.1-8B"'}).target.path == (
        "meta-llama/Llama-3.1-8B"
    )


def test_command_line_paths_are_not_resolved_against_the_profile(tmp_path):
    (tmp_path / "models").mkdir()
    profile = load_with(tmp_path, {}, {"target.path": "models", "draft.path": "./d"})
    assert (profile.target.path, profile.draft.path) == ("models", "./d")


# ---------------------------------------------------------------- dict and TOML views


def test_profile_as_dict_is_plain_and_json_ready(tmp_path):
    profile = load_with(tmp_path, {"sampling.stop": '["a"]', "sampling.seed": "3"})
    data = profile_as_dict(profile)
    assert data["speculation"]["k"] == profile.speculation.k
    assert data["sampling"]["seed"] == 3
    assert json.loads(json.dumps(data))["sampling"]["stop"] == ["a"]
    rebuilt = Profile(
        name=data["name"],
        source=data["source"],
        target=ModelSpec(**data["target"]),
        draft=ModelSpec(**data["draft"]),
        proposer=ProposerSpec(**data["proposer"]),
        speculation=SpeculationSpec(**data["speculation"]),
        sampling=SamplingSpec(**data["sampling"]),
        runtime=RuntimeSpec(**data["runtime"]),
        kernels=KernelSpec(**data["kernels"]),
    )
    assert rebuilt == profile


@pytest.mark.parametrize("path", [*EXAMPLES, None], ids=lambda path: path and path.name or "demo")
def test_profile_as_toml_loads_back_to_the_same_settings(tmp_path, path):
    profile = load_profile(path and str(path))
    copy = write(tmp_path, profile_as_toml(profile), name="copy.toml")
    assert load_profile(copy) == Profile(**{**vars(profile), "source": copy})


def test_profile_as_toml_escapes_awkward_strings(tmp_path):
    stop = ["\n", '"quoted"', "back\\slash", "\x7f", "日本"]
    profile = load_with(tmp_path, {"sampling.stop": json.dumps(stop)})
    copy = write(tmp_path, profile_as_toml(profile), name="copy.toml")
    assert load_profile(copy).sampling.stop == tuple(stop)


# ---------------------------------------------------------------- `specgen profiles`

runner = CliRunner()


def test_profiles_list_shows_builtin_and_user_profiles(user_dir):
    write(user_dir, toml_of({"draft.path": None, "proposer.kind": '"ngram"'}), name="lookup.toml")
    write(user_dir, "[sampling]\n", name="broken.toml")
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "<built-in>/demo.toml" in rows["demo"] and "demo/draft" in rows["demo"]
    assert "org/target" in rows["lookup"] and "(ngram)" in rows["lookup"]
    assert "invalid: " in rows["broken"] and "no [target]" in rows["broken"]
    assert "\x1b" not in result.stdout  # no colors or styles in a pipe


def test_profiles_show_prints_a_loadable_profile(tmp_path):
    result = runner.invoke(app, ["show", "demo"])
    assert result.exit_code == 0, result.output
    assert "[speculation]\nk = 4\n" in result.stdout
    assert 'name = "demo"' in result.stdout
    copy = write(tmp_path, result.stdout, name="copy.toml")
    assert load_profile(copy).sampling == load_profile("demo").sampling


def test_profiles_show_json_parses(tmp_path):
    path = write(tmp_path, toml_of({"sampling.stop": '"END"'}))
    result = runner.invoke(app, ["show", path, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(json.dumps(profile_as_dict(load_profile(path))))
    assert data["sampling"]["stop"] == ["END"] and data["source"] == path


def test_profiles_show_lets_profile_errors_reach_the_error_table():
    result = runner.invoke(app, ["show", "dmo"])
    assert isinstance(result.exception, ProfileError)
    assert result.stdout == ""


def test_profiles_cli_does_not_import_torch():
    code = "import sys, specgen.cli.profiles; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


@pytest.mark.parametrize("literal, message", [
    ('{ gpu0 = "20GiB" }', 'devices are GPU indices ("0", "1") or cpu'),
    ('{ "0" = "lots" }', 'sizes like "70GiB"'),
    ('{ "0" = 1.5 }', "expected a table of sizes by device"),
    ('"20GiB"', "expected a table of sizes by device"),
])
def test_a_bad_max_memory_says_what_is_allowed(tmp_path, literal, message):
    path = write(tmp_path, f'[target]\npath = "t"\ndevice_map = "auto"\nmax_memory = {literal}\n[proposer]\nkind = "none"\n')
    with pytest.raises(ProfileError, match=rf"^{path}:4: .*{re.escape(message)}"):
        load_profile(path)


def test_max_memory_needs_a_device_map_that_reads_it(tmp_path):
    for device_map in ("", 'device_map = "cuda:1"\n'):
        path = write(tmp_path, f'[target]\npath = "t"\n{device_map}max_memory = {{ "0" = "20GiB" }}\n'
                               '[proposer]\nkind = "none"\n')
        with pytest.raises(ProfileError, match=r"`target.max_memory` needs a device_map that places the model by it"):
            load_profile(path)


def test_max_memory_survives_the_round_trip_through_toml(tmp_path):
    path = write(tmp_path, '[target]\npath = "t"\ndevice_map = "balanced"\nmax_memory = { "1" = "70GiB", cpu = "1GB" }\n'
                           '[proposer]\nkind = "none"\n')
    profile = load_profile(path)
    assert profile.target.max_memory == (("1", "70GiB"), ("cpu", "1GB"))
    again = write(tmp_path, profile_as_toml(profile).replace('path = "t"', f'path = "{profile.target.path}"'))
    assert load_profile(again).target == profile.target
