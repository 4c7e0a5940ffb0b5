"""Feature storage: a persistent content-addressed :class:`FeatureStore` on disk and a
byte-bounded, cost-aware in-process :class:`MemoryCache`.

Per-entry overhead for planning: :func:`entry_bytes` gives the bytes an entry counts against
``max_bytes`` (a 64-byte header plus the data); on disk each file is rounded up to whole
file-system blocks (usually 4 KiB) and the SQLite index adds about 100 bytes per entry.
"""
from wavetrain.store._format import HEADER_BYTES, entry_bytes
from wavetrain.store._paths import default_root
from wavetrain.store.feature_store import FeatureStore, NullStore
from wavetrain.store.memory_cache import MemoryCache

__all__ = ["HEADER_BYTES", "FeatureStore", "MemoryCache", "NullStore", "default_root",
           "entry_bytes"]
