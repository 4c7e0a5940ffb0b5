"""Output files: checked before any work, written atomically.

Every file wavetrain writes for a user (a model, a plot, an index) goes through these
functions. :func:`check_output_file` runs before the work that produces the file, so that a
wrong path is refused in one line instead of losing an hour of training at the end; it refuses
to replace anything but a regular file (a device node, a symbolic link, a folder).
:func:`refuse_inputs` is the one guard of every writer against its own inputs: an output that is,
contains or lies inside something the command reads is refused before the first write, whatever
its spelling (``..``, a link, an absolute path).
:func:`write_atomic` writes to a temporary file beside the target and renames it into place, so
a crash or a full disk never leaves a half-written file and removes the temporary one; the
temporary file has a random name and is created exclusively (:func:`open_temporary`), so a link
planted in the folder is never written through. The temporary files of a writer killed outright
(``kill -9``) are removed by the next write into that folder (:func:`remove_stale_temporaries`).
:func:`staged_folder` does for a folder of outputs what :func:`write_atomic` does for a file: the
files are written into a new folder beside it and moved into place at the end, so a full disk or an
error leaves no partial output, and a link planted at a sub-folder is refused, never written through.
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from wavetrain.core.errors import UserError
from wavetrain.core.inputs import file_kind

__all__ = ["IMAGE_SUFFIXES", "OutputError", "ReadFolder", "check_output_file", "check_output_folder", "copy_atomic",
           "make_folder", "open_temporary", "refuse_inputs", "remove_stale_temporaries", "staged_folder",
           "write_atomic"]

#: Image suffixes the plots are written in (matplotlib picks the format from the suffix).
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg")


class OutputError(UserError):
    """An output path that cannot be written, or a write that failed (disk full, read-only)."""


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
        kind = file_kind(st.st_mode)
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
        hint = "; free some space and run again" if e.errno in (errno.ENOSPC, errno.EDQUOT) or _full(p.parent) else ""
        raise OutputError(f"cannot write {what} {p}: {reason}{hint}") from None
    finally:
        if tmp is not None and not done:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def _full(folder: Path) -> bool:
    """Whether the disk of ``folder`` has no space left (a short write says so without an errno)."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except (OSError, AttributeError):
        return False


def copy_atomic(src: str | os.PathLike, dest: str | os.PathLike, *, what: str = "file", sync: bool = True) -> Path:
    """Copy the file ``src`` to ``dest`` as :func:`write_atomic` writes: never through a link
    at ``dest``, never half-written."""
    def copy(f: BinaryIO) -> None:
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 1 << 20)
    return write_atomic(dest, copy, what=what, sync=sync)


#: Flags of a temporary file: created here and now, never through a link.
_TEMP_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
#: This machine in temporary names (no dots, so a name splits back into its parts).
HOST = re.sub(r"[^A-Za-z0-9_-]+", "_", socket.gethostname()) or "host"
#: A temporary name of :func:`temporary_name`: ``.<name>.<host>.<pid>.<16 hex digits>.tmp``.
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>[0-9]+)\.[0-9a-f]{16}\.tmp")
#: A temporary file or folder older than this is stale even when its writer's pid is alive.
STALE_AFTER_S = 24 * 3600.0


def temporary_name(path: str | os.PathLike) -> Path:
    """A new temporary name beside ``path``: ``.<name>.<host>.<pid>.<16 random hex digits>.tmp``
    (the name cut to 100 characters). Unpredictable (64 random bits), and it says which process
    wrote it, so :func:`remove_stale_temporaries` can tell a dead writer's from a live one's."""
    p = Path(path)
    return p.with_name(f".{p.name[:100]}.{HOST}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def open_temporary(path: str | os.PathLike, *, attempts: int = 100) -> tuple[Path, int]:
    """Create a new, empty temporary file beside ``path`` for writing.

    The name is :func:`temporary_name`'s, so no other process can plan for it; the file is
    opened with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so an existing file or link of that name is
    never opened, and its permissions are those of any new file (``0o666`` less the umask).
    Stale temporary files of dead writers in that folder are removed first (once per folder and
    process).

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
    remove_stale_temporaries(p.parent)
    for _ in range(attempts):
        tmp = temporary_name(p)
        try:
            return tmp, os.open(tmp, _TEMP_FLAGS, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(p.parent))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


#: Folders already cleaned by this process (:func:`remove_stale_temporaries`).
_CLEANED: set[str] = set()


def remove_stale_temporaries(folder: str | os.PathLike, *, force: bool = False) -> int:
    """Remove the temporary files (and staged folders) that killed writers left in ``folder``.

    Only names of :func:`temporary_name`'s form are touched, only regular files and folders
    owned by this user (a link of that name is left alone, never followed), and only stale ones:
    written on this machine by a process that no longer exists, or older than
    :data:`STALE_AFTER_S` (a temporary of another machine sharing the folder). A folder is
    scanned once per process unless ``force``.

    Returns
    -------
    int
        How many were removed.
    """
    key = os.path.abspath(folder)
    if key in _CLEANED and not force:
        return 0
    _CLEANED.add(key)
    removed = 0
    try:
        entries = list(os.scandir(key))
    except OSError:
        return 0
    now, uid = time.time(), os.getuid() if hasattr(os, "getuid") else None
    for e in entries:
        m = _TEMP_NAME.fullmatch(e.name)
        if m is None:
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode) or (uid is not None and st.st_uid != uid):
                continue
            here, pid = m["host"] == HOST, int(m["pid"])
            if here and pid == os.getpid():
                continue
            if not ((here and not pid_alive(pid)) or now - st.st_mtime > STALE_AFTER_S):
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(e.path)
            elif stat.S_ISREG(st.st_mode):
                os.unlink(e.path)
            else:
                continue
            removed += 1
        except OSError:
            continue
    return removed


def make_folder(path: str | os.PathLike, *, below: str | os.PathLike, option: str = "-o") -> Path:
    """Create the folder ``path`` (and its missing parents) inside the existing folder ``below``,
    refusing any part of it below ``below`` that is a symbolic link or not a folder: a link
    planted at a sub-folder of an output would send the files written there elsewhere.

    Raises
    ------
    OutputError
        A part of the path is a link or a file, or it cannot be created.
    """
    base, p = Path(below), Path(path)
    try:
        parts = p.relative_to(base).parts
    except ValueError:
        raise OutputError(f"{option} {p}: not inside {base}") from None
    here = base
    for part in parts:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            try:
                os.mkdir(here)
            except FileExistsError:
                st = os.lstat(here)
            except OSError as e:
                raise OutputError(f"{option} {base}: cannot create {here} ({e.strerror})") from None
            else:
                continue
        if stat.S_ISLNK(st.st_mode):
            raise OutputError(f"{option} {base}: {here} is a symbolic link; wavetrain writes only into folders of "
                              "its own output, so remove the link or write elsewhere")
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{option} {base}: {here} exists and is not a folder; remove it or write elsewhere")
    return p


@contextmanager
def staged_folder(out: str | os.PathLike, *, option: str = "-o") -> Iterator[Path]:
    """Write a folder of outputs as a whole: yield a new, empty folder beside ``out`` (a
    :func:`temporary_name` in the folder that really holds ``out``, so relative paths written in it
    hold after the move); when the block ends without an error, move its content into ``out`` (the
    folder renamed into place when ``out`` does not exist; otherwise each file moved in, replacing
    files of the same names); on an error, remove it. A full disk or an interrupted run leaves
    ``out`` as it was. Missing folders above ``out`` are created.

    Before anything is moved, every folder of ``out`` that the staged files go into is checked: a
    symbolic link or a file where a folder is to be is refused (nothing is moved), so files are
    never written through a link planted at a sub-folder.

    Raises
    ------
    OutputError
        The folder beside ``out`` cannot be created, or a sub-folder of ``out`` is a link or a file.
    """
    real = Path(os.path.realpath(out))
    stage = temporary_name(real)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(real.parent)
        os.mkdir(stage, 0o777)
    except OSError as e:
        raise OutputError(f"{option} {out}: cannot create a folder beside it in {real.parent} ({e.strerror}); "
                          "give an output folder inside a writable folder") from None
    try:
        yield stage
        if not os.path.lexists(real):
            os.rename(stage, real)
            return
        _check_merge(stage, real, option, out)
        _merge(stage, real)
    except OSError as e:
        reason = e.strerror or str(e)
        hint = "; free some space and run again" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise OutputError(f"cannot write {option} {out}: {reason}{hint}") from None
    except OutputError as e:        # (a file's error, named by its final place)
        raise OutputError(str(e).replace(str(stage), str(out))) from None
    finally:
        if os.path.lexists(stage):
            shutil.rmtree(stage, ignore_errors=True)


def _check_merge(stage: Path, dest: Path, option: str, shown: str | os.PathLike) -> None:
    """Refuse, before anything moves, a destination of a staged folder that is a link or a file
    where a folder is, or a folder where a file is."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise OutputError(f"{option} {shown}: {dest} is {what}; wavetrain writes only into folders of its own "
                          "output, so remove it or write elsewhere")
    for e in os.scandir(stage):
        target = dest / e.name
        if e.is_dir(follow_symlinks=False):
            _check_merge(Path(e.path), target, option, shown)
        else:
            try:
                tst = os.lstat(target)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(tst.st_mode):
                raise OutputError(f"{option} {shown}: {target} is a folder where a file is to be written; "
                                  "remove it or write elsewhere")


def _merge(stage: Path, dest: Path) -> None:
    """Move the content of ``stage`` into the existing folder ``dest`` (checked by _check_merge)."""
    for e in os.scandir(stage):
        target = dest / e.name
        if e.is_dir(follow_symlinks=False) and os.path.lexists(target):
            _merge(Path(e.path), target)
        else:
            os.replace(e.path, target)


def _realpath(path: str | os.PathLike, folders: dict[str, str]) -> str:
    """``os.path.realpath(path)``, resolving each folder once (``folders`` caches them): one
    ``lstat`` per file of a data set instead of one per path component."""
    head, name = os.path.split(os.fspath(path))
    if name in ("", ".", ".."):
        return os.path.realpath(path)
    if head not in folders:
        folders[head] = os.path.realpath(head or ".")
    full = os.path.join(folders[head], name)
    return os.path.realpath(full) if os.path.islink(full) else full


def _within(inner: str, outer: str) -> bool:
    """Whether the real path ``inner`` lies inside the real folder ``outer``."""
    return inner.startswith(outer if outer.endswith(os.sep) else outer + os.sep)


@dataclass(frozen=True)
class ReadFolder:
    """An input folder read by listing it — a folder of class sub-folders, or of audio files: the
    command reads every sub-folder of it and each file with one of ``suffixes``, so a folder
    written inside it, or a file with one of those suffixes, would be read with it next time; a
    file of another kind beside them (a model, a csv of predictions) would not."""

    path: str | os.PathLike
    suffixes: tuple[str, ...]

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)


def refuse_inputs(outputs: Iterable[str | os.PathLike] | Mapping[str | os.PathLike, str],
                  inputs: Iterable[str | os.PathLike], *, option: str = "-o", files: bool = False) -> None:
    """Refuse, before anything is written, an output that is, contains or lies inside an input.

    The one guard of every writer (the commands, the Python API's writers, Spark's outputs).
    Real paths are compared (links and ``..`` resolved), so another spelling or a link to an
    input is caught too. ``--overwrite`` never lifts this: it replaces earlier outputs only.

    Parameters
    ----------
    outputs : iterable of path-like, or mapping of path-like to str
        Every file or folder the writer will write (folders: everything written inside them); a
        mapping gives each the option it came from (named in the message).
    inputs : iterable of path-like or ReadFolder
        Every file or folder it reads (a data set's: :func:`wavetrain.data.dataset.input_paths`);
        a :class:`ReadFolder` takes in only folders and files of its suffixes written inside it.
    option : str, default='-o'
        How the user gave the outputs, where ``outputs`` does not say ('' for a Python call).
    files : bool, default=False
        The outputs are files (not folders): one inside a :class:`ReadFolder` is refused only when
        it has one of the folder's suffixes.

    Raises
    ------
    OutputError
        In one line naming the output and the input.
    """
    named = outputs.items() if isinstance(outputs, Mapping) else ((o, option) for o in outputs)
    outs = {os.path.realpath(o): (o, opt) for o, opt in named}
    if not outs:
        return
    seen: set[str] = set()
    folders: dict[str, str] = {}
    for given in inputs:
        real = _realpath(given, folders)
        if real in seen:
            continue
        seen.add(real)
        for real_out, (shown, opt) in outs.items():
            if real_out == real:
                how = "is the input"
            elif _within(real, real_out):
                how = "contains the input"
            elif _within(real_out, real) and not (files and isinstance(given, ReadFolder) and
                                                  Path(real_out).suffix.lower() not in given.suffixes):
                how = "lies inside the input"
            else:
                continue
            output = f"{opt} {shown}" if opt else str(shown)
            raise OutputError(f"{output}: {how} {given}; write the output elsewhere (--overwrite never "
                              "replaces what a command reads)")


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
