"""Where the feature store lives on disk and how keys map to file names.

Layout under the store root::

    root/
      CACHEDIR.TAG                       marks the folder as a cache (backup tools skip it)
      index.sqlite (+ -wal, -shm)        entry sizes, recency, hit/miss counters
      .lock                              flock target for writers (put, eviction, clear)
      tmp/                               temporary files of writes in progress
      <spec_key>/<rec_id[:2]>/<rec_id>.gram
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from wavetrain.core.errors import CacheError

ENTRY_SUFFIX = ".gram"
INDEX_NAME = "index.sqlite"
#: Remembered content hashes and audio headers of source files (wavetrain.data.file_facts).
FILE_FACTS_NAME = "files.sqlite"
LOCK_NAME = ".lock"
TMP_DIR = "tmp"
TAG_NAME = "CACHEDIR.TAG"
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This file is a cache directory tag created by wavetrain (feature store).\n"
            "# For information about cache directory tags see https://bford.info/cachedir/\n")

_REC_RE = re.compile(r"[0-9a-fA-F]{8,128}")
_SPEC_RE = re.compile(r"[0-9a-fA-F]{16}")


def default_root() -> Path:
    """The default store folder.

    Returns
    -------
    root : pathlib.Path
        ``$WAVETRAIN_CACHE`` when set and non-empty, else ``$XDG_CACHE_HOME/wavetrain`` when
        ``XDG_CACHE_HOME`` is an absolute path, else ``~/.cache/wavetrain``.
    """
    env = os.environ.get("WAVETRAIN_CACHE", "")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "wavetrain"
    return Path.home() / ".cache" / "wavetrain"


def check_keys(rec_id: str, spec_key: str) -> tuple[str, str]:
    """Validate and normalise (lower-case) a ``(rec_id, spec_key)`` pair.

    Parameters
    ----------
    rec_id : str
        Recording content hash, 8 to 128 hex digits.
    spec_key : str
        FeatureSpec key, exactly 16 hex digits.

    Returns
    -------
    rec_id, spec_key : str
        Both in lower case.

    Raises
    ------
    CacheError
        If either key is not a hex string of the allowed length.
    """
    if not isinstance(rec_id, str) or not _REC_RE.fullmatch(rec_id):
        raise CacheError(f"feature store key rec_id must be a recording content hash of 8 to 128 "
                         f"hex digits; got {rec_id!r}")
    if not isinstance(spec_key, str) or not _SPEC_RE.fullmatch(spec_key):
        raise CacheError(f"feature store key spec_key must be a FeatureSpec key of exactly 16 hex "
                         f"digits; got {spec_key!r}")
    return rec_id.lower(), spec_key.lower()


def entry_file(root: str, rec_id: str, spec_key: str) -> str:
    """Path (str, for speed on the read path) of the entry file of a normalised key pair."""
    return os.path.join(root, spec_key, rec_id[:2], rec_id + ENTRY_SUFFIX)


def entry_path(root: Path, rec_id: str, spec_key: str) -> Path:
    """Path of the entry file of a (normalised) key pair."""
    return Path(entry_file(str(root), rec_id, spec_key))


def is_spec_dir_name(name: str) -> bool:
    """Whether ``name`` is a spec-key folder name (16 lower-case hex digits)."""
    return bool(_SPEC_RE.fullmatch(name)) and name == name.lower()


def iter_entry_files(root: Path):
    """Yield ``(spec_key, rec_id, path)`` for every entry file under ``root``.

    Only names that match the layout are yielded, so a folder that is not a store is never
    touched by callers that delete what this yields.
    """
    try:
        spec_dirs = list(os.scandir(root))
    except FileNotFoundError:
        return
    for sd in spec_dirs:
        if not (sd.is_dir(follow_symlinks=False) and is_spec_dir_name(sd.name)):
            continue
        for pd in os.scandir(sd.path):
            if not (pd.is_dir(follow_symlinks=False) and len(pd.name) == 2):
                continue
            for f in os.scandir(pd.path):
                name = f.name
                if not name.endswith(ENTRY_SUFFIX):
                    continue
                rec = name[: -len(ENTRY_SUFFIX)]
                if _REC_RE.fullmatch(rec) and rec[:2] == pd.name and f.is_file(follow_symlinks=False):
                    yield sd.name, rec, Path(f.path)
