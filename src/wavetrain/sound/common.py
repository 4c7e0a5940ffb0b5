"""What the sound tools share: output checks (never replace without ``overwrite``), ranges,
file names and the relative path of a source file. (The guard against writing over an input is
:func:`wavetrain.core.outputs.refuse_inputs`, with a data set's paths from
:func:`wavetrain.data.dataset.input_paths`.)"""
from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.outputs import OutputError, check_output_file, check_output_folder
from wavetrain.data.dataset import Dataset

#: wav subtypes kept when a tool writes audio derived from a file of that subtype.
KEPT_SUBTYPES = ("PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")


def prepare_files(paths: Iterable[str | os.PathLike], *, overwrite: bool, option: str = "-o",
                  example: str = "metadata.csv", make_folders: bool = False) -> list[Path]:
    """Check output files before any work: each must be writable and, unless ``overwrite``, absent;
    with ``make_folders``, a missing folder of one is created (checked as an output folder is)."""
    out = []
    for path in paths:
        parent = Path(path).parent
        if make_folders and not parent.exists():
            check_output_folder(parent, option=option).mkdir(parents=True, exist_ok=True)
        p = check_output_file(path, option=option, example=example)
        if p.exists() and not overwrite:
            raise OutputError(f"{option} {path}: {p} exists; add --overwrite to replace it")
        out.append(p)
    return out


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def check_labels(labels: Mapping[str, str], where: str, what: str = "labels") -> None:
    """Refuse labels that a metadata.csv would not give back as they are.

    :func:`wavetrain.data.metadata.read_metadata` refuses a file holding a NUL byte or a cell
    longer than :func:`csv.field_size_limit`, and splits the labels cell at ``;`` and each pair
    at its first ``=``; so a name must be non-empty without ``;`` or ``=``, a value without
    ``;``, neither may hold a control character (NUL, a line break), and all the pairs together
    must fit in one cell.

    Raises
    ------
    UserError
        In one line naming ``where`` and the offending name or value.
    """
    for k, v in labels.items():
        for kind, text in (("name", k), ("value", v)):
            bad = _CONTROL.search(text)
            if bad:
                raise UserError(f"{where}: {what} {kind} {text[:40]!r} holds the control character "
                                f"{bad.group()!r}; metadata.csv cannot carry it")
        if not k.strip() or ";" in k or "=" in k:
            raise UserError(f"{where}: {what} name {k[:40]!r} is empty or holds ';' or '='; expected a plain name")
        if ";" in v:
            raise UserError(f"{where}: {what} value {v[:40]!r} holds ';', which separates the pairs of a "
                            "metadata.csv; use another character")
    size = sum(len(k) + len(v) + 2 for k, v in labels.items())
    if size > csv.field_size_limit():
        raise UserError(f"{where}: {what} of {size} characters; a metadata.csv cell holds at most "
                        f"{csv.field_size_limit()}")


def parse_range(text: str, option: str, *, low: float | None = None, high: float | None = None,
                above: float | None = None) -> tuple[float, float]:
    """``'5:20'`` -> ``(5.0, 20.0)``; a single number is a fixed value. Checks ``lo <= hi`` and
    the limits (``low <= v <= high``, ``v > above``)."""
    parts = str(text).split(":")
    try:
        if len(parts) == 1:
            lo = hi = float(parts[0])
        elif len(parts) == 2:
            lo, hi = float(parts[0]), float(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ParameterError(f"{option} {text}: expected LO:HI or one number (e.g. {option} 5:20)") from None
    if not (lo == lo and hi == hi) or abs(lo) == float("inf") or abs(hi) == float("inf"):
        raise ParameterError(f"{option} {text}: expected finite numbers")
    if lo > hi:
        raise ParameterError(f"{option} {text}: the range ends before it starts; expected LO <= HI "
                             f"(e.g. {option} {hi:g}:{lo:g})")
    if low is not None and lo < low:
        raise ParameterError(f"{option} {text}: expected values >= {low:g}")
    if high is not None and hi > high:
        raise ParameterError(f"{option} {text}: expected values <= {high:g}")
    if above is not None and lo <= above:
        raise ParameterError(f"{option} {text}: expected values > {above:g}")
    return lo, hi


def require(ds: Dataset, what: str) -> Dataset:
    """Refuse an empty selection in one line."""
    if len(ds) == 0:
        raise UserError(f"{what}: no recording left to work on")
    return ds


def labelled(ds: Dataset, label: str) -> tuple[Dataset, str, int]:
    """The recordings with a value for ``label`` (the label must exist), its key, and how many had none."""
    key = ds.resolve_label(label)
    out = ds.labelled(label)
    if len(out) == 0:
        raise UserError(f"--label {label}: no recording has a value for it")
    return out, key, len(ds) - len(out)


_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_name(text: str, fallback: str = "x") -> str:
    """A file or folder name made of ``text`` (letters, digits, ``. _ + -``; others become ``_``)."""
    name = _UNSAFE.sub("_", str(text)).strip("._") or fallback
    return name[:100]


class UniqueNames:
    """Hands out file names, adding ``-2``, ``-3``... where one was given already (case-insensitively)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, stem: str, suffix: str) -> str:
        name, n = f"{stem}{suffix}", 1
        while name.lower() in self.used:
            n += 1
            name = f"{stem}-{n}{suffix}"
        self.used.add(name.lower())
        return name


def relative(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder`` (absolute where no relative path exists), ``/`` separated."""
    try:
        rel = os.path.relpath(path.resolve(), folder.resolve())
    except ValueError:
        rel = str(path.resolve())
    return rel.replace(os.sep, "/")


def tag_value(text: str) -> str:
    """A value that survives the metadata.csv tags column (no ``;`` or ``=``)."""
    return str(text).replace(";", "_").replace("=", "_")


def wav_subtype(subtype: str) -> str:
    return subtype if subtype in KEPT_SUBTYPES else "PCM_16"
