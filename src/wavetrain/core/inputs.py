"""What a user names as an input file must be a regular file.

Opening a named pipe (FIFO) blocks until something writes to it, and a device or a socket is no
file to read a model, a spec or a recording from: :func:`check_input_file` looks at the path with
``os.stat`` (which never blocks) before anything opens it, and refuses all of them in one line.
Every reader of a user-named input file (a model, a graph, a checkpoint, a TOML spec, a
recording, ``info``'s paths) calls it first.
"""
from __future__ import annotations

import os
import stat

from wavetrain.core.errors import UserError

__all__ = ["check_input_file", "file_kind"]


def file_kind(mode: int) -> str | None:
    """What a path of this ``st_mode`` is, for a message (``"a folder"``, ``"a named pipe
    (FIFO)"``...), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _a(what: str) -> str:
    return f"{'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"


def check_input_file(path: str | os.PathLike, what: str = "file", error: type[UserError] = UserError, *,
                     folder_ok: bool = False, missing: str | None = None) -> os.stat_result:
    """The ``os.stat`` of ``path`` when it is a regular file (or a folder, with ``folder_ok``),
    else one line, raised as ``error``: not found, a folder where a file is expected, or a named
    pipe, a device or a socket (never opened: reading one can block forever).

    Parameters
    ----------
    path : path-like
        The input, as the user named it (symbolic links are followed).
    what : str
        What the input should be, for the messages (``"model file"``, ``"audio file"``...).
    error : type of UserError
        The error raised (the caller's own kind: ``ModelFileError``, ``AudioError``...).
    folder_ok : bool
        Accept a folder too (``info`` takes a data set's folder or a model file).
    missing : str, optional
        The message's words for a path that does not exist (default ``"<what> not found"``).
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(f"{p}: {missing or what + ' not found'}") from None
    except (OSError, ValueError) as e:    # (ValueError: a NUL in the path)
        raise error(f"{p}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if stat.S_ISREG(st.st_mode) or (folder_ok and stat.S_ISDIR(st.st_mode)):
        return st
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{p}: is a folder, expected {_a(what)}")
    raise error(f"{p}: is {file_kind(st.st_mode)}, expected {_a(what)}; wavetrain reads regular files only "
                "(a pipe or a device could block it forever)")
