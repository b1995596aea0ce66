"""Loading target and draft checkpoints, and checking that they fit together.

A `path` is a local folder or a hub id, which specgen finds in the local Hugging Face cache without
any network access; only [runtime] download = true (--download) fetches what the cache lacks.
Weights load from safetensors; pickle-based weights (.bin, .pt) only with allow_pickle.

Checkpoints of the families specgen's own model step covers (core/step/: Llama, Mistral, Qwen2,
Qwen3, Gemma 2) run on it, on the CPU and on GPUs, and a tokenizer declared as a plain PreTrainedTokenizerFast
loads as one, without AutoTokenizer: both skip the imports of transformers' modeling code, most
of the demo's start-up. Everything else loads through transformers' Auto classes.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.core.models.chat import check_templates
from specgen.core.models.checkpoints import folder_not_found, is_local_path, no_config, not_in_hub_cache
from specgen.core.errors import ModelError
from specgen.core.settings import ModelSpec, Profile, RuntimeSpec
from specgen.core.step import config as step_config
from specgen.core.step.model import GrowingCache, OwnedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedPair:
    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object  # shared by both models: a transformers tokenizer or a core/models/tokenizer.PlainTokenizer
    vocab_size: int  # number of real token ids (len(tokenizer)); logits columns past it are padding
    device: torch.device  # where the target's logits come out
    threads: int  # torch's CPU threads for this run ([runtime] threads, auto resolved)
    modeling_note: str | None = None  # why transformers runs the target, where it does

    @property
    def modeling(self) -> str:
        """Which code runs the target: "specgen" (core/step/) or "transformers"."""
        return "specgen" if isinstance(self.target, OwnedModel) else "transformers"


def cpu_threads(spec: RuntimeSpec, cpus: int | None = None) -> int:
    """[runtime] threads, with 0 (auto) resolved to half the CPUs this process may use, at least 1.

    Half, so that another process on the machine can take a core without every op waiting for a
    descheduled thread; `cpus` is for tests (default: this process's CPU affinity)."""
    if spec.threads:
        return spec.threads
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // 2)


def resolve_device(spec: ModelSpec) -> torch.device:
    if spec.device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        device = torch.device("cuda")
    else:
        device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(
            f"device {spec.device!r} was requested but CUDA is not available on this machine",
            hint="use --device cpu (or device = \"cpu\" in the profile)",
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ModelError(f"device {spec.device!r} does not exist: {torch.cuda.device_count()} GPU(s) visible")
    if device.type == "cuda" and device.index is None:
        # "cuda" means the current GPU; named, so that every comparison of devices (which GPU a
        # weight lies on, gpu/stages.py) sees one device, and later changes of the current GPU
        # (a backend's, on another GPU) cannot move this pair's tensors
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(spec: ModelSpec, device: torch.device) -> torch.dtype:
    if spec.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[spec.dtype]


def _check_weights(folder: Path, allow_pickle: bool) -> bool:
    """Returns whether to insist on safetensors; refuses pickle-only checkpoints unless allowed."""
    if any(folder.glob("*.safetensors")) or any(folder.glob("*.safetensors.index.json")):
        return True
    pickles = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    if pickles and not allow_pickle:
        raise ModelError(
            f"{folder} has only pickle-based weights ({', '.join(sorted(pickles)[:3])}), "
            "which can run arbitrary code when loaded",
            hint="convert them to safetensors, or pass --allow-pickle if you trust this checkpoint",
        )
    if not pickles:
        raise ModelError(f"{folder} contains no model weights (*.safetensors)")
    return False


def _locate(spec: ModelSpec, allow_pickle: bool, download: bool) -> tuple[str, bool]:
    """Returns (checkpoint folder, use_safetensors); a hub id becomes its snapshot folder in the cache."""
    path = os.path.expanduser(spec.path)
    if not is_local_path(path):
        path = _hub_snapshot(spec, allow_pickle, download)
    folder = Path(path)
    if not folder.is_dir():
        raise folder_not_found(spec)
    if not (folder / "config.json").is_file():
        raise no_config(spec)
    _check_json(folder / "config.json")
    return str(folder), _check_weights(folder, allow_pickle)


def load_config(spec: ModelSpec, download: bool = False):
    """The transformers config of spec's checkpoint, its weights not needed (tune-kernels: shapes only)."""
    from transformers import AutoConfig

    path = os.path.expanduser(spec.path)
    folder = Path(path if is_local_path(path) else _hub_snapshot(spec, False, download))
    if not (folder / "config.json").is_file():
        raise no_config(spec)
    _check_json(folder / "config.json")
    return AutoConfig.from_pretrained(folder, trust_remote_code=spec.trust_remote_code)


def _hub_snapshot(spec: ModelSpec, allow_pickle: bool, download: bool) -> str:
    """A hub id's folder in the local Hugging Face cache, found by specgen itself: transformers,
    given the hub id, would contact the hub on every run even with local_files_only."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "merges.txt", "vocab.*", "*.jinja"]
    patterns += ["*.bin", "*.pt"] if allow_pickle else []
    patterns += ["*.py"] if spec.trust_remote_code else []
    try:
        return snapshot_download(spec.path, revision=spec.revision, local_files_only=not download,
                                 allow_patterns=patterns)
    except LocalEntryNotFoundError:
        raise not_in_hub_cache(spec) from None
    except (OSError, ValueError) as exc:  # a malformed hub id, or the network when downloading
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"could not {'download' if download else 'find'} {spec.path}: {first_line}") from None


def _check_json(path: Path) -> None:
    """transformers says only "not a valid JSON file": give the line and column."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})",
                         hint="fix the file, or copy the checkpoint again") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _from_pretrained(loader, name: str, spec: ModelSpec, **kwargs):
    from safetensors import SafetensorError

    try:
        return loader.from_pretrained(
            name, revision=spec.revision, trust_remote_code=spec.trust_remote_code,
            local_files_only=True, **kwargs,
        )
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise _model_error(name, spec, exc) from exc
    except SafetensorError as exc:
        raise _damaged(name, exc) from None


def _damaged(name: str, exc: Exception) -> ModelError:
    """A weights file cut short (an interrupted copy or download) or damaged."""
    damaged = _damaged_safetensors(Path(name)) if is_local_path(name) else None
    return ModelError(f"{damaged or name}: damaged or incomplete weights ({str(exc).splitlines()[0]})",
                      hint="copy or download the checkpoint again")


def _damaged_safetensors(folder: Path) -> Path | None:
    """The first .safetensors file whose header is unreadable or whose tensors run past its end."""
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with path.open("rb") as file:
                size = int.from_bytes(file.read(8), "little")
                header = json.loads(file.read(size))
            data = path.stat().st_size - 8 - size
            if any(t["data_offsets"][1] > data for key, t in header.items() if key != "__metadata__"):
                return path
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return path
    return None


def _model_error(name: str, spec: ModelSpec, exc: Exception) -> ModelError:
    text = str(exc)
    if "trust_remote_code" in text or "remote code" in text:
        return ModelError(
            f"{name} needs code from the checkpoint to run, and this profile does not allow it",
            hint="only if you trust its author: set trust_remote_code = true in the profile "
            "(or pass --trust-remote-code); that code runs with your permissions",
        )
    first_line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return ModelError(f"could not load {name}: {first_line}")


def _quiet_transformers() -> None:
    """stderr belongs to specgen's own view: no progress bars or advice from transformers."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_tokenizer(spec: ModelSpec, allow_pickle: bool = False, download: bool = False, modeling: str = "auto"):
    """modeling "auto": a plain fast tokenizer loads without transformers (core/models/tokenizer.py)."""
    name, _ = _locate(spec, allow_pickle, download)
    if os.path.isdir(name) and not any(any(Path(name).glob(pattern)) for pattern in _TOKENIZER_FILES):
        raise ModelError(f"{spec.path} has no tokenizer files (tokenizer.json, tokenizer.model, vocab.json, ...)",
                         hint="copy the tokenizer files of the model into the folder")
    check_templates(Path(name))
    if _plain_fast_tokenizer(Path(name)):
        from specgen.core.models import tokenizer

        config = tokenizer.plain_config(Path(name)) if modeling == "auto" else None
        if config is not None:
            return _plain_tokenizer(Path(name), config)
        _quiet_transformers()
        from transformers import PreTrainedTokenizerFast

        return _from_pretrained(PreTrainedTokenizerFast, name, spec)
    _quiet_transformers()
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, name, spec)


def _plain_fast_tokenizer(folder: Path) -> bool:
    """Whether AutoTokenizer would load this folder's tokenizer as the plain PreTrainedTokenizerFast
    its tokenizer_config.json declares: a tokenizer.json, no code of its own, and a model type that
    AutoTokenizer does not map to a tokenizer class of its own (Llama's). Loading that class
    directly skips AutoTokenizer's config lookup, which imports the model's configuration module
    and, through it, transformers' modeling code."""
    if not (folder / "tokenizer.json").is_file() or not (folder / "tokenizer_config.json").is_file():
        return False
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return False  # AutoTokenizer then says what is wrong
    return (isinstance(declared, dict) and declared.get("tokenizer_class") in ("PreTrainedTokenizerFast",
                                                                               "TokenizersBackend")
            and "auto_map" not in declared and model_type == "llama")


def _plain_tokenizer(folder: Path, config: dict):
    from specgen.core.models.tokenizer import PlainTokenizer

    try:
        return PlainTokenizer(folder, config)
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own Exception for a bad file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{folder / 'tokenizer.json'}: cannot be read ({first_line})",
                         hint="copy the tokenizer files of the model into the folder again") from None


# Files one of which every transformers tokenizer needs (tokenizer_config.json alone is not enough).
_TOKENIZER_FILES = ("tokenizer.json", "*.model", "vocab.*", "merges.txt", "*.tiktoken")


def load_model(spec: ModelSpec, allow_pickle: bool = False, download: bool = False,
               modeling: str = "auto") -> torch.nn.Module:
    """modeling: [runtime] modeling ("auto": specgen's own model step where `owned` says so)."""
    name, use_safetensors = _locate(spec, allow_pickle, download)
    device = resolve_device(spec)
    config = owned(Path(name), spec, device, use_safetensors, modeling)
    if config is not None:
        return _load_owned(Path(name), spec, config, resolve_dtype(spec, device), device)
    _quiet_transformers()
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": resolve_dtype(spec, device), "use_safetensors": use_safetensors or None,
              **placement(spec, device)}
    try:
        # the loading report, to refuse what transformers would only log (tensors left random) or
        # raise as "look at the above report" that its quieted logging never printed (shapes)
        model, report = _from_pretrained(AutoModelForCausalLM, name, spec, output_loading_info=True,
                                         ignore_mismatched_sizes=True, **kwargs)
    except torch.cuda.OutOfMemoryError as exc:
        raise ModelError(f"out of GPU memory while loading {name}",
                         hint="use a smaller model, dtype = \"bfloat16\", or device_map = \"auto\"") from exc
    except RuntimeError as exc:
        if "loading state_dict" not in str(exc):
            raise
        raise _weights_do_not_match(name, _state_dict_reason(exc)) from None
    _check_report(name, report)
    capped_attention(model)
    return model.eval()


def _check_report(name: str, report: dict) -> None:
    """Weights of another shape than config.json implies, or missing from the files (transformers
    would leave them at random values), as specgen's own model step (core/step/) refuses them."""
    mismatched = sorted(report.get("mismatched_keys") or (), key=lambda entry: entry[0])
    missing = sorted(report.get("missing_keys") or ())
    if mismatched:
        key, stored, wanted = mismatched[0]
        raise _weights_do_not_match(name, _shape_mismatch(key, stored, wanted))
    if missing:
        raise _weights_do_not_match(name, f"{len(missing)} tensors missing, e.g. {missing[0]}")


def _weights_do_not_match(name: str, reason: str) -> ModelError:
    return ModelError(f"{name}: the weights do not match config.json ({reason})",
                      hint="copy or download the checkpoint again")


def _shape_mismatch(key: str, stored, wanted) -> str:
    return f"`{key}` has shape {list(stored)} in the files but config.json implies {list(wanted)}"


_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
                            r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")


def _state_dict_reason(exc: Exception) -> str:
    """torch's "Error(s) in loading state_dict for X:" and a line per problem -> the first problem."""
    found = _SIZE_MISMATCH.search(str(exc))
    if found:
        key, stored, wanted = found.groups()
        return _shape_mismatch(key, [int(n) for n in stored.split(",") if n.strip()],
                               [int(n) for n in wanted.split(",") if n.strip()])
    lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
    return lines[0] if lines else type(exc).__name__


SOFTCAPPED = "specgen_softcapped"  # the attention function capped_attention registers with transformers


def capped_attention(model) -> None:
    """A model whose attention soft-caps its scores (Gemma 2's attn_logit_softcapping) gets
    softcapped_attention below, over SDPA's masks. Why not transformers' own choice: 5.17 loads
    Gemma 2 with SDPA by default, which drops the cap silently (logits 0.2-0.5 off from the second
    token on a tiny Gemma 2), and its eager attention, which caps, builds each call's float mask
    with `torch.tensor(0.0, device=...)`, a host-to-device copy that CUDA-graph capture refuses: the
    runners then ran every step eagerly. SDPA's boolean masks capture, and the scores, cap, mask
    and softmax are eager's ops in eager's order. specgen's own model step caps in its
    attention kernel and its reference (core/step/ops.py)."""
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if not getattr(text, "attn_logit_softcapping", None) or config._attn_implementation == SOFTCAPPED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SOFTCAPPED, _softcapped_interface)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SOFTCAPPED, sdpa_mask)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(SOFTCAPPED)
    else:  # older transformers: the config attribute is what the attention layers read
        model.config._attn_implementation = SOFTCAPPED


def _softcapped_interface(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                          softcap=None, **kwargs):
    """transformers' attention-function protocol -> ([B, q, H, D], None). The sliding window is in
    the mask (SDPA's mask function builds windowed masks for the windowed layers)."""
    return softcapped_attention(module, query, key, value, attention_mask, dropout, scaling, softcap), None


def softcapped_attention(module, query, key, value, mask, dropout: float, scaling, softcap: float) -> torch.Tensor:
    """transformers' Gemma 2 eager attention, op for op in the model's dtype (so a soft-capped
    model's prefill is what its own attention computes), over the mask registered with ours:
    SDPA's (boolean, windows included; None means what SDPA's is_causal does: causal from the top
    left for several query tokens, everything for one). query [B, H, q, D] -> [B, q, H, D]."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else module.head_dim ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap  # [B, H, q, C]
    if mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True):
        mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
    if mask is not None:  # eager adds a float mask of 0 and the dtype's minimum: the same as this fill
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous()


def placement(spec: ModelSpec, device: torch.device) -> dict:
    """from_pretrained's device_map: the profile's, else the whole model on a CUDA device. Given a
    device, transformers reads each tensor from the file straight onto it, several at a time;
    without one it builds the model on the CPU, over the file's pages, and `.to(device)` then
    copies tensor after tensor from there (docs/benchmarks.md, "Start-up of real pairs")."""
    if spec.device_map is not None:
        memory = {int(k) if k.isdigit() else k: int(v) if v.isdigit() else v for k, v in spec.max_memory or ()}
        return {"device_map": spec.device_map, **({"max_memory": memory} if memory else {})}
    return {"device_map": {"": device}} if device.type == "cuda" else {}


def owned(folder: Path, spec: ModelSpec, device: torch.device, use_safetensors: bool,
          modeling: str) -> step_config.StepConfig | None:
    """The checkpoint's config when specgen's own model step runs it (not_owned says when), else None."""
    if not_owned(folder, spec, device, use_safetensors, modeling):
        return None
    return step_config.of(json.loads((folder / "config.json").read_text(encoding="utf-8")))


def not_owned(folder: Path, spec: ModelSpec, device: torch.device, use_safetensors: bool,
              modeling: str) -> str | None:
    """Why transformers runs this checkpoint (one line), or None where specgen's own model step does:
    modeling "auto", on the CPU or GPUs (a device_map that places weights on the CPU or the disk
    leaves them to transformers' offloading), from safetensors, with a config that
    core/step/config.py covers."""
    if modeling != "auto":
        return '[runtime] modeling = "transformers"'
    if not use_safetensors:
        return "pickle weights (no safetensors)"
    if device.type not in ("cpu", "cuda"):
        return f"device {device.type}"
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    reason = step_config.unsupported(data)
    if reason is None and spec.device_map in SPREAD_STRATEGIES:
        offloaded = {d.type for d in _layout(spec, step_config.of(data), resolve_dtype(spec, device)).values()} - {"cuda"}
        if offloaded:
            return f"a device_map that places weights on the {' and the '.join(sorted(offloaded))}"
    return reason


SPREAD_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")  # device_maps planned by max_memory


def _layout(spec: ModelSpec, config: step_config.StepConfig, dtype: torch.dtype) -> dict[str, torch.device]:
    from specgen.core.step.load import spread

    if not torch.cuda.is_available():
        return {"": torch.device("cpu")}
    memory = {int(k) if k.isdigit() else k: int(v) if v.isdigit() else v for k, v in spec.max_memory or ()}
    return spread(config, dtype, spec.device_map, memory or None)


def _load_owned(folder: Path, spec: ModelSpec, config: step_config.StepConfig, dtype: torch.dtype,
                device: torch.device):
    from safetensors import SafetensorError

    from specgen.core.step.load import load

    layout = None
    if spec.device_map in SPREAD_STRATEGIES:
        layout = _layout(spec, config, dtype)
    elif spec.device_map is not None:  # one device named for the whole model
        device = torch.device(spec.device_map)
    try:
        return load(folder, config, dtype, device, layout)
    except SafetensorError as exc:
        raise _damaged(str(folder), exc) from None
    except ValueError as exc:  # a tensor missing, or left over
        raise _weights_do_not_match(str(folder), str(exc)) from None
    except RuntimeError as exc:  # a tensor of another shape than config.json's
        raise _weights_do_not_match(str(folder), _state_dict_reason(exc)) from None
    except OSError as exc:
        raise ModelError(f"could not load {folder}: {exc.strerror or exc}") from None


def new_cache(model):
    """An empty KV cache for `model`: specgen's own models have their own (no transformers import)."""
    if isinstance(model, OwnedModel):
        return GrowingCache(model)
    from transformers import DynamicCache

    return DynamicCache()


def cache_keyword(forward) -> str:
    """The keyword `forward` (a model's or a decoder layer's) takes its KV cache by: `cache` where
    transformers renamed it (5.24, where `past_key_values` still works but warns), else
    `past_key_values` (5.17 to 5.23, the families not renamed yet, and core/step/'s models)."""
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params and "past_key_values" not in params else "past_key_values"


def check_tokenizers(target_tok, draft_tok) -> None:
    """Draft and target must map every shared token id to the same token."""
    target_vocab = target_tok.get_vocab()
    draft_vocab = draft_tok.get_vocab()
    target_by_id = {i: t for t, i in target_vocab.items()}
    for token, index in draft_vocab.items():
        other = target_by_id.get(index)
        if other is not None and other != token:
            raise ModelError(
                f"draft and target tokenizers differ: id {index} is {other!r} in the target "
                f"and {token!r} in the draft",
                hint="use a draft from the same model family (same tokenizer)",
            )
    if abs(len(target_vocab) - len(draft_vocab)) > 0 and not _one_extends_other(target_vocab, draft_vocab):
        raise ModelError(
            f"draft and target tokenizers have different vocabularies "
            f"({len(draft_vocab)} vs {len(target_vocab)} tokens)",
            hint="use a draft from the same model family (same tokenizer)",
        )


def same_tokenizer_files(target: str, draft: str) -> bool:
    """Whether both folders hold the same tokenizer files, byte for byte: then the draft's
    tokenizer is the target's, and needs neither loading nor checking (docs/benchmarks.md,
    "Start-up of real pairs")."""
    def files(folder: Path) -> dict[str, Path]:
        patterns = (*_TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "chat_template.*")
        return {p.name: p for pattern in patterns for p in folder.glob(pattern) if p.is_file()}

    mine, theirs = files(Path(target)), files(Path(draft))
    try:
        return bool(mine) and mine.keys() == theirs.keys() and all(
            mine[name].read_bytes() == theirs[name].read_bytes() for name in mine)
    except OSError:
        return False  # loading the draft's tokenizer then says what is wrong


def _one_extends_other(a: dict, b: dict) -> bool:
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return all(large.get(t) == i for t, i in small.items())


def logits_width(model: torch.nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]


def checkpoint_folder(spec: ModelSpec, allow_pickle: bool = False, download: bool = False) -> str:
    """The local folder of a model's checkpoint (a hub id: its snapshot in the cache)."""
    return _locate(spec, allow_pickle, download)[0]


def beside(draft: ModelSpec, target_spec: ModelSpec, target) -> ModelSpec:
    """The draft's spec, placed on the GPU the target's logits come out of when the target has a
    device_map and the draft's own placement is left to auto: the round runs there, so the draft's
    steps then cross no device."""
    home = target.get_output_embeddings().weight.device
    if draft.device != "auto" or draft.device_map is not None or target_spec.device_map is None or home.type != "cuda":
        return draft
    return replace(draft, device=str(home))


def load_pair(profile: Profile, allow_pickle: bool = False, need_draft: bool | None = None) -> LoadedPair:
    """need_draft: load the [draft] model (None: when the profile's proposer runs it)."""
    threads = cpu_threads(profile.runtime)
    torch.set_num_threads(threads)  # before any model runs
    download, modeling = profile.runtime.download, profile.runtime.modeling
    tokenizer = load_tokenizer(profile.target, allow_pickle, download, modeling)
    target = load_model(profile.target, allow_pickle, download, modeling)
    draft = None
    if need_draft is None:
        need_draft = profile.proposer.uses_draft
    if need_draft and profile.draft is not None:
        if not same_tokenizer_files(checkpoint_folder(profile.target, allow_pickle, download),
                                    checkpoint_folder(profile.draft, allow_pickle, download)):
            check_tokenizers(tokenizer, load_tokenizer(profile.draft, allow_pickle, download, modeling))
        draft = load_model(beside(profile.draft, profile.target, target), allow_pickle, download, modeling)
        if logits_width(draft) < len(tokenizer):
            raise ModelError(
                f"the draft has {logits_width(draft)} output rows but the tokenizer has {len(tokenizer)} tokens"
            )
    if logits_width(target) < len(tokenizer):
        raise ModelError(
            f"the target has {logits_width(target)} output rows but the tokenizer has {len(tokenizer)} tokens"
        )
    device = target.get_output_embeddings().weight.device
    note = None
    if not isinstance(target, OwnedModel):
        name, use_safetensors = _locate(profile.target, allow_pickle, download)
        note = not_owned(Path(name), profile.target, resolve_device(profile.target), use_safetensors, modeling)
    return LoadedPair(target=target, draft=draft, tokenizer=tokenizer, vocab_size=len(tokenizer), device=device,
                      threads=threads, modeling_note=note)
