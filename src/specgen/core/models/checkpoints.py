"""Where a checkpoint or a head lies, told without torch, transformers or huggingface_hub.

Importing torch takes seconds; a path that names nothing is a mistake of the command line or the
profile, and is answered as fast as a mistyped option (docs/errors.md). core/models/loading.py and
core/drafters/head_formats.py load what passes these checks, and give the same messages when a folder
disappears in between.
"""

from __future__ import annotations

import os
from pathlib import Path

from specgen.core.errors import ModelError, UsageError
from specgen.core.settings import ModelSpec

HEAD_HINT = "give the folder that train-head wrote, or an EAGLE-3 head in the speculators or EAGLE-3 format"


def is_local_path(path: str) -> bool:
    """Whether a model path names a folder rather than a hub id (`org/name`)."""
    return os.path.isabs(path) or path.startswith((".", "~")) or os.path.exists(path) or path.count("/") > 1


def hub_cache() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it: HF_HUB_CACHE, else the older
    HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, with HF_HOME defaulting to $XDG_CACHE_HOME/huggingface
    (~/.cache/huggingface)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    home = os.path.expandvars(os.path.expanduser(home))
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def in_hub_cache(repo_id: str) -> bool:
    """Whether the cache holds any snapshot of the model `repo_id` (models--org--name/snapshots/*/).
    False is certain; True leaves the revision and the files to huggingface_hub when loading."""
    snapshots = hub_cache() / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    try:
        return any(entry.is_dir() for entry in snapshots.iterdir())
    except OSError:
        return False


def folder_not_found(spec: ModelSpec, origin: str | None = None) -> ModelError:
    """origin: where the path was given (`--target`, or the profile key and file), for the hint."""
    return ModelError(f"checkpoint folder {spec.path} not found", hint=_fix(origin))


def not_in_hub_cache(spec: ModelSpec, origin: str | None = None) -> ModelError:
    revision = f" at revision {spec.revision}" if spec.revision else ""
    if spec.path.isdigit() and origin == "--draft":  # llama.cpp's --draft N: the tokens to draft
        hint = "--draft takes the draft model (a folder or a cached hub id); the draft tokens per round are --k"
    else:
        hint = f"download it first (`hf download {spec.path}`), pass --download to let specgen fetch it, or give a local folder"
    return ModelError(f"{spec.path}{revision} is neither a local folder nor in the local Hugging Face cache "
                      f"({hub_cache()})", hint=hint)


def _fix(origin: str | None) -> str:
    what = "a checkpoint folder, or a hub id in the local Hugging Face cache"
    if origin is None:
        return f"give {what}"
    if origin.startswith("--"):
        return f"give {origin} {what}"
    return f"set {origin} to {what}"


def check_present(spec: ModelSpec, download: bool, origin: str | None = None) -> None:
    """A local path must be a folder with a config.json; a hub id must be in the local cache unless
    download is on (then fetching it is the loader's first step)."""
    path = os.path.expanduser(spec.path)
    if not is_local_path(path):
        if not download and not in_hub_cache(spec.path):
            raise not_in_hub_cache(spec, origin)
        return
    if not os.path.isdir(path):
        raise folder_not_found(spec, origin)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise no_config(spec)


def no_config(spec: ModelSpec) -> ModelError:
    return ModelError(f"{spec.path} has no config.json: it is not a Hugging Face checkpoint folder")


def check_head_folder(folder: Path) -> None:
    """An EAGLE-3 head's folder must exist and hold a config.json."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "not found"
        raise UsageError(f"head folder {folder} {what}", hint=HEAD_HINT)
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder} has no config.json: it is not an EAGLE-3 head folder", hint=HEAD_HINT)
