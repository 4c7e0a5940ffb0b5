"""Cut recordings into fixed-length clips, each a wav file, with a metadata.csv that carries the
labels and, as tags, the source file (relative to the new csv) and the clip's offset in it.

Clips start every ``shift_ms`` (default ``clip_ms``: back to back) and a last clip shorter than
``clip_ms`` is dropped, so every clip lasts exactly ``round(clip_ms * rate / 1000)`` samples; a
recording shorter than one clip gives none. Channels and the sample rate are kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.outputs import refuse_inputs
from wavetrain.core.progress import progress_bar
from wavetrain.data.audio import read_audio, write_audio
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording
from wavetrain.sound.common import UniqueNames, relative, safe_name, tag_value, wav_subtype

__all__ = ["CutResult", "clip_starts", "cut"]


@dataclass
class CutResult:
    clips: int
    recordings: int
    too_short: int


def clip_starts(frames: int, clip: int, shift: int) -> list[int]:
    """Start frames of the whole clips of ``clip`` frames every ``shift`` frames in ``frames``."""
    return list(range(0, frames - clip + 1, shift)) if clip <= frames else []


def cut(ds: Dataset, out: Path, clip_ms: int, shift_ms: int | None = None, *, progress: bool = False) -> CutResult:
    """Write the clips of every recording of ``ds`` into ``out`` and ``out/metadata.csv``."""
    refuse_inputs([out], input_paths((), ds), option="")     # never over what it reads
    if clip_ms <= 0:
        raise ParameterError(f"--clip-ms {clip_ms}: expected a clip length > 0 ms")
    shift_ms = shift_ms or clip_ms
    if shift_ms <= 0:
        raise ParameterError(f"--clip-shift-ms {shift_ms}: expected > 0 ms")
    if not any(r.duration_s * 1000 >= clip_ms - 0.5 for r in ds):
        longest = max(r.duration_s for r in ds) * 1000
        raise UserError(f"--clip-ms {clip_ms}: every recording is shorter (the longest lasts {longest:.0f} ms); "
                        "no clip to write")
    names = UniqueNames()
    names("metadata", ".csv")
    rows: list[Recording] = []
    short = 0
    for r in progress_bar(ds.recordings, desc="cutting", unit="file", enable=progress):
        info = r.info()
        seg0 = 0 if r.segment_ms is None else r.segment_ms[0]
        start_s, stop_s = (0.0, None) if r.segment_ms is None else (seg0 / 1000.0, r.segment_ms[1] / 1000.0)
        x, rate = read_audio(r.path, start_s=start_s, stop_s=stop_s, mono=False, info=info)
        clip = int(round(clip_ms * rate / 1000))
        shift = max(1, int(round(shift_ms * rate / 1000)))
        starts = clip_starts(x.shape[0], clip, shift)
        if not starts:
            short += 1
        stem = safe_name(r.path.stem, "clip")
        for s in starts:
            offset_ms = seg0 + int(round(s * 1000 / rate))
            name = names(f"{stem}_{offset_ms}ms", ".wav")
            piece = x[s:s + clip]
            write_audio(out / name, piece[:, 0] if piece.shape[1] == 1 else piece, rate,
                        subtype=wav_subtype(info.subtype))
            tags = dict(r.tags)
            tags.update(source=tag_value(relative(r.path, out)), offset_ms=str(offset_ms))
            rows.append(Recording(out / name, r.labels, tags))
    write_metadata(out / "metadata.csv", rows)
    return CutResult(len(rows), len(ds), short)
