"""A :class:`Dataset` is a list of recordings from a metadata.csv, a folder of class
sub-folders, or single files, with labels from the metadata, the sub-folders or the files' names.
It describes the data and never holds samples."""
from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from wavetrain.core.errors import AudioError, MetadataError, UserError
from wavetrain.core.outputs import ReadFolder
from wavetrain.core.progress import progress_bar
from wavetrain.data.audio import AUDIO_EXTENSIONS
from wavetrain.data.metadata import read_metadata
from wavetrain.data.name_labels import NamePattern, suggest_pattern
from wavetrain.data.recording import Recording

#: Label name given to the sub-folder of a folder data set without metadata.csv.
FOLDER_LABEL = "class"


@dataclass
class Dataset:
    """An ordered collection of :class:`Recording`.

    Attributes
    ----------
    recordings : list of Recording
    root : Path
        The csv or folder it came from.
    folder_labels : bool
        A folder of class sub-folders: the label ``class`` answers to any label name the
        recordings do not have.
    skipped : list of (Recording or path, str)
        Recordings dropped by ``skip_bad`` and why.
    """

    recordings: list[Recording]
    root: Path
    folder_labels: bool = False
    skipped: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.recordings)

    def __iter__(self) -> Iterator[Recording]:
        return iter(self.recordings)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Dataset(self.recordings[i], self.root, self.folder_labels)
        return self.recordings[i]

    def subset(self, indices: Iterable[int]) -> Dataset:
        return Dataset([self.recordings[i] for i in indices], self.root, self.folder_labels)

    def filter(self, pred: Callable[[Recording], bool]) -> Dataset:
        return Dataset([r for r in self.recordings if pred(r)], self.root, self.folder_labels)

    # -- labels ---------------------------------------------------------------------------------
    def label_names(self) -> list[str]:
        names: dict[str, None] = {}
        for r in self.recordings:
            for k in r.labels:
                names.setdefault(k, None)
        return list(names)

    def resolve_label(self, name: str) -> str:
        """Check that ``name`` is a label of this data set (folder sets accept any name: their
        sub-folder's, unless the recordings have a label of that name); a data set without labels
        is told how to give them from the files' names."""
        names = self.label_names()
        if name in names:
            return name
        if self.folder_labels:
            return FOLDER_LABEL
        hint = ""
        if not names and self.recordings:
            example = self.recordings[0].path
            hint = (f"; give labels with --labels-from-name '{suggest_pattern(example.stem, name)}' (the files' "
                    f"names look like {example.name}; name a field to make it a label, {{_}} skips a part)")
        raise MetadataError(f"{self.root}: no label named {name!r}; labels here: {', '.join(names) or '(none)'}{hint}")

    def values(self, label: str) -> list[str | None]:
        key = self.resolve_label(label)
        return [r.labels.get(key) for r in self.recordings]

    def labelled(self, label: str) -> Dataset:
        """The recordings that have a value for ``label``."""
        key = self.resolve_label(label)
        out = self.filter(lambda r: r.labels.get(key) not in (None, ""))
        out.skipped = list(self.skipped)
        return out

    def where(self, conditions: Iterable[tuple[str, Iterable[str]]]) -> Dataset:
        """The recordings whose every label in ``conditions`` ``(label, values)`` has one of its
        values (e.g. ``[("machine", ["fan"]), ("split", ["train"])]``)."""
        out = self
        for label, values in conditions:
            key, allowed = self.resolve_label(label), set(values)
            seen = sorted({v for v in out.values(key) if v})
            out = out.filter(_has_value(key, allowed))
            if len(out) == 0:
                shown = ", ".join(seen[:20]) + (f", ... ({len(seen)} in all)" if len(seen) > 20 else "")
                raise UserError(f"--where {label}={','.join(sorted(allowed))}: no recording left; values of "
                                f"{label!r} here: {shown or '(none)'}")
        out.skipped = list(self.skipped)
        return out

    def counts(self, label: str) -> Counter:
        return Counter(v for v in self.values(label) if v not in (None, ""))

    def summary(self) -> dict:
        """Per label: values with recording counts and total duration, and how many recordings
        carry the label (``labelled``); the recordings per sample rate (``rates``). Reads headers
        only."""
        out: dict[str, dict[str, dict]] = defaultdict(dict)
        rates: Counter[int] = Counter()
        total = 0.0
        for r in self.recordings:
            d = r.duration_s
            total += d
            rates[r.info().rate] += 1
            for k, v in r.labels.items():
                e = out[k].setdefault(v, {"count": 0, "seconds": 0.0})
                e["count"] += 1
                e["seconds"] += d
        labelled = {k: sum(e["count"] for e in values.values()) for k, values in out.items()}
        return {"recordings": len(self.recordings), "seconds": total, "labels": dict(out), "labelled": labelled,
                "rates": {str(k): v for k, v in sorted(rates.items())}}

    # -- checking -------------------------------------------------------------------------------
    def check(self, *, skip_bad: bool = False, progress: bool = False) -> Dataset:
        """Open every header; raise on the first bad recording, or drop bad ones with ``skip_bad``."""
        good, skipped = [], list(self.skipped)
        for r in progress_bar(self.recordings, desc="checking audio", unit="file", enable=progress):
            try:
                info = r.info()
                if r.segment_ms is not None and r.segment_ms[1] / 1000.0 > info.duration_s + 1e-3:
                    raise AudioError(f"{r.path}: segment {r.segment_ms[0]}-{r.segment_ms[1]} ms is "
                                     f"outside the recording (0-{info.duration_s * 1000:.0f} ms)")
            except AudioError as e:
                if not skip_bad:
                    raise AudioError(f"{e}" + (f" (declared at {r.source})" if r.source else "")) from None
                skipped.append((r, str(e)))
                continue
            good.append(r)
        return Dataset(good, self.root, self.folder_labels, skipped)


def _named(ds: Dataset, pattern: NamePattern, *, skip_bad: bool) -> Dataset:
    """``ds`` with the labels each recording's file name gives by ``pattern`` joined to its own;
    a name that does not match is refused (or, with ``skip_bad``, the recording is dropped into
    ``skipped``), and so is a name whose label contradicts the one the metadata gives."""
    recs: list[Recording] = []
    skipped = list(ds.skipped)
    for r in ds.recordings:
        found = pattern.labels(r.path)
        if found is None:
            why = (f"{r.path}: its name {pattern.subject(r.path)!r} does not match --labels-from-name "
                   f"{pattern.text!r}" + (f" (declared at {r.source})" if r.source else ""))
            if not skip_bad:
                raise MetadataError(f"{why}; fix the pattern, or skip such files with --skip-bad")
            skipped.append((r, why))
            continue
        for k, v in found.items():
            if r.labels.get(k, v) != v:
                given = f"{r.source} gives" if r.source else "its sub-folder gives" if ds.folder_labels else "has"
                raise MetadataError(f"{r.path}: its name gives {k}={v} but {given} {k}={r.labels[k]}; name "
                                    f"that field of --labels-from-name otherwise, or ignore it with {{_}}")
        recs.append(replace(r, labels={**r.labels, **found}) if found else r)
    if not recs:
        example = ds.recordings[0].path
        raise MetadataError(f"{ds.root}: no file's name matches --labels-from-name {pattern.text!r} (names look "
                            f"like {pattern.subject(example)!r}); a field is a label name in braces, "
                            "the text between fields must appear as written")
    return Dataset(recs, ds.root, ds.folder_labels, skipped)


def _has_value(key: str, allowed: set[str]) -> Callable[[Recording], bool]:
    return lambda r: r.labels.get(key) in allowed


def _grouped(root: Path) -> list[Path]:
    """The sub-folders of ``root`` that hold a metadata.csv (what ``wavetrain sound group``
    writes), in name order."""
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")
                  and (d / "metadata.csv").is_file())


def _scan_folder(root: Path) -> list[Recording]:
    recs = []
    subdirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    for d in subdirs:
        for f in sorted(d.rglob("*")):
            if f.suffix.lower() in AUDIO_EXTENSIONS and f.is_file():
                recs.append(Recording(f, {FOLDER_LABEL: d.name}))
    return recs


def input_paths(data: Iterable[str | os.PathLike], ds: Dataset | None = None,
                *more: str | os.PathLike | None) -> list[Path | ReadFolder]:
    """The paths a command reads, for :func:`wavetrain.core.outputs.refuse_inputs`: each
    ``--data`` path and the root of ``ds`` (a folder's metadata.csv in its place when it holds
    one: what lies beside it is not read; a folder that is listed — class sub-folders, audio
    files, a folder per value — as a :class:`~wavetrain.core.outputs.ReadFolder` of audio), every
    audio file of ``ds``, and ``more`` (a model file, a label track; None is skipped)."""
    def read(p: Path) -> Path | ReadFolder:
        if p.is_dir():
            return p / "metadata.csv" if (p / "metadata.csv").is_file() else ReadFolder(p, AUDIO_EXTENSIONS)
        return p

    out = [read(Path(d)) for d in data]
    if ds is not None:
        out.append(read(ds.root))
        out.extend(r.path for r in ds.recordings)
    out.extend(Path(m) for m in more if m is not None)
    return out


def load_dataset(path: str | os.PathLike | Iterable[str | os.PathLike], *, skip_bad: bool = False,
                 check: bool = True, progress: bool = False,
                 where: Iterable[tuple[str, Iterable[str]]] = (),
                 labels_from_name: str | NamePattern | None = None) -> Dataset:
    """Load a data set description.

    Parameters
    ----------
    path : path-like or iterable of paths
        A ``metadata.csv``, a folder holding one, a folder of sub-folders that each hold one
        (``wavetrain sound group``'s output: all of them), a folder of class sub-folders (label
        ``class`` = sub-folder name), an audio file, or several audio files/folders (any
        iterable: a list, a tuple, a generator).
    skip_bad : bool, default=False
        Drop recordings whose audio cannot be read, or whose name does not match
        ``labels_from_name`` (reported in ``Dataset.skipped``), instead of raising
        :class:`AudioError` or :class:`MetadataError`.
    check : bool, default=True
        Open every header now so that bad files are found before any work starts.
    where : iterable of (label, values)
        Keep only the recordings with one of the values of each label (:meth:`Dataset.where`),
        before any header is opened.
    labels_from_name : str or NamePattern, optional
        A pattern such as ``'{digit}_{speaker}_{take}'`` (:class:`~wavetrain.data.name_labels.NamePattern`)
        matched against each audio file's name without its extension: its fields become labels,
        joined with those the metadata gives (a different value is refused), before ``where``.
    """
    pattern = labels_from_name if isinstance(labels_from_name, NamePattern) or labels_from_name is None \
        else NamePattern(labels_from_name)
    if not isinstance(path, (str, os.PathLike)):
        paths = list(path)
        recs: list[Recording] = []
        folder = False
        for one in paths:
            ds = load_dataset(one, skip_bad=skip_bad, check=False)
            recs.extend(ds.recordings)
            folder = folder or ds.folder_labels
        ds = Dataset(recs, Path(paths[0]) if paths else Path("."), folder)
    else:
        p = Path(path)
        if not p.exists():
            raise UserError(f"{p}: no such file or folder; expected a metadata.csv, a folder or audio files")
        if p.is_file() and p.suffix.lower() == ".csv":
            ds = Dataset(read_metadata(p), p)
        elif p.is_dir() and (p / "metadata.csv").is_file():
            ds = Dataset(read_metadata(p / "metadata.csv"), p / "metadata.csv")
        elif p.is_dir() and (groups := _grouped(p)):    # a folder per value, each with its metadata.csv
            recs = [r for d in groups for r in read_metadata(d / "metadata.csv")]
            ds = Dataset(recs, p)
        elif p.is_dir():
            recs = _scan_folder(p)
            if recs:
                ds = Dataset(recs, p, folder_labels=True)
            else:
                files = sorted(f for f in p.iterdir() if f.suffix.lower() in AUDIO_EXTENSIONS)
                if not files:
                    raise MetadataError(f"{p}: no metadata.csv, no class sub-folders with audio and no "
                                        f"audio files ({', '.join(AUDIO_EXTENSIONS)})")
                ds = Dataset([Recording(f) for f in files], p)
        else:
            ds = Dataset([Recording(p)], p)
    if len(ds) == 0 and not isinstance(path, (list, tuple)):
        raise MetadataError(f"{ds.root}: lists no recordings; expected lines file[,labels][,tags], "
                            f"e.g. dog1.wav,animal=dog")
    if pattern is not None and len(ds):
        ds = _named(ds, pattern, skip_bad=skip_bad)
    where = list(where)
    if where:
        ds = ds.where(where)
    if check:
        ds = ds.check(skip_bad=skip_bad, progress=progress)
    return ds
