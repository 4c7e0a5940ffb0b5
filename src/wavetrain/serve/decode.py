"""Request bodies to samples, in memory: wav/flac/ogg through soundfile, raw PCM, multipart uploads.

Nothing here touches the disk or keeps anything between calls. Every failure is a
:class:`RequestError` carrying the HTTP status a server answers with: 400 for a malformed request,
413 for audio that decodes to more samples than allowed, 422 for a body that is not usable audio.
"""
from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import soundfile
from python_multipart.multipart import MultipartParser, parse_options_header

from wavetrain.core.errors import UserError

__all__ = ["AUDIO_TYPES", "PCM_FORMATS", "PCM_TYPE", "Decoded", "RequestError", "decode_audio", "decode_pcm",
           "multipart_file"]

#: Content types of encoded audio bodies (soundfile reads the format from the bytes themselves).
AUDIO_TYPES = ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave", "audio/flac", "audio/x-flac",
               "audio/ogg", "application/ogg")
#: Raw PCM: ``application/octet-stream`` with ``sample_rate``, ``channels`` and ``format``.
PCM_TYPE = "application/octet-stream"
PCM_FORMATS: dict[str, np.dtype] = {"s16le": np.dtype("<i2"), "f32le": np.dtype("<f4")}
MAX_RATE = 768_000
MAX_CHANNELS = 64
#: A multipart boundary: 1 to 70 of these characters, not ending in a space (RFC 2046, 5.1.1).
BOUNDARY = re.compile(rb"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")


class RequestError(Exception):
    """A request the server answers with ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass
class Decoded:
    """Samples ``(n, channels)`` float32 at ``rate`` Hz."""

    samples: np.ndarray
    rate: int

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / self.rate

    def for_model(self) -> np.ndarray:
        """``(n,)`` for one channel, else ``(n, channels)`` (what ``classify_samples`` takes)."""
        return self.samples[:, 0] if self.channels == 1 else self.samples


def decode_audio(body: bytes, *, max_samples: int, check: Callable[[Decoded], None] | None = None) -> Decoded:
    """Decode a wav, flac or ogg file held in ``body``; refuse more than ``max_samples`` values.
    ``check`` is called before the samples are decoded with a :class:`Decoded` of the header's
    length, rate and channels (its samples all zero, no memory), to refuse costly audio cheaply."""
    if not body:
        raise RequestError(422, "empty body: expected audio (wav, flac or ogg)")
    try:
        with soundfile.SoundFile(io.BytesIO(body)) as f:
            frames, channels, rate = int(f.frames), int(f.channels), int(f.samplerate)
            if frames <= 0 or rate <= 0:
                raise RequestError(422, f"the audio holds no samples (header says {frames} frames)")
            if frames * channels > max_samples:
                raise RequestError(413, f"the audio decodes to {frames * channels} samples "
                                        f"({frames / rate:.1f} s x {channels} channels); at most {max_samples} "
                                        "are accepted")
            if f.format == "WAV":
                _check_wav_complete(body)
            if check is not None:
                check(Decoded(np.broadcast_to(np.zeros((1, 1), np.float32), (frames, channels)), rate))
            data = f.read(frames, dtype="float32", always_2d=True)
    except (RequestError, UserError):     # ours and ``check``'s
        raise
    except Exception as e:  # libsndfile's errors: RuntimeError / LibsndfileError / TypeError
        raise RequestError(422, f"not readable audio ({_short(e)}); expected wav, flac or ogg") from None
    if data.shape[0] < frames:
        raise RequestError(422, f"truncated audio: the header declares {frames} frames, {data.shape[0]} are present")
    return _checked(data, rate)


def decode_pcm(body: bytes, *, sample_rate: str | None, channels: str | None, fmt: str | None,
               max_samples: int) -> Decoded:
    """Raw little-endian PCM (``s16le`` or ``f32le``), channels interleaved."""
    rate = _int_param("sample_rate", sample_rate, 1, MAX_RATE, required=True)
    nch = _int_param("channels", channels, 1, MAX_CHANNELS, default=1)
    fmt = fmt or "s16le"
    if fmt not in PCM_FORMATS:
        raise RequestError(422, f"format={fmt!r}: raw PCM is one of {', '.join(PCM_FORMATS)}")
    dtype = PCM_FORMATS[fmt]
    if not body:
        raise RequestError(422, "empty body: expected raw PCM samples")
    frame = dtype.itemsize * nch
    if len(body) % frame:
        raise RequestError(422, f"{len(body)} bytes are not a whole number of {fmt} frames of {nch} channel(s) "
                                f"({frame} bytes each)")
    if len(body) // dtype.itemsize > max_samples:
        raise RequestError(413, f"the body holds {len(body) // dtype.itemsize} samples; at most {max_samples} "
                                "are accepted")
    raw = np.frombuffer(body, dtype=dtype).reshape(-1, nch)
    data = raw.astype(np.float32) / 32768.0 if fmt == "s16le" else raw.astype(np.float32)
    return _checked(data, rate)


class _TooManyParts(Exception):
    pass


def multipart_file(body: bytes, content_type: str, field: str = "file", *, max_parts: int = 16,
                   max_headers: int = 16) -> bytes:
    """The bytes of the part named ``field`` of a ``multipart/form-data`` body (of at most
    ``max_parts`` parts of at most ``max_headers`` headers each: more is a 400 at once). A
    boundary that is not 1 to 70 of the characters RFC 2046 allows is a 400."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise RequestError(400, "multipart/form-data without a boundary")
    if not BOUNDARY.fullmatch(boundary):
        shown = boundary[:40].decode("latin-1") + ("..." if len(boundary) > 40 else "")
        raise RequestError(400, f"multipart boundary {shown!r} ({len(boundary)} characters): expected 1 to 70 "
                                "letters, digits or '()+_,-./:=? (RFC 2046)")
    parts: list[dict] = []
    cur: dict = {}
    header: list[bytes] = [b"", b""]

    def on_part_begin() -> None:
        if len(parts) >= max_parts:
            raise _TooManyParts(f"more than {max_parts} parts")
        cur.clear()
        cur.update(headers={}, data=[])

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        if len(cur["headers"]) >= max_headers:
            raise _TooManyParts(f"a part with more than {max_headers} headers")
        cur["headers"][header[0].decode("latin-1").lower()] = header[1]
        header[0] = header[1] = b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if _name(cur) == field:            # other fields' data is not kept
            cur["data"].append(data[start:end])

    def on_part_end() -> None:
        parts.append({"name": _name(cur), "data": b"".join(cur["data"])})

    try:
        parser = MultipartParser(boundary, callbacks={
            "on_part_begin": on_part_begin, "on_header_field": on_header_field, "on_header_value": on_header_value,
            "on_header_end": on_header_end, "on_part_data": on_part_data, "on_part_end": on_part_end})
        parser.write(body)
        parser.finalize()
    except _TooManyParts as e:
        raise RequestError(400, f"multipart upload with {e}: send one file (field {field!r})") from None
    except Exception as e:
        raise RequestError(400, f"malformed multipart/form-data body ({_short(e)})") from None
    found = [p["data"] for p in parts if p["name"] == field]
    if not found:
        names = ", ".join(repr(p["name"]) for p in parts) or "none"
        raise RequestError(400, f"multipart upload without a {field!r} field (fields: {names})")
    if len(found) > 1:
        raise RequestError(400, f"multipart upload with {len(found)} {field!r} fields; send one file")
    return found[0]


def _name(part: dict) -> str | None:
    disp = part.get("headers", {}).get("content-disposition")
    if not disp:
        return None
    _, params = parse_options_header(disp)
    name = params.get(b"name")
    return name.decode("utf-8", "replace") if name is not None else None


def _checked(data: np.ndarray, rate: int) -> Decoded:
    if data.shape[0] == 0:
        raise RequestError(422, "the audio holds no samples")
    if not np.isfinite(data).all():
        raise RequestError(422, "the audio holds NaN or infinite samples")
    return Decoded(np.ascontiguousarray(data, dtype=np.float32), int(rate))


def _int_param(name: str, text: str | None, low: int, high: int, *, default: int | None = None,
               required: bool = False) -> int:
    if text is None or text == "":
        if required or default is None:
            raise RequestError(422, f"raw PCM needs ?{name}=N")
        return default
    try:
        value = int(text)
    except ValueError:
        raise RequestError(422, f"{name}={text!r}: expected an integer") from None
    if not low <= value <= high:
        raise RequestError(422, f"{name}={value}: expected {low} to {high}")
    return value


def _check_wav_complete(body: bytes) -> None:
    """libsndfile reads a truncated wav as a shorter one: compare the ``data`` chunk's declared
    size with the bytes present (as :func:`wavetrain.data.audio.read_info` does for files)."""
    if len(body) < 12 or body[:4] not in (b"RIFF", b"RIFX") or body[8:12] != b"WAVE":
        return
    order = "little" if body[:4] == b"RIFF" else "big"
    pos = 12
    while pos + 8 <= len(body):
        cid, clen = body[pos:pos + 4], int.from_bytes(body[pos + 4:pos + 8], order)  # type: ignore[arg-type]
        if cid == b"data":
            if clen not in (0, 0xFFFFFFFF) and pos + 8 + clen > len(body):
                raise RequestError(422, f"truncated wav: its header declares {clen} bytes of samples but only "
                                        f"{len(body) - pos - 8} are present")
            return
        pos += 8 + clen + (clen & 1)


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    msg = re.sub(r"^Error opening <[^>]*>: ", "", msg)      # libsndfile names the in-memory file object
    return msg[:160]
