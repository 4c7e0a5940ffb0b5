"""Reading audio files: PCM 8/16/24/32-bit and float wav, flac and ogg through soundfile.

Every failure is an :class:`~wavetrain.core.errors.AudioError` that names the file and says what was
expected; nothing here returns garbage samples.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from wavetrain.core.errors import AudioError
from wavetrain.core.inputs import check_input_file
from wavetrain.core.outputs import write_atomic
from wavetrain.data import file_facts

#: File extensions recognised as audio when scanning folders.
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".aiff", ".aif", ".au")


@dataclass(frozen=True)
class AudioInfo:
    """What a file header says: sample ``rate`` (Hz), ``frames`` per channel, ``channels``."""

    rate: int
    frames: int
    channels: int
    subtype: str

    @property
    def duration_s(self) -> float:
        return self.frames / self.rate if self.rate else 0.0


def _soundfile():
    import soundfile  # deferred: libsndfile is loaded only when audio is read

    return soundfile


def read_info(path: str | os.PathLike) -> AudioInfo:
    """Return the header information of an audio file.

    Raises
    ------
    AudioError
        If the file is missing, empty, not a supported audio format or holds no samples.
    """
    p = Path(path)
    st = check_input_file(p, "audio file", AudioError, missing="file not found")
    if st.st_size == 0:
        raise AudioError(f"{p}: file is empty (0 bytes), expected audio (wav, flac, ogg)")
    key = os.path.abspath(p)
    seen = time.time_ns()
    known = file_facts.get(key, st, "info")  # checked in an earlier run, file unchanged since
    if isinstance(known, list) and len(known) == 4:
        try:
            return AudioInfo(int(known[0]), int(known[1]), int(known[2]), str(known[3]))
        except (TypeError, ValueError):
            pass  # a damaged row: read the header again
    sf = _soundfile()
    try:
        info = sf.info(str(p))
    except Exception as e:  # libsndfile raises RuntimeError/LibsndfileError subclasses
        raise AudioError(f"{p}: not a readable audio file ({_short(e)}); expected wav, flac or ogg") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise AudioError(f"{p}: holds no audio samples (header says {info.frames} frames)")
    if str(info.format) == "WAV":
        _check_wav_complete(p)
    out = AudioInfo(int(info.samplerate), int(info.frames), int(info.channels), str(info.subtype))
    file_facts.put(key, st, "info", [out.rate, out.frames, out.channels, out.subtype], seen_ns=seen)
    return out


def read_audio(path: str | os.PathLike, *, start_s: float = 0.0, stop_s: float | None = None,
               mono: bool = True, info: AudioInfo | None = None) -> tuple[np.ndarray, int]:
    """Read ``[start_s, stop_s)`` of an audio file as float32 in [-1, 1].

    Parameters
    ----------
    path : path-like
    start_s, stop_s : float, seconds. ``stop_s=None`` reads to the end.
    mono : bool, default=True
        Average the channels to one. With ``mono=False`` the result has shape ``(n, channels)``.

    Returns
    -------
    samples : np.ndarray [shape=(n,) or (n, channels), dtype=float32]
    rate : int, Hz
    """
    p = Path(path)
    info = info or read_info(p)
    start = int(round(start_s * info.rate))
    stop = info.frames if stop_s is None else int(round(stop_s * info.rate))
    if start < 0 or start >= info.frames or stop > info.frames + 1 or stop <= start:
        raise AudioError(
            f"{p}: segment {start_s * 1000:.0f}-{(stop_s or info.duration_s) * 1000:.0f} ms is outside "
            f"the recording (0-{info.duration_s * 1000:.0f} ms)")
    return read_frames(p, start, min(stop, info.frames), info=info, mono=mono), info.rate


def read_frames(path: str | os.PathLike, start: int, stop: int, *, info: AudioInfo,
                mono: bool = True) -> np.ndarray:
    """Samples ``[start, stop)`` (frame indices) of a file as float32: shape ``(stop - start,)``,
    or ``(stop - start, channels)`` with ``mono=False``. Checks decoding, truncation and finiteness."""
    sf = _soundfile()
    try:
        data, _ = sf.read(str(path), start=start, stop=stop, dtype="float32", always_2d=True)
    except Exception as e:
        raise AudioError(f"{path}: cannot decode audio ({_short(e)}); the file may be corrupt") from None
    if data.shape[0] < stop - start:
        raise AudioError(f"{path}: truncated: expected {stop - start} frames from {start}, file holds "
                         f"{data.shape[0]}; re-export or re-copy the file")
    if not np.isfinite(data).all():
        raise AudioError(f"{path}: holds NaN or infinite samples; expected finite audio")
    if not mono:
        return np.ascontiguousarray(data)
    return data[:, 0].copy() if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)


def write_audio(path: str | os.PathLike, samples: np.ndarray, rate: int, subtype: str = "PCM_16", *,
                sync: bool = False) -> None:
    """Write samples (float in [-1, 1], shape ``(n,)`` or ``(n, channels)``) atomically, in the
    format its suffix names (wav when none); ``sync`` flushes it to disk (slow for many files)."""
    sf = _soundfile()
    p = Path(path)
    fmt = p.suffix.lstrip(".").upper() or "WAV"

    def write(f: BinaryIO) -> None:
        kept = _KeptErrors(f)
        try:
            sf.write(kept, samples, rate, subtype=subtype, format=fmt)
        except Exception:
            if kept.error is not None:     # (libsndfile's own error is about the short write)
                raise kept.error from None
            raise
        if kept.error is not None:
            raise kept.error

    write_atomic(p, write, what="audio", sync=sync)


class _KeptErrors:
    """A file whose write and seek errors (a full disk) are kept for the writer to raise, not
    raised inside libsndfile's callbacks, where Python prints them as "Exception ignored" tracebacks
    before libsndfile reports a short write."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            return 0

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self._f.seek(offset, whence)
        except OSError as e:
            self.error = self.error or e
            return self._f.tell()

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def _check_wav_complete(p: Path) -> None:
    """libsndfile silently reads a truncated wav as a shorter one; compare the RIFF ``data``
    chunk's declared size with the bytes actually present."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX") or head[8:12] != b"WAVE":
            return
        order: Literal["little", "big"] = "little" if head[:4] == b"RIFF" else "big"
        pos = 12
        while pos + 8 <= size:
            f.seek(pos)
            hdr = f.read(8)
            if len(hdr) < 8:
                return
            cid, clen = hdr[:4], int.from_bytes(hdr[4:8], order)
            if cid == b"data":
                if clen in (0, 0xFFFFFFFF):  # streamed writers leave the size unset
                    return
                if pos + 8 + clen > size:
                    raise AudioError(
                        f"{p}: truncated: its header declares {clen} bytes of samples but only "
                        f"{size - pos - 8} are present; re-export or re-copy the file")
                return
            pos += 8 + clen + (clen & 1)


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return msg[:160]
