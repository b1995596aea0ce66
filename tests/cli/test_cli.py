"""`specgen` as a command: results alone on stdout, diagnostics on stderr, formats, stdin, NO_COLOR,
and a --help that answers without importing torch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from cli_helpers import Stream, assert_error, option_names, run_python, specgen, subprocess_env
from repo_paths import REPO
from tiny_models import build_pair, write_profile

PROMPT = "def add(a, b):"
# the decode rate needs a round after the first; start-up ends the first prompt's line
SUMMARY = re.compile(r"^\d+ tokens in \d+ rounds, first token \d+ ms(?:, then [\d.]+ tok/s)?, acceptance [^,]+, "
                     r"mean accepted length [\d.]+(?:; load [\d.]+ s, setup [\d.]+ s)?$")
SGR = re.compile(r"\x1b\[([0-9;]*)m")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from specgen.core.engine import Engine
    from specgen.core.profile import load_profile

    root = tmp_path_factory.mktemp("cli")
    profile = write_profile(root / "tiny.toml", *build_pair(root, noisy=0.1),
                            sampling={"max_tokens": 12, "ignore_eos": True})
    engine = Engine(load_profile(str(profile)))
    *_, finished = engine.decoder().run(engine.encode(PROMPT))
    return SimpleNamespace(profile=profile, text=finished.text)  # the greedy text, straight from the loop


def generate(monkeypatch, tiny, *args, **kwargs):
    return specgen(monkeypatch, "generate", "-p", tiny.profile, *args, **kwargs)


def has_colour(text: str) -> bool:
    """Whether any SGR sequence sets a foreground or background colour (bold or dim are not colours)."""
    colour = re.compile(r"3[0-9]|4[0-9]|9[0-7]|10[0-7]")
    return any(colour.fullmatch(p) for params in SGR.findall(text) for p in params.split(";"))


# ---------------------------------------------------------------- the command itself


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from specgen.cli import errors\n"
        "from specgen.cli.main import app\n"
        "for args in (['--help'], ['generate', '--help'], ['profiles', '--help']):\n"
        "    assert errors.run(app, args) == 0\n"
        "sys.exit(sorted({'torch', 'transformers'} & set(sys.modules)) or None)\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "generate" in proc.stdout and "--max-tokens" in proc.stdout


@pytest.mark.parametrize("how", ["console script", "python -m specgen", "python -m specgen.cli.main"])
def test_console_script_and_module_both_run(how):
    if how == "console script" and shutil.which("specgen") is None:
        pytest.skip("specgen is not installed on PATH")
    prefix = ["specgen"] if how == "console script" else [sys.executable, "-m", how.split()[-1]]
    proc = subprocess.run([*prefix, "--help"], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "Usage" in proc.stdout and "generate" in proc.stdout


# ---------------------------------------------------------------- generate: stdout and stderr


def test_text_alone_on_stdout_and_one_summary_line_on_stderr(monkeypatch, tiny):
    result = generate(monkeypatch, tiny, PROMPT)
    assert result.code == 0
    assert result.stdout == tiny.text + "\n"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and SUMMARY.match(lines[0]), result.stderr
    assert "\x1b" not in result.stdout + result.stderr  # not a terminal: no live view, no styles


def test_quiet_prints_nothing_on_stderr(monkeypatch, tiny):
    result = generate(monkeypatch, tiny, "--quiet", PROMPT)
    assert result.code == 0 and result.stderr == ""
    assert result.stdout == tiny.text + "\n"


def test_format_json_is_one_object(monkeypatch, tiny):
    result = generate(monkeypatch, tiny, "--format", "json", PROMPT)
    assert result.code == 0 and result.stdout.count("\n") == 1
    record = json.loads(result.stdout)
    assert record["prompt"] == PROMPT and record["text"] == tiny.text
    assert record["finish_reason"] == "length" and len(record["token_ids"]) == len(record["fates"]) == 12
    assert set(record["fates"]) <= {"accepted", "recovered", "bonus"}
    assert record["stats"]["rounds"] >= 1
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("args", [["-"], []], ids=["dash", "piped"])
def test_prompt_from_stdin(monkeypatch, tiny, args):
    result = generate(monkeypatch, tiny, *args, "-q", stdin=PROMPT.encode())
    assert result.code == 0 and result.stdout == tiny.text + "\n"


def test_no_color_is_respected_on_a_terminal(monkeypatch, tiny):
    terminal = {"TERM": "xterm-256color"}
    coloured = generate(monkeypatch, tiny, PROMPT, tty=True, env=terminal)
    assert coloured.code == 0
    assert has_colour(coloured.stdout)  # tokens coloured by fate: the test can see colours
    plain = generate(monkeypatch, tiny, PROMPT, tty=True, env=terminal | {"NO_COLOR": "1"})
    assert plain.code == 0
    assert not has_colour(plain.stdout) and not has_colour(plain.stderr)
    assert SGR.sub("", plain.stdout) == tiny.text + "\n"


# ---------------------------------------------------------------- profiles through the main app


def test_profiles_list_and_show_through_the_main_app(monkeypatch, tiny, tmp_path):
    monkeypatch.setenv("SPECGEN_PROFILE_DIR", str(tmp_path))
    listed = specgen(monkeypatch, "profiles", "list")
    assert listed.code == 0 and listed.stderr == ""
    assert any(line.split()[0] == "demo" for line in listed.stdout.splitlines() if line.strip())

    shown = specgen(monkeypatch, "profiles", "show", tiny.profile, "--format", "json")
    assert shown.code == 0 and json.loads(shown.stdout)["sampling"]["max_tokens"] == 12

    as_toml = specgen(monkeypatch, "profiles", "show", "demo")
    assert as_toml.code == 0 and "[speculation]" in as_toml.stdout and as_toml.stderr == ""

    assert_error(specgen(monkeypatch, "profiles", "show", "dmo"), 2, "unknown profile `dmo`")


# ---------------------------------------------------------------- threads


def test_auto_threads_leave_half_the_cpus_to_other_processes():
    from specgen.core.models.loading import cpu_threads
    from specgen.core.settings import RuntimeSpec

    assert [cpu_threads(RuntimeSpec(), cpus=n) for n in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert cpu_threads(RuntimeSpec(threads=3), cpus=2) == 3


def test_threads_option_sets_torch_threads_before_the_run(monkeypatch, tiny):
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        result = generate(monkeypatch, tiny, "--threads", "2", "-q", PROMPT)
        assert result.code == 0 and result.stdout == tiny.text + "\n"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- start-up


@pytest.mark.parametrize("args", [
    ["generate", "--top-p", "5", PROMPT],
    ["generate", "--seed", "-1", PROMPT],
    ["generate", "--seed", str(2**64), PROMPT],
    ["generate", "--profile", "no-such-profile", PROMPT],
    ["generate", "--format", "jsonl", PROMPT],
    ["bench", "--k", "0,x"],
    ["bench", "--baseline", "vllm"],
    ["bench", "--top-p", "5"],
    ["bench", "--k", "1,64"],
    ["bench", "--prompts-file", "no-such-file.txt"],
    ["inspect-acceptance", "--top-p", "5", PROMPT],
    ["inspect-acceptance", "--seed", str(2**64), PROMPT],
    ["inspect-acceptance", "--export", "report.svg", PROMPT],
], ids=["option", "seed", "huge-seed", "profile", "format", "bench-k-list", "bench-baseline", "bench-option",
        "bench-k", "bench-prompts", "inspect-option", "inspect-seed", "inspect-export"])
def test_usage_errors_are_found_before_torch_is_imported(args):
    """Importing torch and transformers takes seconds: a typo must not wait for them."""
    code = (
        "import sys\n"
        "from specgen.cli import errors\n"
        "from specgen.cli.main import app\n"
        "assert errors.run(app, sys.argv[1:]) == 2\n"
        "sys.exit(sorted({'torch', 'transformers'} & set(sys.modules)) or None)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("specgen: error: ")


HEAVY = ("transformers", "torch._dynamo", "torch.distributed.tensor", "sympy", "scipy", "triton", "accelerate",
         "jinja2")


def test_the_demo_starts_without_importing_transformers():
    """Most of the demo's start-up was imports: transformers' own (its __init__ reads every model's
    source) and those its modeling code makes (torch._dynamo, torch.distributed.tensor, sympy, scipy,
    ...). specgen's own Llama, KV cache and plain tokenizer need none of them. The cycle collector,
    paused while the pair loads, runs again for the generation. A machine with a GPU runs the demo
    there, through the CUDA backend (Triton, transformers' modules rewired): there this checks the
    CPU start with --device cpu."""
    device = ", '--device', 'cpu'" if torch.cuda.is_available() else ""
    code = (
        "import gc, sys\n"
        "from specgen.cli import errors\n"
        "from specgen.cli.main import app\n"
        "seen = []\n"
        "from specgen.core import engine\n"
        "engine.Engine.decoder = lambda self, *a, real=engine.Engine.decoder, **k: seen.append(gc.isenabled()) "
        "or real(self, *a, **k)\n"
        f"assert errors.run(app, ['generate', '-n', '4', '-q', 'def quicksort(arr):'{device}]) == 0\n"
        "assert seen and all(seen), seen\n"
        f"sys.exit(sorted(set({HEAVY!r}) & set(sys.modules)) or None)\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("\n    \"\"\"")  # the demo's greedy text for this prompt


# ---------------------------------------------------------------- one set of options


EVERYWHERE = ("--threads", "--chat", "--system", "--download", "--no-download", "--prompts-file", "--truncate-prompt",
              "--quiet")


@pytest.mark.parametrize("command, own", [
    ("generate", ("--stop", "--min-tokens", "--dtype", "--logprobs")),
    ("bench", ("--dtype", "--threads", "--draft-p-min", "--adaptive-k", "--presence-penalty")),
    ("inspect-acceptance", ("--stop", "--min-tokens", "--dtype")),
])
def test_every_command_takes_the_shared_options(command, own):
    from cli_helpers import option_names

    names = option_names(command)
    assert set(EVERYWHERE + own) <= names, sorted(set(EVERYWHERE + own) - names)
    assert "--prompts" in option_names(command, hidden=True) - names  # the old name, accepted but not shown


@pytest.mark.parametrize("command", [[], ["generate"], ["bench"], ["inspect-acceptance"], ["train-head"],
                                     ["profiles", "show"]])
def test_switches_show_no_value_placeholder_in_help(monkeypatch, command):
    result = specgen(monkeypatch, *command, "--help", env={"COLUMNS": "200"})
    assert result.code == 0 and "--help" in result.stdout
    assert "<bool>" not in result.stdout


@pytest.mark.parametrize("command", ["generate", "bench", "inspect-acceptance", "train-head"])
def test_help_shows_every_option_name_whole_at_80_columns(monkeypatch, command):
    from cli_helpers import option_names

    result = specgen(monkeypatch, command, "--help", env={"COLUMNS": "80"})
    assert result.code == 0, result
    assert "…" not in result.stdout and max(len(line) for line in result.stdout.splitlines()) <= 80
    shown = set(re.findall(r"--[a-z0-9-]+", result.stdout))
    assert option_names(command) <= shown, sorted(option_names(command) - shown)
    assert "--prompts" not in shown  # the hidden old name of --prompts-file


CLI_DOC = REPO / "docs" / "cli.md"


def documented_options() -> dict[str, set[str]]:
    """The option names in the tables of each command's section of docs/cli.md: a name counts where
    a backticked span starts with it (`--k 1,2`, `-t/--temperature`, `--live/--no-live`)."""
    sections, command = {}, None
    for line in CLI_DOC.read_text().splitlines():
        heading = re.match(r"## `specgen( [a-z -]+)?`", line)
        if heading:
            command = (heading.group(1) or "").strip()
            sections[command] = set()
        elif line.startswith("## "):
            command = None
        elif command is not None and line.startswith("|"):
            for first, second in re.findall(r"`(?:-[a-zA-Z]/)?(--[a-z0-9-]+)(?:/(--[a-z0-9-]+))?", line):
                sections[command].update(filter(None, (first, second)))
    return sections


@pytest.mark.parametrize("command", ["", "generate", "bench", "inspect-acceptance", "train-head", "profiles"])
def test_docs_cli_md_lists_every_option_of_every_command(command):
    """docs/cli.md's tables name exactly the options --help shows (the hidden old --prompts aside)."""
    documented = documented_options()[command]
    subcommands = {"profiles": ["profiles list", "profiles show"]}.get(command, [command])
    actual = set().union(*(option_names(c) for c in subcommands))
    assert documented == actual, (sorted(actual - documented), sorted(documented - actual))


def test_docs_cli_md_shows_the_real_top_level_help(monkeypatch):
    """docs/cli.md's `specgen --help` block is the help at 80 columns, every command included."""
    text = CLI_DOC.read_text()
    block = text[text.index("$ specgen --help\n") + len("$ specgen --help\n"):]
    block = block[: block.index("```")]
    real = specgen(monkeypatch, "--help", env={"COLUMNS": "80"}).stdout
    def lines(text: str) -> list[str]:
        return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n").splitlines()

    assert lines(block) == lines(real)


def test_seed_help_says_the_text_depends_on_the_settings_too(monkeypatch):
    """k and the proposer change the text a seed gives: the help must not promise 'same seed, same text'."""
    for command in ("generate", "bench", "inspect-acceptance"):
        out = " ".join(specgen(monkeypatch, command, "--help", env={"COLUMNS": "200"}).stdout.split())
        assert "Same seed, same settings (k and proposer too), same text on the same device." in out, command


def test_train_head_help_does_not_speak_of_two_models(monkeypatch):
    """train-head loads the target alone: --device and --dtype must not say "both models"."""
    out = " ".join(specgen(monkeypatch, "train-head", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "bfloat16 | float16 (every model loaded)" in out and "both models" not in out


def test_version(monkeypatch):
    from specgen import __version__

    for flag in ("--version", "-V"):
        result = specgen(monkeypatch, flag)
        assert (result.code, result.stdout, result.stderr) == (0, f"specgen {__version__}\n", "")


def test_shell_completion_answers_through_the_console_script():
    env = subprocess_env(_SPECGEN_COMPLETE="complete_bash", COMP_WORDS="specgen generate --thr", COMP_CWORD="2")
    proc = subprocess.run([sys.executable, "-m", "specgen.cli.main"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["--threads"], proc


def test_show_completion_prints_a_script(monkeypatch):
    import shellingham

    # --show-completion takes no shell name: Typer prints the script of the shell it finds among this
    # process's ancestors, so the test would pass or fail by how pytest was started (from bash; from sh,
    # "Shell sh not supported."; from no shell at all, e.g. setsid, nohup &, a container's entry point).
    monkeypatch.setattr(shellingham, "detect_shell", lambda pid=None, max_depth=10: ("bash", "/bin/bash"))
    out = Stream()
    with pytest.raises(SystemExit) as done:  # Typer's callback exits by itself
        specgen(monkeypatch, "--show-completion", stdout=out)
    assert done.value.code == 0
    assert "_SPECGEN_COMPLETE=complete_bash" in out.text()  # the script asks specgen, as the test above does


def test_prompts_is_a_hidden_alias_of_prompts_file(monkeypatch, tiny, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text(PROMPT + "\n")
    for name in ("--prompts-file", "--prompts"):
        result = generate(monkeypatch, tiny, name, path, "-q")
        assert result.code == 0 and result.stdout == tiny.text + "\n"
    assert_error(generate(monkeypatch, tiny, "--prompts-file", path, "--prompts", path), 2, "--prompts-file once")
    assert "--prompts " not in specgen(monkeypatch, "generate", "--help", env={"COLUMNS": "200"}).stdout


def test_a_high_temperature_warns_that_t_is_not_threads(monkeypatch, tiny):
    result = generate(monkeypatch, tiny, "-t", "8", "--seed", "1", "-n", "2", PROMPT)
    assert result.code == 0
    assert result.stderr.splitlines()[0] == ("specgen: warning: temperature 8 is above 2, close to uniform "
                                             "sampling; -t is --temperature in specgen (CPU threads: --threads)")
    assert "warning" not in generate(monkeypatch, tiny, "-t", "2", "--seed", "1", "-n", "2", PROMPT).stderr
    assert generate(monkeypatch, tiny, "-t", "8", "-q", "-n", "2", PROMPT).stderr == ""


def test_system_prompt_goes_into_the_chat_template(tmp_path):
    from specgen.core.models.chat import chat_ids
    from specgen.core.errors import UsageError
    from tiny_models import build_tokenizer

    tok = build_tokenizer(tmp_path)
    with pytest.raises(UsageError, match="no chat template"):
        chat_ids(tok, "hi", system="be brief")
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert tok.decode(chat_ids(tok, "hi", "be brief")) == "<system>be brief\n<user>hi\n<assistant>"
    assert tok.decode(chat_ids(tok, "hi")) == "<user>hi\n<assistant>"
    tok.chat_template = "{{ raise_exception('System role not supported') if messages[0].role == 'system' }}x"
    with pytest.raises(UsageError, match="refused the prompt: System role not supported") as refused:
        chat_ids(tok, "hi", "be brief")
    assert "drop --system" in refused.value.hint


def test_system_implies_chat(monkeypatch, tiny):
    # The tiny tokenizer has no chat template: the error shows that --system alone asked for one.
    assert_error(generate(monkeypatch, tiny, "--system", "be brief", PROMPT), 2, "no chat template")


# ---------------------------------------------------------------- output shape


def test_several_prompts_in_text_are_headed_and_their_summaries_named(monkeypatch, tiny, tmp_path):
    path = tmp_path / "p.txt"
    path.write_text(f"{PROMPT}\n\n{PROMPT}\n")
    result = generate(monkeypatch, tiny, "--prompts-file", path)
    assert result.code == 0, result
    assert result.stdout == f"==> {path}:1 <==\n{tiny.text}\n==> {path}:3 <==\n{tiny.text}\n"
    lines = result.stderr.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{path}:1", f"{path}:3"]
    assert all(SUMMARY.match(line.split(": ", 1)[1]) for line in lines)
    single = generate(monkeypatch, tiny, PROMPT)  # one prompt: no header, no label
    assert single.stdout == tiny.text + "\n" and SUMMARY.match(single.stderr.strip())


def test_logprobs_in_text_format_are_a_usage_error(monkeypatch, tiny):
    assert_error(generate(monkeypatch, tiny, "--logprobs", "2", PROMPT), 2, "--logprobs needs --format json")


def test_json_logprobs_carry_the_token_text(monkeypatch, tiny):
    from transformers import PreTrainedTokenizerFast

    from specgen.core.profile import load_profile

    tok = PreTrainedTokenizerFast.from_pretrained(load_profile(str(tiny.profile)).target.path)
    result = generate(monkeypatch, tiny, "--logprobs", "2", "--format", "json", PROMPT)
    record = json.loads(result.stdout)
    assert [e["token_id"] for e in record["logprobs"]] == record["token_ids"]
    for entry in record["logprobs"]:
        assert entry["token"] == tok.decode([entry["token_id"]])
        assert len(entry["top_logprobs"]) == 2 and "top" not in entry  # the OpenAI / vLLM name, schema 2
        assert all(alt["token"] == tok.decode([alt["token_id"]]) for alt in entry["top_logprobs"])


def documented_record_fields() -> list[str]:
    """The fields of docs/cli.md's table of generate's JSON record, in order."""
    text = CLI_DOC.read_text()
    table = text[text.index("### `--format json` and `jsonl` (schema `specgen.generate/2`)"):]
    table = table[table.index("| field |"):table.index("\n\n", table.index("| field |"))]
    return re.findall(r"^\| `(\w+)` \|", table, re.M)


def test_json_records_name_their_schema_and_count_the_prompt_tokens(monkeypatch, tiny):
    from specgen.core.engine import Engine
    from specgen.core.profile import load_profile

    record = json.loads(generate(monkeypatch, tiny, "--format", "json", "--logprobs", "1", PROMPT).stdout)
    assert record["schema"] == "specgen.generate/2"
    assert record["prompt_tokens"] == len(Engine(load_profile(str(tiny.profile))).encode(PROMPT))
    assert list(record) == [f for f in documented_record_fields() if f != "incomplete"]  # Ctrl-C's alone


def test_a_stop_token_id_ends_token_ids_and_its_text_ends_the_text(monkeypatch, tiny):
    """As docs/cli.md says (and vLLM's stop_token_ids do): the stop id is the last of token_ids, and
    its text ends the text (a special token's text is never shown: the detokenizer skips them)."""
    from transformers import PreTrainedTokenizerFast

    from specgen.core.profile import load_profile

    tok = PreTrainedTokenizerFast.from_pretrained(load_profile(str(tiny.profile)).target.path)
    free = json.loads(generate(monkeypatch, tiny, "--format", "json", PROMPT).stdout)["token_ids"]
    stop = next(t for t in free[2:] if t not in tok.all_special_ids and tok.decode([t]).strip())
    ids = free[: free.index(stop) + 1]
    record = json.loads(generate(monkeypatch, tiny, "--format", "json", "--stop-token-id", stop, PROMPT).stdout)
    assert (record["finish_reason"], record["token_ids"]) == ("stop_token", ids)
    assert record["text"] == tok.decode(ids) and record["text"].endswith(tok.decode([stop]))
    text = generate(monkeypatch, tiny, "--stop-token-id", stop, PROMPT).stdout
    assert text == record["text"] + "\n"
    row = next(line for line in CLI_DOC.read_text().splitlines() if line.startswith("| `--stop TEXT`"))
    assert "it is the last of `token_ids` and its text ends the text" in row


def test_target_only_says_acceptance_is_not_applicable(monkeypatch, tiny):
    result = generate(monkeypatch, tiny, "--proposer", "none", PROMPT)
    assert result.code == 0 and result.stdout == tiny.text + "\n"
    assert ", acceptance n/a, " in result.stderr and "0.0%" not in result.stderr


# ---------------------------------------------------------------- the network


def _cache_repo(cache, repo: str, folder) -> None:
    """`folder` as the main snapshot of hub repo `repo` in a Hugging Face cache, as `hf download` leaves it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)


def test_cached_hub_ids_load_without_any_network_access(tmp_path):
    target, draft = build_pair(tmp_path / "pair", noisy=0.1)
    cache = tmp_path / "hub"
    _cache_repo(cache, "org/tiny-target", target)
    _cache_repo(cache, "org/tiny-draft", draft)
    profile = write_profile(tmp_path / "hub.toml", "org/tiny-target", "org/tiny-draft", sampling={"max_tokens": 4})
    code = (
        "import socket, sys\n"
        "def refuse(*args, **kwargs):\n"
        "    sys.stderr.write(f'NETWORK {args[:2]}\\n')\n"
        "    raise OSError('no network in this test')\n"
        "socket.getaddrinfo = socket.socket.connect = refuse\n"
        "from specgen.cli import errors\n"
        "from specgen.cli.main import app\n"
        "sys.exit(errors.run(app, sys.argv[1:]))\n"
    )
    env = {k: v for k, v in subprocess_env(HF_HUB_CACHE=str(cache)).items() if k != "HF_HUB_OFFLINE"}
    args = ["generate", "-p", str(profile), "-q", PROMPT]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "NETWORK" not in proc.stderr, proc.stderr
    assert proc.stdout.strip()
    missing = subprocess.run([sys.executable, "-c", code, *args, "--target", "org/not-cached"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert missing.returncode == 1 and "NETWORK" not in missing.stderr, missing.stderr
    assert "org/not-cached is neither a local folder nor in the local Hugging Face cache" in missing.stderr
    assert "--download" in missing.stderr


def test_logprobs_mode_raw_reports_the_models_own_distribution(monkeypatch, tiny):
    def logprobs(*mode):
        result = generate(monkeypatch, tiny, "-t", "0.5", "--seed", "3", "--logprobs", "1", "--format", "json",
                          *mode, PROMPT)
        assert result.code == 0, result
        return json.loads(result.stdout)

    warped, raw = logprobs(), logprobs("--logprobs-mode", "raw")
    assert warped["token_ids"] == raw["token_ids"]  # the mode changes what is reported, not the text
    pairs = [(w["logprob"], r["logprob"]) for w, r in zip(warped["logprobs"], raw["logprobs"])]
    assert all(r <= 0 for _, r in pairs) and any(abs(w - r) > 1e-3 for w, r in pairs)
    assert_error(generate(monkeypatch, tiny, "--logprobs-mode", "logits", PROMPT), 2, "must be one of warped, raw")


def test_json_logprobs_leave_out_alternatives_the_warp_removed(monkeypatch, tiny):
    result = generate(monkeypatch, tiny, "-t", "0.5", "--top-k", "1", "--seed", "1", "--logprobs", "3",
                      "--format", "json", PROMPT)
    assert result.code == 0, result

    def refuse(constant):
        raise AssertionError(f"not JSON: {constant}")

    record = json.loads(result.stdout, parse_constant=refuse)  # no -Infinity / NaN
    assert all(len(entry["top_logprobs"]) == 1 for entry in record["logprobs"])  # top-k 1: one token survives


def test_download_fetches_only_what_loading_needs(monkeypatch, tmp_path):
    import huggingface_hub

    from specgen.core.models.loading import load_tokenizer
    from specgen.core.settings import ModelSpec

    target, _ = build_pair(tmp_path, same=True)
    asked = []

    def snapshot_download(repo_id, **kwargs):
        asked.append((repo_id, kwargs))
        return str(target)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert len(load_tokenizer(ModelSpec("org/tiny"), download=True)) > 0
    assert len(load_tokenizer(ModelSpec("org/tiny", revision="v1"), allow_pickle=True)) > 0
    (repo, fetch), (_, cached) = asked
    assert repo == "org/tiny" and fetch["local_files_only"] is False and cached["local_files_only"] is True
    assert cached["revision"] == "v1"
    assert "*.safetensors" in fetch["allow_patterns"] and "*.bin" not in fetch["allow_patterns"]
    assert "*.bin" in cached["allow_patterns"] and "*.py" not in cached["allow_patterns"]


def test_generate_reports_start_up_first_token_and_decode_rate_apart(monkeypatch):
    """On the demo pair: load, setup, time to first token and decoding are separate, disjoint spans
    of the run (their sum fits in the wall time), and the decode rate is decode tokens over decode
    seconds, in the record, on the summary line and with -v. No timing is asserted."""
    from specgen.core.stats import decode_rate, generation_rate

    result = specgen(monkeypatch, "generate", "-n", "24", "--format", "json", "-v", "def fib(n):")
    assert result.code == 0, result.stderr
    record = json.loads(result.stdout)
    stats, startup = record["stats"], record["startup"]
    assert startup["load_seconds"] > 0 and startup["setup_seconds"] >= 0
    assert stats["rounds"] >= 2 and stats["decode_tokens"] < stats["generated_tokens"] == 24
    first_round = 24 - stats["decode_tokens"]  # the tokens of the first round: 1 to k + 1
    assert 1 <= first_round <= 5
    assert 0 < stats["prefill_seconds"] <= stats["time_to_first_token_seconds"]
    assert stats["time_to_first_token_seconds"] + stats["decode_seconds"] == pytest.approx(stats["generation_seconds"])
    spans = startup["load_seconds"] + startup["setup_seconds"] + stats["generation_seconds"]
    assert spans <= record["wall_seconds"]
    assert stats["decode_tokens_per_second"] == pytest.approx(stats["decode_tokens"] / stats["decode_seconds"])
    assert stats["decode_tokens_per_second"] == decode_rate(24, first_round, stats["time_to_first_token_seconds"],
                                                            stats["generation_seconds"])
    assert stats["tokens_per_second"] == generation_rate(24, stats["generation_seconds"])
    lines = result.stderr.splitlines()
    assert f"startup.load_seconds: {startup['load_seconds']:.2f}" in lines
    assert f"startup.setup_seconds: {startup['setup_seconds']:.2f}" in lines
    assert not any(line.endswith(": None") for line in lines)  # e.g. placement, on one device
    summary = lines[-1]
    assert SUMMARY.match(summary), summary
    assert (f", first token {1000 * stats['time_to_first_token_seconds']:.0f} ms, "
            f"then {stats['decode_tokens_per_second']:.1f} tok/s, ") in summary
    assert summary.endswith(f"; load {startup['load_seconds']:.2f} s, setup {startup['setup_seconds']:.2f} s")


def test_start_up_is_said_once_for_several_prompts(monkeypatch, tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def f(x):\nimport os\n")
    result = generate(monkeypatch, tiny, "--prompts-file", prompts, "--format", "jsonl")
    assert result.code == 0, result.stderr
    first, second = result.json_lines()
    assert first["startup"] == second["startup"] and first["wall_seconds"] < second["wall_seconds"]
    assert [line.count("; load ") for line in result.stderr.splitlines()] == [1, 0]
