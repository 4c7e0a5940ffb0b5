"""Output files: checked before any work, written atomically.

Every file wavetrain writes for a user (a model, a plot, an index) goes through these two
functions. :func:`check_output_file` runs before the work that produces the file, so that a
wrong path is refused in one line instead of losing an hour of training at the end; it refuses
to replace anything but a regular file (a device node, a symbolic link, a folder).
:func:`write_atomic` writes to a temporary file beside the target and renames it into place, so
a crash or a full disk never leaves a half-written file and removes the temporary one; the
temporary file has a random name and is created exclusively (:func:`open_temporary`), so a link
planted in the folder is never written through.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from wavetrain.core.errors import UserError

__all__ = ["IMAGE_SUFFIXES", "OutputError", "check_output_file", "check_output_folder", "open_temporary",
           "write_atomic"]

#: Image suffixes the plots are written in (matplotlib picks the format from the suffix).
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg")


class OutputError(UserError):
    """An output path that cannot be written, or a write that failed (disk full, read-only)."""


def _describe(st: os.stat_result) -> str | None:
    """What a non-regular file is, or None for a regular file."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _probe_writable(folder: Path, shown: str) -> None:
    """Create and remove an empty file in ``folder``: the only test that a read-only mount, a
    permission or a full inode table fails the same way the real write would."""
    probe = folder / f".wavetrain-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    except OSError as e:
        raise OutputError(f"{shown}: cannot write in {folder} ({e.strerror}); give a writable "
                          "location") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def check_output_file(path: str | os.PathLike, *, option: str = "-o",
                      suffixes: tuple[str, ...] | None = None, example: str = "model.wt") -> Path:
    """Check, before any work, that ``path`` can be written as a regular file.

    Parameters
    ----------
    path : path-like
        The file to write; it may exist (a regular file is replaced).
    option : str, default='-o'
        How the user gave the path (named in messages).
    suffixes : tuple of str, optional
        Allowed suffixes (lower case, with the dot), e.g. ``('.png', '.svg')``.
    example : str
        A file name shown in messages.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    OutputError
        Empty path, a folder, a device, a symbolic link or another non-regular file, a missing
        or read-only folder, or a wrong suffix.
    """
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputError(f"{option}: empty path; give a file name such as {example}")
    p = Path(text)
    shown = f"{option} {text}"
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):   # (the folder check below says which)
        st = None
    except OSError as e:
        raise OutputError(f"{shown}: cannot be used ({e.strerror})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise OutputError(f"{shown}: is a symbolic link; wavetrain replaces only regular files, "
                              "so give the link's target or another name")
        kind = _describe(st)
        if kind == "a folder":
            raise OutputError(f"{shown}: is a folder; give a file name, e.g. {p / example}")
        if kind is not None:
            raise OutputError(f"{shown}: is {kind}; wavetrain replaces only regular files")
    if suffixes and p.suffix.lower() not in suffixes:
        raise OutputError(f"{shown}: expected a file name ending in {', '.join(suffixes)}")
    folder = p.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise OutputError(f"{shown}: {folder} {what}; create the folder first")
    _probe_writable(folder, shown)
    return p


def check_output_folder(path: str | os.PathLike, *, option: str = "-o") -> Path:
    """Check, before any work, that ``path`` is a writable folder or can be created as one (with
    its parents); nothing is created (the writer creates it when it has something to write).

    Raises
    ------
    OutputError
        Empty path, an existing non-folder, or a location that cannot be written.
    """
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputError(f"{option}: empty path; give a folder name")
    p = Path(text)
    shown = f"{option} {text}"
    if p.is_symlink() and not p.is_dir():
        raise OutputError(f"{shown}: is a symbolic link that does not lead to a folder")
    existing = p
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "exists and is not a folder" if existing == p else f"{existing} is not a folder"
        raise OutputError(f"{shown}: {what}; give a folder path")
    _probe_writable(existing, shown)
    return p


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], *,
                 what: str = "file", sync: bool = True) -> Path:
    """Write ``path`` through ``write(fileobj)`` into a temporary file beside it, then rename it
    into place; the temporary file is removed on any failure. With ``sync`` the file and then its
    folder are flushed to disk, so that after a power cut the path holds the old file or the new
    one, never an empty one.

    The temporary file has an unpredictable name (``.<name>.<random>.tmp``) and is created
    exclusively without following links (:func:`open_temporary`): a link or file planted in the
    folder is never written through, and the rename replaces the directory entry itself, so the
    output is always a regular file.

    Raises
    ------
    OutputError
        When the file cannot be written (disk full, read-only, permission), in one line.
    """
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise OutputError(f"{p}: is not a regular file; wavetrain replaces only regular files")
    tmp: Path | None = None
    done = False
    try:
        tmp, fd = open_temporary(p)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, p)
        done = True
        if sync:
            _sync_folder(p.parent)
    except OSError as e:
        reason = e.strerror or str(e)
        hint = "; free some space and run again" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise OutputError(f"cannot write {what} {p}: {reason}{hint}") from None
    finally:
        if tmp is not None and not done:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


#: Flags of a temporary file: created here and now, never through a link.
_TEMP_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def open_temporary(path: str | os.PathLike, *, attempts: int = 100) -> tuple[Path, int]:
    """Create a new, empty temporary file beside ``path`` for writing.

    The name is ``.<name>.<16 random hex digits>.tmp`` (the name cut to 100 characters), so no
    other process can plan for it; the file is opened with ``O_CREAT | O_EXCL | O_NOFOLLOW``,
    so an existing file or link of that name is never opened, and its permissions are those of
    any new file (``0o666`` less the umask).

    Parameters
    ----------
    path : path-like
        The file the temporary one will be renamed to.
    attempts : int, default=100
        Names tried before giving up (each taken name is a collision of 64 random bits).

    Returns
    -------
    (pathlib.Path, int)
        The temporary file and its open descriptor (the caller closes it).

    Raises
    ------
    OSError
        When the folder cannot be written, or every name tried was taken.
    """
    p = Path(path)
    for _ in range(attempts):
        tmp = p.with_name(f".{p.name[:100]}.{secrets.token_hex(8)}.tmp")
        try:
            return tmp, os.open(tmp, _TEMP_FLAGS, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(p.parent))


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
