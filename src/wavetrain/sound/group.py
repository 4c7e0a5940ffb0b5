"""A folder per value of a label, each with a metadata.csv of that value's recordings (paths
relative to it), or with copies of the audio (``copy``: each file copied once per folder, its
segment rows kept). Folder names are the values made safe for file systems (characters other
than letters, digits and ``. _ + -`` become ``_``); two values that would share a name are refused.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import copy_atomic, make_folder, refuse_inputs
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording
from wavetrain.sound.common import UniqueNames, labelled, safe_name

__all__ = ["group", "plan_groups"]


def plan_groups(ds: Dataset, label: str) -> tuple[dict[str, list[Recording]], dict[str, str], int]:
    """Recordings per value, each value's folder name, and how many recordings had no value."""
    ds, key, missing = labelled(ds, label)
    by_value: dict[str, list[Recording]] = defaultdict(list)
    for r in ds:
        by_value[r.labels[key]].append(r)
    folders: dict[str, str] = {}
    seen: dict[str, str] = {}
    for v in by_value:
        name = safe_name(v, "value")
        if name.lower() in seen:
            raise UserError(f"--label {label}: values {seen[name.lower()]!r} and {v!r} would share the folder "
                            f"{name!r}; rename one of them")
        seen[name.lower()] = v
        folders[v] = name
    return dict(by_value), folders, missing


def group(ds: Dataset, label: str, out: Path, *, copy: bool = False) -> tuple[dict[str, int], int]:
    """Write ``out/<value>/metadata.csv`` (and copies with ``copy``). Returns counts per value and
    the number of recordings left out for having no value."""
    refuse_inputs([out], input_paths((), ds), option="")     # never over what it reads
    by_value, folders, missing = plan_groups(ds, label)
    for v, recs in by_value.items():
        folder = make_folder(out / folders[v], below=out)
        if copy:
            names = UniqueNames()
            names("metadata", ".csv")
            copied: dict[Path, Path] = {}
            rows = []
            for r in recs:
                src = r.path.resolve()
                if src not in copied:
                    dest = folder / names(safe_name(r.path.stem, "audio"), r.path.suffix.lower())
                    copy_atomic(src, dest, what="audio", sync=False)
                    copied[src] = dest
                rows.append(Recording(copied[src], r.labels, r.tags, r.segment_ms))
            recs = rows
        write_metadata(folder / "metadata.csv", recs)
    return {v: len(r) for v, r in by_value.items()}, missing

