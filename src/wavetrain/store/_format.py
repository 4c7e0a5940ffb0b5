"""The on-disk format of one feature-store entry (``.gram`` file).

An entry is a 64-byte header followed by the C-ordered, little-endian array data::

    offset  size  field
    0       8     magic b"WTGRAM\\x00\\x01"
    8       2     format version (1)
    10      1     dtype code (1 = float32, 2 = float16)
    11      1     flags: bit 0 set = the data was not fsynced before the entry became visible
    12      4     reserved (zero)
    16      8     n_frames
    24      8     n_features
    32      8     data size in bytes
    40      4     CRC-32 of the data
    44      4     CRC-32 of bytes 0..43 of the header
    48      16    reserved (zero)
    64      ...   data

A file whose size, magic, header checksum or (optionally) data checksum does not match is
corrupt: the store treats it as a miss and removes it.  The data checksum of an entry flagged
"not fsynced" is checked on every read, whatever the reader's ``verify``: after a power cut its
data may be zeros under an intact header.  The header costs 64 bytes per entry; on
disk the file also occupies whole file-system blocks (usually 4 KiB), and the index adds about
100 bytes per entry.
"""
from __future__ import annotations

import os
import struct
import zlib

import numpy as np

MAGIC = b"WTGRAM\x00\x01"
VERSION = 1
HEADER_BYTES = 64
_HEAD = struct.Struct("<8sHBB4xQQQI")         # 44 bytes covered by the header CRC
#: Header flag: the entry's data was not fsynced before it was renamed into place.
FLAG_UNSYNCED = 1
_DTYPES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<f2")}
_CODES: dict[np.dtype, int] = {np.dtype("float32"): 1, np.dtype("float16"): 2}
# Each ``# type: ignore[arg-type]`` in this module: numpy's stubs declare ``ndarray.__buffer__``
# (PEP 688) only for Python >= 3.12, so under mypy's python_version 3.11 an array passed as a
# buffer (to memoryview, zlib.crc32) is rejected, though arrays are buffers on every Python.


class CorruptEntry(Exception):
    """Internal: an entry file failed a format check (never leaves the store package)."""


def entry_bytes(n_frames: int, n_features: int, dtype="float32") -> int:
    """Bytes one entry takes in the store (what ``max_bytes`` counts).

    Parameters
    ----------
    n_frames : int >= 0
        Frames of the feature gram.
    n_features : int >= 0
        Features per frame.
    dtype : {"float32", "float16"}, default="float32"
        Store dtype.

    Returns
    -------
    nbytes : int
        ``HEADER_BYTES + n_frames * n_features * itemsize`` (64 bytes of header).  The file system
        rounds each file up to whole blocks (usually 4 KiB; not counted in ``max_bytes``) and the
        index adds about 150 bytes per entry (counted in ``max_bytes`` with the index files).

    Examples
    --------
    >>> entry_bytes(100, 64)
    25664
    >>> entry_bytes(100, 64, "float16")
    12864
    """
    dt = np.dtype(dtype)
    if dt not in _CODES:
        raise ValueError(f"entry_bytes dtype must be float32 or float16; got {dt}")
    if n_frames < 0 or n_features < 0:
        raise ValueError(f"entry_bytes needs n_frames, n_features >= 0; got {n_frames}, {n_features}")
    return HEADER_BYTES + int(n_frames) * int(n_features) * dt.itemsize


def pack_header(data: np.ndarray, *, synced: bool = True) -> bytes:
    """Header bytes for a C-contiguous 2-D float32/float16 array (``synced``: whether the data
    will be fsynced before the entry becomes visible)."""
    code = _CODES[data.dtype.newbyteorder("=")]
    crc = zlib.crc32(memoryview(data).cast("B")) if data.size else 0  # type: ignore[arg-type]
    flags = 0 if synced else FLAG_UNSYNCED
    head = _HEAD.pack(MAGIC, VERSION, code, flags, data.shape[0], data.shape[1], data.nbytes, crc)
    head += struct.pack("<I", zlib.crc32(head))
    return head.ljust(HEADER_BYTES, b"\x00")


def write_entry(f, data: np.ndarray, *, sync: bool = True) -> None:
    """Write header and data of ``data`` to the open binary file ``f``, then flush (and fsync
    with ``sync``)."""
    f.write(pack_header(data, synced=sync))
    if data.size:
        f.write(memoryview(data).cast("B"))  # type: ignore[arg-type]
    f.flush()
    if sync:
        os.fsync(f.fileno())


def read_header(f) -> tuple[np.dtype, tuple[int, int], int, int]:
    """Read and check the header of the open entry file ``f``.

    Returns
    -------
    dtype, shape, data_crc, flags
        Raises :class:`CorruptEntry` when the header or the file size does not match.
    """
    f.seek(0)
    head = f.read(HEADER_BYTES)
    if len(head) != HEADER_BYTES:
        raise CorruptEntry(f"header truncated ({len(head)} of {HEADER_BYTES} bytes)")
    try:
        magic, version, code, flags, n_frames, n_features, nbytes, crc = _HEAD.unpack_from(head)
    except struct.error as exc:  # pragma: no cover - length already checked
        raise CorruptEntry(str(exc)) from None
    (head_crc,) = struct.unpack_from("<I", head, _HEAD.size)
    if magic != MAGIC:
        raise CorruptEntry("bad magic")
    if zlib.crc32(head[: _HEAD.size]) != head_crc:
        raise CorruptEntry("header checksum mismatch")
    if version != VERSION or code not in _DTYPES:
        raise CorruptEntry(f"unsupported version {version} or dtype code {code}")
    dtype = _DTYPES[code]
    if nbytes != n_frames * n_features * dtype.itemsize:
        raise CorruptEntry("data size does not match shape")
    size = os.fstat(f.fileno()).st_size
    if size != HEADER_BYTES + nbytes:
        raise CorruptEntry(f"file is {size} bytes, header says {HEADER_BYTES + nbytes}")
    return dtype, (n_frames, n_features), crc, flags


def load_entry(f, *, verify: bool = True, mmap_min_bytes: int = 0) -> np.ndarray:
    """Read the data of the open entry file ``f`` as a read-only array.

    Parameters
    ----------
    f : binary file object
        Open for reading; it may be closed (or the file unlinked) afterwards.
    verify : bool, default=True
        Check the data CRC-32 (reads the whole entry once).  Entries flagged as not fsynced are
        always checked.
    mmap_min_bytes : int >= 0, default=0
        Data of at least this many bytes is memory-mapped; smaller data is read into memory.

    Returns
    -------
    gram : np.ndarray of shape (n_frames, n_features), dtype float32 or float16
        Read-only; an ``np.memmap`` when memory-mapped.  A live map holds one file descriptor
        (Python's ``mmap`` keeps a duplicate), an in-memory array none.
    """
    dtype, shape, crc, flags = read_header(f)
    nbytes = shape[0] * shape[1] * dtype.itemsize
    if nbytes == 0 or nbytes < mmap_min_bytes:
        arr = np.empty(shape, dtype=dtype)
        if nbytes and f.readinto(memoryview(arr).cast("B")) != nbytes:  # type: ignore[arg-type]
            raise CorruptEntry("data shorter than its header says")
    else:
        arr = np.memmap(f, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=shape, order="C")
    if (verify or flags & FLAG_UNSYNCED) and nbytes and zlib.crc32(arr) != crc:  # type: ignore[arg-type]
        raise CorruptEntry("data checksum mismatch")
    arr.flags.writeable = False
    return arr
