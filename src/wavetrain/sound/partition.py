"""Stratified, group-safe splits of a data set into parts (``part1``...) or ``train``/``test``.

Splits are of whole groups: the ``group_by`` label's values, else audio files (all segments of
a file on one side); groups that share identical audio are merged (the grouping of
:mod:`wavetrain.data.splits`), so identical audio never lands on two sides.

* ``parts=N``: :func:`wavetrain.data.splits.kfold_indices` stratified by the label;
* ``ratio=r``: groups in order of size (largest first, ties in ``seed`` order), each to the side
  that brings every value's test count closest to ``(1 - r)`` times its count; without
  ``group_by`` every value's test count is its target rounded (within one recording of it).

``balance`` then downsamples each part to equal counts per value (the rarest value's count in that
part, recordings drawn with ``seed``).
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.outputs import make_folder, refuse_inputs
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import write_metadata
from wavetrain.data.splits import _groups, kfold_indices
from wavetrain.sound.common import labelled

__all__ = ["Partition", "partition", "ratio_split", "remove_stale_parts", "write_partition"]


@dataclass
class Partition:
    """Named parts (``part1``... or ``train``/``test``) of indices into ``dataset``."""

    dataset: Dataset
    label: str
    parts: dict[str, np.ndarray]
    dropped: int = 0              # recordings without a value of the label
    group_by: str | None = None   # the label whose values went whole to one part

    def counts(self, name: str) -> Counter:
        return Counter(self.dataset[int(i)].labels[self.label] for i in self.parts[name])

    def summary(self) -> str:
        sizes = ", ".join(f"{name} {len(idx)}" for name, idx in self.parts.items())
        values = len({r.labels[self.label] for r in self.dataset})
        more = f"; {self.dropped} without a value of {self.label} left out" if self.dropped else ""
        return f"partition: {sizes} recordings; {values} values of {self.label}{more}{self._groups()}"

    def _groups(self) -> str:
        """Which ``group_by`` values went to each part (but ``train``: ``; test speaker: a, b``)."""
        if not self.group_by:
            return ""
        key = self.dataset.resolve_label(self.group_by)
        out = []
        for name, idx in self.parts.items():
            if name == "train":
                continue
            values = sorted({str(self.dataset[int(i)].labels.get(key)) for i in idx})
            out.append(f"{name} {self.group_by}: {', '.join(values)}")
        return "; " + "; ".join(out)


def partition(ds: Dataset, label: str, *, parts: int | None = None, ratio: float | None = None,
              group_by: str | None = None, balance: bool = False, seed: int = 0) -> Partition:
    """Split ``ds`` (its recordings with a value of ``label``) into stratified parts of whole groups."""
    if (parts is None) == (ratio is None):
        raise ParameterError("partition: give either --parts N or --ratio R")
    ds, key, dropped = labelled(ds, label)
    if ratio is not None:
        train, test = ratio_split(ds, key, ratio, group_by=group_by, seed=seed)
        named = {"train": train, "test": test}
    else:
        assert parts is not None
        folds = kfold_indices(ds, parts, group_by=group_by, seed=seed, stratify=key)
        named = {f"part{i + 1}": f for i, f in enumerate(folds)}
    if balance:
        rng = np.random.default_rng(seed)
        named = {name: _balanced(ds, key, idx, rng) for name, idx in named.items()}
    return Partition(ds, key, named, dropped, group_by)


def ratio_split(ds: Dataset, key: str, ratio: float, *, group_by: str | None = None,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)``: about ``ratio`` of each value's recordings in train, whole groups."""
    if not 0 < ratio < 1:
        raise ParameterError(f"--ratio {ratio}: expected a fraction between 0 and 1 (e.g. 0.8)")
    groups = _groups(ds, group_by)
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    if len(members) < 2:
        what = f"value of {group_by!r}" if group_by else "audio file"
        raise UserError(f"--ratio {ratio}: only one {what}; a split needs at least two")
    values = sorted({ds[i].labels[key] for i in range(len(ds))})
    col = {v: c for c, v in enumerate(values)}
    counts = {g: np.bincount([col[ds[i].labels[key]] for i in idx], minlength=len(values))
              for g, idx in members.items()}
    target = (1.0 - ratio) * sum(counts.values())
    keys = list(members)
    np.random.default_rng(seed).shuffle(keys)
    keys.sort(key=lambda g: -len(members[g]))           # stable: seed order among equal sizes
    test_counts = np.zeros(len(values))
    test: list[int] = []
    train: list[int] = []
    for g in keys:
        gain = np.abs(test_counts + counts[g] - target).sum() - np.abs(test_counts - target).sum()
        if gain < 0:
            test_counts += counts[g]
            test.extend(members[g])
        else:
            train.extend(members[g])
    if not test or not train:
        side = "test" if not test else "train"
        raise UserError(f"--ratio {ratio}: the {side} side would be empty with {len(members)} groups; "
                        "use a ratio nearer 0.5 or more recordings")
    return np.array(sorted(train), dtype=np.int64), np.array(sorted(test), dtype=np.int64)


def _balanced(ds: Dataset, key: str, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    by_value: dict[str, list[int]] = defaultdict(list)
    for i in idx:
        by_value[ds[int(i)].labels[key]].append(int(i))
    if not by_value:
        return idx
    n = min(len(v) for v in by_value.values())
    keep: list[int] = []
    for v in sorted(by_value):
        chosen = rng.choice(len(by_value[v]), size=n, replace=False)
        keep.extend(by_value[v][j] for j in chosen)
    return np.array(sorted(keep), dtype=np.int64)


def write_partition(p: Partition, out: Path) -> list[Path]:
    """``out/<part>/metadata.csv`` for each part, referencing the original audio by relative path."""
    refuse_inputs([out], input_paths((), p.dataset), option="")     # never over what it reads
    written = []
    for name, idx in p.parts.items():
        folder = make_folder(out / name, below=out)
        csv = folder / "metadata.csv"
        write_metadata(csv, (p.dataset[int(i)] for i in idx))
        written.append(csv)
    return written


#: Names of the part folders :func:`write_partition` writes.
PART_NAME = re.compile(r"part[1-9][0-9]*|train|test")


def remove_stale_parts(out: Path, p: Partition) -> list[Path]:
    """Remove the parts an earlier run wrote into ``out`` that ``p`` does not have (``part3`` of
    a three-part run rewritten with two parts): only a part folder that holds nothing but its
    metadata.csv is removed, so nothing else is ever deleted. Returns the folders removed."""
    removed = []
    for folder in sorted(out.iterdir()):
        if folder.name in p.parts or not PART_NAME.fullmatch(folder.name):
            continue
        if folder.is_symlink() or not folder.is_dir():
            continue
        if [f.name for f in folder.iterdir()] != ["metadata.csv"] or not (folder / "metadata.csv").is_file():
            continue
        (folder / "metadata.csv").unlink()
        folder.rmdir()
        removed.append(folder)
    return removed
