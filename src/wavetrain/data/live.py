"""Live audio from a byte stream (stdin, a pipe): raw PCM or a streamed wav, decoded block by block
as the bytes arrive, and a ring buffer that keeps only the samples still needed.

:func:`open_pcm_stream` sniffs the first bytes: a ``RIFF``/``RF64`` header is parsed (its format
wins over the raw settings); a data size of 0 or 0xFFFFFFFF — what ``arecord``, ``sox -t wav -``
and ``ffmpeg -f wav -`` write when they cannot seek back — means "until the end of the stream".
Anything else is raw PCM in the given format. :class:`PcmStream` then yields float32 blocks of
whatever has arrived (never waiting to fill a fixed size), each with the time it arrived.

:class:`SampleRing` holds samples by their absolute index in the stream; the reader appends and
the consumer drops what no window needs any more, so memory stays flat over any length of input.
"""
from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError

__all__ = ["RAW_FORMATS", "PcmFormat", "PcmStream", "SampleRing", "open_pcm_stream"]

log = logging.getLogger(__name__)

#: Raw sample formats: name -> (numpy dtype, bytes per sample).
RAW_FORMATS = {"s16le": ("<i2", 2), "s32le": ("<i4", 4), "f32le": ("<f4", 4), "f64le": ("<f8", 8),
               "u8": ("u1", 1), "s24le": ("s24", 3)}
#: Bytes asked for per read (a read returns what has arrived, up to this).
READ_BYTES = 1 << 16
_UNKNOWN_SIZES = (0, 0xFFFFFFFF)


#: The most channels and the highest sample rate (Hz) of a live stream.
MAX_CHANNELS, MAX_LIVE_RATE = 64, 1_000_000


@dataclass(frozen=True)
class PcmFormat:
    """Layout of interleaved PCM samples."""

    rate: int
    sample_format: str = "s16le"
    channels: int = 1

    def __post_init__(self):
        if self.sample_format not in RAW_FORMATS:
            raise ParameterError(f"--format {self.sample_format}: expected one of {', '.join(RAW_FORMATS)}",
                                 param="format")
        if not 1 <= self.rate <= MAX_LIVE_RATE:
            raise ParameterError(f"--rate {self.rate}: expected a sample rate in Hz (1 to {MAX_LIVE_RATE})",
                                 param="rate")
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise ParameterError(f"--channels {self.channels}: expected 1 to {MAX_CHANNELS}", param="channels")

    @property
    def frame_bytes(self) -> int:
        return RAW_FORMATS[self.sample_format][1] * self.channels

    def decode(self, data: bytes | memoryview) -> np.ndarray:
        """Whole frames of bytes -> float32 samples ``(n, channels)`` in about [-1, 1]."""
        dtype, width = RAW_FORMATS[self.sample_format]
        if dtype == "s24":
            b = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
            v = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16))
            v = np.where(v >= 1 << 23, v - (1 << 24), v)
            x = v.astype(np.float32) / float(1 << 23)
        else:
            raw = np.frombuffer(data, dtype)
            if raw.dtype.kind == "f":
                x = raw.astype(np.float32)      # NaN and infinities kept: PcmStream refuses them
            elif raw.dtype.kind == "u":
                x = (raw.astype(np.float32) - 128.0) / 128.0
            else:
                x = raw.astype(np.float32) / float(1 << (8 * width - 1))
        return x.reshape(-1, self.channels)


class _Source:
    """Reads bytes as they arrive, with bytes pushed back from sniffing served first."""

    def __init__(self, f: BinaryIO):
        self._read: Callable[[int], bytes] = getattr(f, "read1", None) or f.read
        self.pending = b""

    def read(self, n: int = READ_BYTES) -> bytes:
        if self.pending:
            out, self.pending = self.pending[:n], self.pending[n:]
            return out
        return self._read(n)

    def read_exact(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            b = self.read(n - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)


def _parse_wav(src: _Source, head: bytes, where: str) -> tuple[PcmFormat, int | None]:
    """Read the header of a wav stream up to its data; ``(format, data bytes or None if unknown)``."""
    riff = head[:4]
    rest = src.read_exact(8)
    if len(rest) < 8 or rest[4:8] != b"WAVE":
        raise AudioError(f"{where}: starts with {riff.decode('latin-1')!r} but is not a WAVE stream")
    fmt: PcmFormat | None = None
    ds64_data: int | None = None
    while True:
        hdr = src.read_exact(8)
        if len(hdr) < 8:
            raise AudioError(f"{where}: the wav header ends before its data chunk")
        cid, size = hdr[:4], struct.unpack("<I", hdr[4:])[0]
        if cid == b"data":
            if fmt is None:
                raise AudioError(f"{where}: wav data chunk before its fmt chunk")
            if riff == b"RF64" and size == 0xFFFFFFFF and ds64_data:
                return fmt, ds64_data
            return fmt, None if size in _UNKNOWN_SIZES else size
        if size > 1 << 20:
            raise AudioError(f"{where}: wav chunk {cid!r} of {size} bytes before the data; not a wav stream")
        body = src.read_exact(size + (size & 1))
        if len(body) < size:
            raise AudioError(f"{where}: the wav header ends inside its {cid.decode('latin-1')!r} chunk")
        if cid == b"ds64" and size >= 24:
            ds64_data = struct.unpack("<Q", body[8:16])[0]
        elif cid == b"fmt ":
            if size < 16:
                raise AudioError(f"{where}: wav fmt chunk of {size} bytes (expected 16 or more)")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == 0xFFFE and size >= 26:
                tag = struct.unpack("<H", body[24:26])[0]
            name = {(1, 8): "u8", (1, 16): "s16le", (1, 24): "s24le", (1, 32): "s32le",
                    (3, 32): "f32le", (3, 64): "f64le"}.get((tag, bits))
            if name is None:
                raise AudioError(f"{where}: wav format {tag} with {bits}-bit samples is not supported; "
                                 "send 16-bit, 24-bit, 32-bit integer or 32-bit float PCM")
            if not (1 <= channels <= MAX_CHANNELS and 1 <= rate <= MAX_LIVE_RATE):
                raise AudioError(f"{where}: its wav header says {channels} channels at {rate} Hz; a live stream has "
                                 f"1 to {MAX_CHANNELS} channels at 1 to {MAX_LIVE_RATE} Hz")
            fmt = PcmFormat(int(rate), name, int(channels))


def open_pcm_stream(f: BinaryIO, raw: PcmFormat, *, where: str = "stdin",
                    mono: bool = True) -> PcmStream:
    """Open a byte stream of raw PCM (``raw``) or a wav stream (detected from its header).

    Raises
    ------
    AudioError
        A wav header that cannot be used; an empty stream.
    """
    src = _Source(f)
    head = src.read_exact(4)
    if not head:
        raise AudioError(f"{where}: no audio arrived (the stream is empty)")
    if head in (b"RIFF", b"RF64"):
        fmt, size = _parse_wav(src, head, where)
        return PcmStream(src, fmt, size, mono=mono, wav=True, where=where)
    src.pending = head
    return PcmStream(src, raw, None, mono=mono, wav=False, where=where)


class PcmStream:
    """Float32 blocks of a PCM byte stream as they arrive.

    Iterating yields ``(samples, arrived)``: samples ``(n,)`` (``mono``: channels averaged) or
    ``(n, channels)``, and the :func:`time.perf_counter` time the bytes arrived. A trailing
    partial frame at the end of the stream is dropped. A wav stream that ends before the data
    size its header gives is read to its end, with a warning (``truncated``: the bytes
    missing).

    Raises
    ------
    AudioError
        While iterating: a float sample that is NaN or infinite (naming its offset), or a
        stream that ends without one whole sample.
    """

    def __init__(self, src: _Source, fmt: PcmFormat, data_bytes: int | None, *, mono: bool, wav: bool,
                 where: str = "stdin"):
        self.src, self.format, self.data_bytes, self.mono, self.wav = src, fmt, data_bytes, mono, wav
        self.where = where
        self.samples_read = 0
        self.truncated = 0

    def __iter__(self) -> Iterator[tuple[np.ndarray, float]]:
        fb = self.format.frame_bytes
        left = self.data_bytes
        carry = b""
        while left is None or left > 0:
            want = READ_BYTES if left is None else min(READ_BYTES, left)
            data = self.src.read(want)
            if not data:
                break
            arrived = time.perf_counter()
            if left is not None:
                left -= len(data)
            if carry:
                data, carry = carry + data, b""
            whole = len(data) - len(data) % fb
            if whole < len(data):
                carry = bytes(data[whole:])
            if not whole:
                continue
            x = self.format.decode(memoryview(data)[:whole])
            self._check_finite(x)
            if self.mono:
                x = x[:, 0] if x.shape[1] == 1 else x.mean(axis=1, dtype=np.float32)
            self.samples_read += x.shape[0]
            yield x, arrived
        if self.samples_read == 0:
            what = "a wav header without data" if self.wav else f"{len(carry)} byte(s), less than one " \
                f"{self.format.sample_format} sample frame ({fb} bytes)"
            raise AudioError(f"{self.where}: no audio samples on {self.where} ({what})")
        if left:
            self.truncated = left
            log.warning("%s: truncated wav stream: its header gives %d bytes of samples, the stream ended after "
                        "%d; the answers cover the samples that arrived", self.where, self.data_bytes,
                        (self.data_bytes or 0) - left)

    def _check_finite(self, x: np.ndarray) -> None:
        """Refuse NaN and infinite float samples, naming the first one's offset (in samples)."""
        if not RAW_FORMATS[self.format.sample_format][0].startswith("<f"):
            return
        bad = ~np.isfinite(x)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            offset = self.samples_read + int(row)
            where = f" (channel {col + 1})" if x.shape[1] > 1 else ""
            seconds = offset / self.format.rate
            raise AudioError(f"{self.where}: sample {offset}{where} is {x[row, col]} ({seconds:.3f} s in); float "
                             "samples must be finite numbers")


class SampleRing:
    """Samples held by absolute index: append at the end, drop from the front.

    The storage is one array reused in place (the kept samples are moved to its front when the
    end is reached), grown only when more samples must be kept at once than it holds.
    """

    def __init__(self, channels: int | None = None, capacity: int = 1 << 15):
        shape = (capacity,) if channels is None else (capacity, channels)
        self._buf = np.zeros(shape, np.float32)
        self._lo = 0            # offset in _buf of the first kept sample
        self._hi = 0            # offset in _buf after the last sample
        self.first = 0          # absolute index of the first kept sample

    @property
    def end(self) -> int:
        """Absolute index after the last sample appended."""
        return self.first + self._hi - self._lo

    @property
    def capacity(self) -> int:
        return self._buf.shape[0]

    def append(self, x: np.ndarray) -> None:
        n = x.shape[0]
        if self._hi + n > self.capacity:
            kept = self._hi - self._lo
            if kept + n > self.capacity:
                new = np.zeros((max(kept + n, 2 * self.capacity),) + self._buf.shape[1:], np.float32)
                new[:kept] = self._buf[self._lo:self._hi]
                self._buf = new
            else:
                self._buf[:kept] = self._buf[self._lo:self._hi]
            self._lo, self._hi = 0, kept
        self._buf[self._hi:self._hi + n] = x
        self._hi += n

    def get(self, start: int, stop: int) -> np.ndarray:
        """A copy of samples ``[start, stop)`` (absolute indices, clipped to what is held)."""
        if start < self.first:
            raise IndexError(f"sample {start} was dropped (first kept: {self.first})")
        a = self._lo + start - self.first
        b = self._lo + min(stop, self.end) - self.first
        return self._buf[a:max(a, b)].copy()

    def drop_before(self, index: int) -> None:
        """Forget every sample before absolute ``index``."""
        k = min(max(0, index - self.first), self._hi - self._lo)
        self._lo += k
        self.first += k
        if self._lo == self._hi:
            self._lo = self._hi = 0
