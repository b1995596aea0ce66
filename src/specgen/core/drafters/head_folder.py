"""The folder `specgen train-head` writes (--out): checked before training, written at the end.

Nothing is created before the head is trained, so a run that fails or is interrupted before then
leaves no folder behind. The files are written into a hidden folder inside --out and renamed over
the old ones only once every one of them is complete: a full disk or a failed write leaves an
earlier head there as it was (and removes the folders this run created). No torch here: the
check runs before torch is imported.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from specgen.core.errors import SpecgenError, UsageError

FILES = ("config.json", "model.safetensors", "profile.toml", "report.json")
STAGING = ".train-head-"  # the hidden folder the files are written into first


def check(out: Path) -> None:
    """--out: a new folder (its missing parents are created as well), an empty one, or one an
    earlier train-head wrote, whose files are then replaced. UsageError otherwise."""
    try:
        out.stat()
    except FileNotFoundError:
        _check_writable(out, _nearest_existing(out))
        return
    except OSError as exc:  # a symlink loop, a parent that is a file
        raise UsageError(f"--out {out} cannot be reached ({exc.strerror})", hint="give a folder for the head") from None
    if not out.is_dir():
        raise UsageError(f"--out {out} is a file", hint="give a folder for the head")
    _check_contents(out)
    _check_writable(out, out)


def _check_contents(out: Path) -> None:
    names = {p.name for p in out.iterdir() if not p.name.startswith(STAGING)}
    others = sorted(names - set(FILES))
    if others:
        raise UsageError(f"--out {out} holds other files ({others[0]}, ...)",
                         hint="give a new or empty folder, or one that train-head wrote")
    for name in sorted(names):
        if not (out / name).is_file():
            raise UsageError(f"--out {out}: {name} is not a file, and train-head writes a file of that name",
                             hint="remove it, or give another --out")


def _nearest_existing(out: Path) -> Path:
    """The folder that the first of --out's missing folders would be made in."""
    folder = out.absolute()
    while not folder.exists():
        if folder.is_symlink():
            raise UsageError(f"--out {out}: {folder} is a link to {os.readlink(folder)}, which does not exist",
                             hint="create that folder, or give another --out")
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"--out {out}: {folder} is not a folder", hint="give a folder for the head")
    return folder


def _check_writable(out: Path, folder: Path) -> None:
    try:  # before minutes of training: the head could not be saved
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror})", hint="choose another folder") from None


def write(out: Path, writer: Callable[[Path], None]) -> None:
    """writer(folder) writes FILES into a new folder; they replace those of `out` (created with its
    missing parents) once all are written. SpecgenError, one line, when they cannot be."""
    created = _make_folders(out)
    try:
        staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=out))
        try:
            writer(staging)
            _publish(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException as exc:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
        failure = _os_error(exc)
        if failure is None:
            raise
        raise _write_error(out, failure) from None


def _make_folders(out: Path) -> list[Path]:
    """Creates `out` and its missing parents; returns the folders created, outermost first."""
    missing = [folder for folder in (out, *out.parents) if not folder.exists()][::-1]
    for folder in missing:
        try:
            folder.mkdir()
        except OSError as exc:
            raise _write_error(out, exc) from None
    return missing


def _publish(staging: Path, out: Path) -> None:
    mode = _file_mode()
    for name in FILES:  # every file is complete before the first replaces an old one
        os.chmod(staging / name, mode)
    for name in FILES:
        os.replace(staging / name, out / name)


def _file_mode() -> int:
    """What a new file gets under the process's umask (0644 under the usual 022): temporary files
    are made private (0600), and a server running as another user must read the head."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _os_error(exc: BaseException) -> OSError | None:
    """The operating system's error behind a failed write: an OSError itself, or the one that the
    safetensors library reports in its message ("... (os error 28)"); None for anything else."""
    if isinstance(exc, OSError):
        return exc
    found = re.search(r"\(os error (\d+)\)", str(exc)) if type(exc).__name__ == "SafetensorError" else None
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


def _write_error(out: Path, exc: OSError) -> SpecgenError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpecgenError(f"no space left on {out}: the head could not be saved",
                            hint="make room there, or give another --out (an earlier head there is kept)")
    return SpecgenError(f"cannot write the head to {out}: {exc.strerror or exc}",
                        hint="give another --out (an earlier head there is kept)")

