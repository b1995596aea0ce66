"""Every known failure of `specgen generate` ends the same way: the documented exit code, nothing on
stdout, one line on stderr (two with a hint), never a traceback. docs/errors.md lists them.

Profile errors are tested in detail in tests/core/test_profile.py; here each kind goes once through the CLI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cli_helpers import assert_error, specgen, subprocess_env
from specgen.core.errors import ProfileError
from tiny_models import build_pair, build_tokenizer, write_profile

MODELS = '[target]\npath = "org/target"\n[draft]\npath = "org/draft"\n'  # lines 1-4; never loaded


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    target, draft = build_pair(root)
    profile = write_profile(root / "tiny.toml", target, draft, sampling={"max_tokens": 8, "ignore_eos": True})
    return SimpleNamespace(root=root, target=target, draft=draft, profile=profile)


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_PROFILE_DIR", str(tmp_path / "user-profiles"))


def run(monkeypatch, tiny, *args, **kwargs):
    return specgen(monkeypatch, "generate", "-p", tiny.profile, *args, **kwargs)


# ---------------------------------------------------------------- profiles (exit 2)


def test_missing_profile_file(monkeypatch, tmp_path):
    result = specgen(monkeypatch, "generate", "-p", tmp_path / "nope.toml", "hi")
    assert_error(result, 2, "nope.toml not found")


def test_unknown_profile_name_suggests_a_close_one(monkeypatch):
    assert_error(specgen(monkeypatch, "generate", "-p", "dmo", "hi"), 2, "unknown profile `dmo`", "`demo`", "hint: ")


def test_unreadable_profile_file(monkeypatch, tmp_path):
    # Simulated: the tests may run as root, for whom chmod 000 does not stop a read.
    path = tmp_path / "locked.toml"
    path.write_text(MODELS)
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert_error(specgen(monkeypatch, "generate", "-p", path, "hi"), 2, "cannot read profile file", "Permission denied")


@pytest.mark.parametrize("text, fragments", [
    pytest.param(MODELS + "[sampling\nk = 1\n", (":5:10: invalid TOML",), id="malformed TOML: line and column"),
    pytest.param(MODELS + "[sampling]\ntemprature = 0.5\n", (":6:", "`sampling.temperature`"), id="unknown key"),
    pytest.param(MODELS + "[sampler]\n", (":5:", "unknown table [sampler]"), id="unknown table"),
    pytest.param(MODELS + '[speculation]\nk = "four"\n', (":6:", "is a string; expected an integer"),
                 id="wrong type"),
    pytest.param(MODELS + "[speculation]\nk = 40\n", (":6:", "`speculation.k = 40`", "from 1 to 32"),
                 id="out of range in the file"),
])
def test_profile_file_errors(monkeypatch, tmp_path, text, fragments):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert_error(specgen(monkeypatch, "generate", "-p", path, "hi"), 2, str(path), *fragments)


def test_profile_with_a_byte_order_mark(monkeypatch, tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + (MODELS + "[sampling]\ntemprature = 0.5\n").encode())
    assert_error(specgen(monkeypatch, "generate", "-p", path, "hi"), 2, f"{path}:6:", "`sampling.temperature`")


def test_profile_path_that_is_a_directory(monkeypatch, tmp_path):
    assert_error(specgen(monkeypatch, "generate", "-p", tmp_path, "hi"), 2, f"profile {tmp_path} is a directory")


@pytest.mark.parametrize("options, allowed", [
    (["--k", "0"], "from 1 to 32"),
    (["--k", "33"], "from 1 to 32"),
    (["--temperature=-0.5"], "from 0 (greedy) to 100"),
    (["-t", "1e300"], "from 0 (greedy) to 100"),
    (["--repetition-penalty", "1e300"], "from 0.01 to 100"),
    (["--top-p", "0"], "(0, 1]"),
    (["--top-p", "1.5"], "(0, 1]"),
    (["--top-k=-2"], "-1 (off) or >= 1"),
    (["--top-k", "0"], "-1 (off) or >= 1"),
    (["--min-p=-0.1"], "[0, 1]"),
    (["--min-p", "1.5"], "[0, 1]"),
    (["--max-tokens", "0"], ">= 1"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_out_of_range_options(monkeypatch, tiny, options, allowed):
    option = {"-t": "--temperature"}.get(options[0], options[0].split("=")[0])
    assert_error(run(monkeypatch, tiny, *options, "hi"), 2, f"{option} ", "is not allowed", allowed)


def test_min_tokens_above_max_tokens(monkeypatch, tiny):
    result = run(monkeypatch, tiny, "--min-tokens", "10", "--max-tokens", "5", "hi")
    assert_error(result, 2, "--min-tokens (10) must be <= --max-tokens (5)")


# ---------------------------------------------------------------- command-line usage (exit 2)


@pytest.mark.parametrize("args, fragments", [
    (["generate", "--bogus", "hi"], ("No such option: --bogus", "hint: see `specgen generate --help`")),
    (["generate", "--k", "abc", "hi"], ("Invalid value for '--k'", "hint: see `specgen generate --help`")),
    (["generate", "--format", "xml", "hi"], ("Invalid value for '--format'",)),
    (["profiles", "show"], ("Missing argument", "hint: see `specgen profiles show --help`")),
    (["generat", "hi"], ("No such command",)),
], ids=["unknown option", "bad int", "bad choice", "missing argument", "unknown command"])
def test_click_usage_errors(monkeypatch, args, fragments):
    assert_error(specgen(monkeypatch, *args), 2, *fragments)


@pytest.mark.parametrize("command, fragment, hint", [
    ("generate", "the prompt is the positional argument", "hint: specgen generate 'def quicksort(arr):'"),
    ("bench", "specgen bench reads prompts from --prompts-file", "hint: give -p a profile name"),
])
def test_a_prompt_given_to_p_is_named_as_such(monkeypatch, command, fragment, hint):
    """llama.cpp's -p is its prompt; specgen's is --profile. Said before a terminal's stdin would be
    waited for as the prompt."""
    result = specgen(monkeypatch, command, "-p", "def quicksort(arr):", tty=True)
    assert_error(result, 2, "`def quicksort(arr):` was taken as a profile name (-p is --profile in specgen), and no "
                 "profile has it; " + fragment, hint)


@pytest.mark.parametrize("alias, value, meant", [
    ("--temp", "500", "--temperature 500.0 is not allowed"),
    ("--n-predict", "0", "--max-tokens 0 is not allowed"),
    ("--max-new-tokens", "0", "--max-tokens 0 is not allowed"),
    ("--num-speculative-tokens", "40", "--k 40 is not allowed"),
])
def test_other_tools_spellings_of_the_same_option_are_accepted(monkeypatch, alias, value, meant):
    """Read as specgen's own option: its checks name it (docs/cli.md, "Other tools' spellings")."""
    assert_error(specgen(monkeypatch, "generate", alias, value, "hi"), 2, meant)


def test_an_accepted_spelling_runs_as_the_option_it_stands_for(monkeypatch, tiny):
    spelled = run(monkeypatch, tiny, "--temp", "0.7", "--seed", "3", "--n-predict", "5", "--format", "json", "-q", "hi")
    own = run(monkeypatch, tiny, "--temperature", "0.7", "--seed", "3", "-n", "5", "--format", "json", "-q", "hi")
    assert spelled.code == own.code == 0 and len(json.loads(spelled.stdout)["token_ids"]) == 5
    assert json.loads(spelled.stdout)["token_ids"] == json.loads(own.stdout)["token_ids"]
    assert_error(specgen(monkeypatch, "train-head", "--temp", "1"), 2, "No such option: --temp")  # it has no -t


@pytest.mark.parametrize("args, hint", [
    (["generate", "--model", "m", "hi"], "specgen runs two models: --target (whose output you get) and --draft"),
    (["generate", "-m", "m", "hi"], "specgen runs two models: --target (whose output you get) and --draft"),
    (["generate", "--model-draft", "m", "hi"], "the draft model is --draft"),
    (["generate", "--prompt", "hi"], 'the prompt is the positional argument: specgen generate "TEXT"'),
    (["bench", "--prompt", "hi"], "give the prompts in a file: --prompts-file FILE"),
    (["generate", "--repeat-penalty", "1.1", "hi"], "use --repetition-penalty (vLLM's"),
    (["generate", "--draft-max", "4", "hi"], "the draft tokens per round are --k"),
    (["bench", "--speculative-config", "{}"], "specgen takes --draft (or --proposer"),
    (["generate", "-s", "1", "hi"], "the seed is --seed"),
], ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None)
def test_other_tools_spellings_that_differ_say_what_to_write(monkeypatch, args, hint):
    result = specgen(monkeypatch, *args)
    assert_error(result, 2, f"No such option: {args[1]}", f"hint: {hint}")
    assert "Possible options" not in result.stderr


def test_bare_specgen_shows_the_usage_and_exits_2(monkeypatch):
    result = specgen(monkeypatch)
    assert result.code == 2
    assert "Usage" in result.stdout + result.stderr and "error" not in result.stderr


# ---------------------------------------------------------------- prompts (exit 2)


@pytest.mark.parametrize("args, stdin", [
    (["hi", "--prompts-file", "p.txt"], b""),
    (["--format", "jsonl", "hi"], b""),
], ids=["prompt and --prompts-file", "jsonl without --prompts-file"])
def test_conflicting_prompt_options(monkeypatch, tiny, args, stdin):
    assert_error(run(monkeypatch, tiny, *args, stdin=stdin), 2)


@pytest.mark.parametrize("args, stdin", [
    ([""], b""), (["  \n "], b""), (["-"], b""), ([], b"\n\n"),
], ids=["empty argument", "blank argument", "empty stdin with -", "blank piped stdin"])
def test_empty_prompt(monkeypatch, tiny, args, stdin):
    assert_error(run(monkeypatch, tiny, *args, stdin=stdin), 2, "the prompt is empty", "hint: ")


def test_non_utf8_stdin(monkeypatch, tiny):
    result = run(monkeypatch, tiny, "-", stdin="café".encode("latin-1"))
    assert_error(result, 2, "stdin is not valid UTF-8 (byte 0xe9 at offset 3)", "hint: ")


def test_prompts_file_errors(monkeypatch, tiny, tmp_path):
    assert_error(run(monkeypatch, tiny, "--prompts-file", tmp_path / "none.jsonl"), 2, "cannot read prompts file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    assert_error(run(monkeypatch, tiny, "--prompts-file", bad, "--format", "jsonl"), 2, f"{bad}:2: invalid JSON")
    no_field = tmp_path / "nofield.jsonl"
    no_field.write_text('{"text": "a"}\n')
    assert_error(run(monkeypatch, tiny, "--prompts-file", no_field), 2, "needs a string field 'prompt'")


def test_an_empty_prompt_of_a_file_is_reported_at_its_own_line(monkeypatch, tiny, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text('{"prompt": "a"}\n\n\n{"prompt": ""}\n')
    assert_error(run(monkeypatch, tiny, "--prompts-file", source), 2, f"the prompt is empty (line 4 of {source})")


def test_prompts_files_split_on_newlines_only(tmp_path):
    """A form feed, U+0085, U+2028 or U+2029 is part of a prompt (json.dumps writes the last three raw)."""
    from specgen.cli.prompts import Prompt, read_file

    source = tmp_path / "prompts.txt"
    source.write_text('page\x0cbreak\r\n{"prompt": "a\u2028b\u2029c\x85d"}\n\nlast', encoding="utf-8")
    assert read_file(source) == [Prompt("page\x0cbreak", f"{source}:1"), Prompt("a\u2028b\u2029c\x85d", f"{source}:2"),
                                 Prompt("last", f"{source}:4")]


def test_stdin_is_bounded(monkeypatch, tiny):
    from specgen.cli.prompts import STDIN_LIMIT

    result = run(monkeypatch, tiny, "-", stdin=b"0" * (STDIN_LIMIT + 1))
    assert_error(result, 2, f"stdin holds more than {STDIN_LIMIT // 2**20} MiB", "hint: ")


LONG_PROMPT = " ".join(str(i) for i in range(600))  # well over the tiny models' 512 positions


def test_prompt_longer_than_the_context_left(monkeypatch, tiny):
    result = run(monkeypatch, tiny, LONG_PROMPT)
    assert_error(result, 2, "tokens but only 499 fit with max_tokens=8 in the model's 512-token context",
                 "hint: shorten the prompt to 499 tokens or pass --truncate-prompt")


def test_a_long_prompt_in_a_prompts_file_stops_before_anything_runs_or_is_skipped(monkeypatch, tiny, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f():", LONG_PROMPT, "import os"]))
    result = run(monkeypatch, tiny, "--prompts-file", source, "--format", "jsonl")
    assert_error(result, 2, f"{source}:2: the prompt has ", "--truncate-prompt", "--skip-long-prompts")
    skipped = run(monkeypatch, tiny, "--prompts-file", source, "--format", "jsonl", "--skip-long-prompts")
    assert skipped.code == 0
    assert [r["prompt"] for r in skipped.json_lines()] == ["def f():", "import os"]
    warning, *summaries = skipped.stderr.splitlines()
    assert warning.startswith(f"specgen: warning: skipped {source}:2: the prompt has ") and len(summaries) == 2


def test_truncate_prompt_keeps_the_end(monkeypatch, tiny):
    result = run(monkeypatch, tiny, "--truncate-prompt", "--quiet", LONG_PROMPT)
    assert result.code == 0 and result.stderr == ""
    from specgen.core.engine import Engine
    from specgen.core.profile import load_profile

    engine = Engine(load_profile(str(tiny.profile)))
    *_, finished = engine.decoder().run(engine.encode(LONG_PROMPT)[-499:])  # the prompt's last 499 tokens
    assert result.stdout == finished.text + "\n"


def test_max_tokens_that_leave_no_room_for_a_prompt(monkeypatch, tiny):
    result = run(monkeypatch, tiny, "--max-tokens", "600", "--truncate-prompt", "hi")
    assert_error(result, 2, "max_tokens=600 leaves no room for a prompt", "hint: lower --max-tokens to at most 506")


# ---------------------------------------------------------------- checkpoints (exit 1)


def copy_checkpoint(source: Path, dest: Path, *patterns: str) -> Path:
    dest.mkdir()
    for pattern in patterns:
        for path in source.glob(pattern):
            shutil.copy(path, dest / path.name)
    return dest


def test_missing_checkpoint_folder_names_where_its_path_was_given(monkeypatch, tiny, tmp_path):
    result = run(monkeypatch, tiny, "--target", tmp_path / "nowhere", "hi")
    assert_error(result, 1, f"checkpoint folder {tmp_path / 'nowhere'} not found", "hint: give --target a checkpoint "
                 "folder")
    assert "profile" not in result.stderr
    profile = write_profile(tmp_path / "p.toml", tmp_path / "gone", None, proposer={"kind": "ngram"})
    result = specgen(monkeypatch, "generate", "-p", profile, "hi")
    assert_error(result, 1, f"checkpoint folder {tmp_path / 'gone'} not found", f"hint: set `path` in [target] of "
                 f"{profile} to a checkpoint folder")


def test_a_number_for_draft_is_taken_for_llama_cpps_draft_length(monkeypatch, tiny, tmp_path):
    result = run(monkeypatch, tiny, "--draft", "4", "hi", env={"HF_HOME": str(tmp_path)})
    assert_error(result, 1, "4 is neither a local folder nor in the local Hugging Face cache",
                 "hint: --draft takes the draft model (a folder or a cached hub id); the draft tokens per round are --k")


def test_a_profiles_head_stays_quiet_under_another_proposer(monkeypatch, tiny, tmp_path):
    """Only --head itself is refused where nothing drafts with a head: a profile may keep its head
    for the runs that choose --proposer eagle."""
    profile = write_profile(tmp_path / "p.toml", tiny.target, tiny.draft, sampling={"max_tokens": 4},
                            proposer={"kind": "eagle", "head": str(tmp_path / "no-head-here")})
    result = specgen(monkeypatch, "generate", "-p", profile, "--proposer", "draft", "-q", "hi")
    assert result.code == 0 and result.stderr == ""


# The command runs in a fresh process with an empty hub cache and no GPU visible; it prints the
# exit code and which of torch and transformers it imported.
BEFORE_TORCH = (
    "import json, sys\n"
    "from specgen.cli import errors\n"
    "from specgen.cli.main import app\n"
    "code = errors.run(app, sys.argv[1:])\n"
    "print(json.dumps([code, sorted({'torch', 'transformers'} & set(sys.modules))]))\n"
)


@pytest.mark.parametrize("args, code, fragment", [
    (["generate", "--target", "{tmp}/nowhere", "hi"], 1, "checkpoint folder {tmp}/nowhere not found"),
    (["generate", "--target", "specgen-tests/not-cached", "hi"], 1, "specgen-tests/not-cached is neither a local "
                                                                    "folder nor in the local Hugging Face cache"),
    (["generate", "--draft", "{tmp}/nowhere", "hi"], 1, "checkpoint folder {tmp}/nowhere not found"),
    (["generate", "--proposer", "eagle", "--head", "{tmp}/nowhere", "hi"], 2, "head folder {tmp}/nowhere not found"),
    (["inspect-acceptance", "--target", "{tmp}/nowhere", "hi"], 1, "checkpoint folder {tmp}/nowhere not found"),
    (["bench", "--target", "specgen-tests/not-cached"], 1, "specgen-tests/not-cached is neither"),
    (["bench", "--proposer", "draft,eagle", "--head", "{tmp}/nowhere"], 2, "head folder {tmp}/nowhere not found"),
    (["tune-kernels"], 2, "tune-kernels times the kernels on a CUDA GPU, and none is visible"),
    (["generate", "--head", "{tmp}/nowhere", "hi"], 2, "--head gives the EAGLE-3 head that --proposer eagle drafts "
                                                       "with, and this run's proposer is draft"),
    (["bench", "--proposer", "draft,ngram", "--head", "{tmp}/nowhere"], 2, "--head gives the EAGLE-3 head that "
     "--proposer eagle drafts with, and this run's proposers are draft, ngram"),
], ids=["target folder", "hub id", "draft folder", "head folder", "inspect", "bench hub id", "bench head",
        "tune-kernels", "head without eagle", "bench head without eagle"])
def test_what_needs_no_model_is_reported_before_torch_is_imported(tmp_path, args, code, fragment):
    """Importing torch takes seconds: a path that names nothing, or a machine without a GPU, is
    answered without it."""
    env = subprocess_env(HF_HOME=str(tmp_path / "hf-home"), CUDA_VISIBLE_DEVICES="")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(name, None)
    args = [arg.format(tmp=tmp_path) for arg in args]
    proc = subprocess.run([sys.executable, "-c", BEFORE_TORCH, *args], capture_output=True, text=True, env=env,
                          timeout=120)
    assert json.loads(proc.stdout) == [code, []], proc.stderr
    assert proc.stderr.startswith(f"specgen: error: {fragment.format(tmp=tmp_path)}"), proc.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a Linux machine's device files")
def test_a_gpu_is_told_apart_from_none_without_torch(tmp_path):
    """A GPU machine is never refused: NVIDIA's driver or device files, WSL's or ROCm's GPU device
    each leave the answer to torch; only their absence, or CUDA_VISIBLE_DEVICES hiding every
    device, is certain."""
    from specgen.cli.tune import no_gpu_visible

    (tmp_path / "dev").mkdir()
    (tmp_path / "proc").mkdir()
    assert no_gpu_visible(tmp_path, {})
    assert no_gpu_visible(tmp_path, {"CUDA_VISIBLE_DEVICES": "0"})
    for device in ("dev/nvidia0", "dev/dxg", "dev/kfd", "proc/driver/nvidia"):
        (tmp_path / device).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / device).touch()
        assert not no_gpu_visible(tmp_path, {}), device
        assert not no_gpu_visible(tmp_path, {"CUDA_VISIBLE_DEVICES": "1,0"}), device
        assert no_gpu_visible(tmp_path, {"CUDA_VISIBLE_DEVICES": ""}) and no_gpu_visible(
            tmp_path, {"CUDA_VISIBLE_DEVICES": "-1"}), device
        (tmp_path / device).unlink()
    (tmp_path / "dev" / "nvidiactl").touch()  # the control device alone: no GPU
    assert no_gpu_visible(tmp_path, {})


@pytest.mark.parametrize("patterns, message", [
    ((), "has no config.json"),
    (("*.json",), "contains no model weights"),
    (("config.json", "generation_config.json", "*.safetensors"), "has no tokenizer files"),
], ids=["no config", "no weights", "no tokenizer"])
def test_missing_checkpoint_files(monkeypatch, tiny, tmp_path, patterns, message):
    folder = copy_checkpoint(tiny.target, tmp_path / "partial", *patterns)
    assert_error(run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "hi"), 1, message)


def test_truncated_weights_name_the_file(monkeypatch, tiny, tmp_path):
    folder = copy_checkpoint(tiny.target, tmp_path / "cut", "*")
    weights = folder / "model.safetensors"
    with weights.open("r+b") as file:  # an interrupted copy
        file.truncate(weights.stat().st_size // 2)
    result = run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "hi")
    assert_error(result, 1, f"{weights}: damaged or incomplete weights", "hint: copy or download the checkpoint again")


@pytest.mark.parametrize("modeling", ["auto", "transformers"], ids=["specgen's Llama", "transformers"])
@pytest.mark.parametrize("damage, reason", [
    ("shape", "_proj.weight` has shape [%d, %d] in the files but config.json implies [%d, %d])"),
    ("missing", "(1 tensors missing, e.g. model.layers.1.mlp.up_proj.weight)"),
], ids=["shape", "missing"])
def test_weights_that_do_not_match_config_json(monkeypatch, tiny, tmp_path, modeling, damage, reason):
    """Whichever code runs the model: transformers would leave a missing tensor at random values and
    tell a shape only in a report its quieted logging hides."""
    from safetensors.torch import load_file, save_file

    folder = copy_checkpoint(tiny.target, tmp_path / "damaged", "*")
    if damage == "shape":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"intermediate_size": 100}))
    else:
        tensors = load_file(folder / "model.safetensors")
        del tensors["model.layers.1.mlp.up_proj.weight"]
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    profile = write_profile(tmp_path / "p.toml", folder, None, proposer={"kind": "none"},
                            runtime={"threads": 1, "modeling": modeling})
    result = specgen(monkeypatch, "generate", "-p", profile, "hi")
    assert_error(result, 1, f"{folder}: the weights do not match config.json (", "hint: copy or download the checkpoint "
                 "again")
    shapes = [(128, 64, 100, 64), (64, 128, 64, 100)]  # gate or up, or down (the first named)
    assert any(reason % shape in result.stderr for shape in shapes) if damage == "shape" else reason in result.stderr


def test_invalid_config_json_gives_line_and_column(monkeypatch, tiny, tmp_path):
    folder = copy_checkpoint(tiny.target, tmp_path / "bad-config", "*")
    (folder / "config.json").write_text('{\n  "model_type": "llama",\n}\n')
    result = run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "hi")
    assert_error(result, 1, f"{folder / 'config.json'}:3:1: invalid JSON")


def test_chat_template_refused_by_the_sandbox(monkeypatch, tiny, tmp_path):
    folder = copy_checkpoint(tiny.target, tmp_path / "unsafe-template", "*")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ ''.__class__.__subclasses__() }}"  # Jinja's sandbox refuses this
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    result = run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "--chat", "hi")
    assert_error(result, 1, f"the chat template of {folder} failed: SecurityError", "hint: fix the template")


@pytest.mark.parametrize("template", [5, [1, 2], {"default": 3}, [{"name": "default", "template": None}]],
                         ids=["number", "list of numbers", "object of a number", "named entry without text"])
@pytest.mark.parametrize("chat", [True, False], ids=["--chat", "no --chat"])
def test_a_chat_template_that_is_not_text(monkeypatch, tiny, tmp_path, template, chat):
    folder = copy_checkpoint(tiny.target, tmp_path / "odd-template", "*")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    result = run(monkeypatch, tiny, "--target", folder, "--proposer", "none", *(["--chat"] if chat else []), "hi")
    assert_error(result, 1, f"{folder / 'tokenizer_config.json'}: `chat_template` is {json.dumps(template)}; expected "
                 "a string", "hint: fix the file")


def test_named_chat_templates_without_a_default(monkeypatch, tiny, tmp_path):
    folder = copy_checkpoint(tiny.target, tmp_path / "named-templates", "*")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    templates = [{"name": "tool_use", "template": "{{ messages[0].content }}"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": templates}))
    result = run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "--chat", "hi")
    assert_error(result, 2, "this tokenizer's chat templates (tool_use) have none named default", "hint: drop --chat")
    assert run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "-q", "hi").code == 0


def test_hub_id_not_in_the_cache_while_offline(tiny, tmp_path):
    # A real process: HF_HOME and HF_HUB_OFFLINE are read when huggingface_hub is imported.
    env = subprocess_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    args = ["generate", "-p", str(tiny.profile), "--target", "specgen-tests/not-cached", "--proposer", "none", "hi"]
    proc = subprocess.run([sys.executable, "-m", "specgen.cli.main", *args],
                          capture_output=True, text=True, env=env, timeout=300)
    from cli_helpers import Result

    assert_error(Result(proc.returncode, proc.stdout, proc.stderr), 1,
                 "specgen-tests/not-cached is neither a local folder nor in the local Hugging Face cache",
                 "hint: download it first")


def test_draft_with_an_incompatible_tokenizer(monkeypatch, tiny, tmp_path):
    folder = copy_checkpoint(tiny.draft, tmp_path / "other-draft", "config.json", "*.safetensors")
    build_tokenizer(folder, corpus=["SELECT name FROM users WHERE id = 42;\n", "<p>Hello, <b>world</b></p>\n"])
    result = run(monkeypatch, tiny, "--draft", folder, "hi")
    assert_error(result, 1, "draft and target tokenizers differ: id ", "hint: use a draft from the same model family")


def test_checkpoint_needing_remote_code_is_refused(monkeypatch, tiny, tmp_path):
    folder = copy_checkpoint(tiny.target, tmp_path / "custom", "*")
    ran = tmp_path / "custom-code-ran"
    (folder / "modeling_custom.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "specgen-custom", "architectures": ["CustomForCausalLM"],
               "auto_map": {"AutoConfig": "modeling_custom.CustomConfig",
                            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}}
    (folder / "config.json").write_text(json.dumps(config))
    result = run(monkeypatch, tiny, "--target", folder, "--proposer", "none", "hi")
    assert_error(result, 1, "needs code from the checkpoint to run, and this profile does not allow it",
                 "hint: only if you trust its author", "--trust-remote-code", "runs with your permissions")
    assert not ran.exists()


@pytest.fixture(scope="module")
def pickle_only(tiny, tmp_path_factory):
    from safetensors.torch import load_file

    folder = copy_checkpoint(tiny.target, tmp_path_factory.mktemp("pickle") / "target", "*.json")
    torch.save(load_file(tiny.target / "model.safetensors"), folder / "pytorch_model.bin")
    return folder


def test_pickle_only_weights_are_refused(monkeypatch, tiny, pickle_only):
    result = run(monkeypatch, tiny, "--target", pickle_only, "--proposer", "none", "hi")
    assert_error(result, 1, "has only pickle-based weights (pytorch_model.bin)", "can run arbitrary code",
                 "hint: convert them to safetensors, or pass --allow-pickle")


def test_pickle_only_weights_load_with_allow_pickle(monkeypatch, tiny, pickle_only):
    allowed = run(monkeypatch, tiny, "--target", pickle_only, "--proposer", "none", "--allow-pickle", "-q", "hi")
    assert allowed.code == 0 and allowed.stderr == ""
    reference = run(monkeypatch, tiny, "--proposer", "none", "-q", "hi")  # same weights, from safetensors
    assert allowed.stdout == reference.stdout and allowed.stdout.strip()


# ---------------------------------------------------------------- devices and run time (exit 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_but_unavailable(monkeypatch, tiny):
    result = run(monkeypatch, tiny, "--device", "cuda", "hi")
    assert_error(result, 1, "device 'cuda' was requested but CUDA is not available", "hint: use --device cpu")


def test_out_of_gpu_memory_during_generation_says_what_to_reduce(monkeypatch, tiny):
    from cli_helpers import wrap_forwards

    def forward(real, self, *args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                          "capacity of 79.19 GiB of which 1.06 GiB is free.")

    wrap_forwards(monkeypatch, forward)  # the models themselves: whatever runs them
    result = run(monkeypatch, tiny, "hi")
    assert_error(result, 1, "out of GPU memory (tried to allocate 2.00 GiB)",
                 "hint: reduce --max-tokens, --k or the prompt length")


def test_an_unexpected_exception_is_one_line_with_a_hint(monkeypatch, tiny):
    from specgen.core.engine import Engine

    def encode(self, prompt, chat=False):
        raise RuntimeError("something broke\nwith a second line")

    monkeypatch.setattr(Engine, "encode", encode)
    result = run(monkeypatch, tiny, "hi")
    assert_error(result, 1, "unexpected RuntimeError: something broke", "SPECGEN_DEBUG=1")
    assert "second line" not in result.stderr


def test_specgen_debug_shows_the_traceback(monkeypatch, tmp_path):
    with pytest.raises(ProfileError):  # re-raised: Python prints the traceback
        specgen(monkeypatch, "generate", "-p", tmp_path / "nope.toml", "hi", env={"SPECGEN_DEBUG": "1"})
