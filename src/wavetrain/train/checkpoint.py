"""Training checkpoints: one file per run folder, written atomically, read without pickle.

A checkpoint holds tensors and plain Python values only (dicts, lists, numbers, strings), saved
with ``torch.save`` and read with ``torch.load(weights_only=True)``: loading never runs code.
The write goes to a temporary file in the same folder, is fsync'ed, then ``os.replace``'d over
``checkpoint.pt``, so a run killed at any moment leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from wavetrain.core.errors import ModelFileError
from wavetrain.core.inputs import check_input_file
from wavetrain.core.outputs import write_atomic

FILENAME = "checkpoint.pt"
CHECKPOINT_VERSION = 1


def checkpoint_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / FILENAME


def save_checkpoint(folder: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``folder/checkpoint.pt`` atomically and durably; creates the folder."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return write_atomic(folder / FILENAME, lambda f: torch.save({"version": CHECKPOINT_VERSION, **state}, f),
                        what="checkpoint")


def load_checkpoint(folder: str | os.PathLike) -> dict[str, Any] | None:
    """Read ``folder/checkpoint.pt``; ``None`` when there is none yet (no folder, or no file in it).

    Raises
    ------
    ModelFileError
        ``folder`` is not a folder, or its ``checkpoint.pt`` is no regular file (a named pipe, a
        device: never opened) or not a readable checkpoint of this version: one line, never a run
        that silently starts over.
    """
    path = checkpoint_path(folder)
    if not os.path.lexists(folder):
        return None
    if stat.S_ISREG(check_input_file(folder, "checkpoint folder", ModelFileError, folder_ok=True).st_mode):
        raise ModelFileError(f"{folder}: is a file; give the checkpoint folder (the one holding {FILENAME})")
    if not os.path.lexists(path):
        return None
    check_input_file(path, "checkpoint", ModelFileError)
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise ModelFileError(f"{path}: not a readable wavetrain checkpoint ({type(e).__name__}: {str(e)[:120]}); "
                             f"delete it to start over") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        raise ModelFileError(f"{path}: not a wavetrain checkpoint of version {CHECKPOINT_VERSION}")
    return state
