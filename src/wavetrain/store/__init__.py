"""Feature storage: the :class:`Store` protocol, a persistent content-addressed
:class:`FeatureStore` on disk (and :class:`NullStore`, which keeps nothing) and a byte-bounded,
cost-aware in-process :class:`MemoryCache`.

Per-entry overhead for planning: :func:`entry_bytes` gives the bytes an entry counts against
``max_bytes`` (a 64-byte header plus the data); on disk each file is rounded up to whole
file-system blocks (usually 4 KiB, not counted).  ``max_bytes`` also counts the index files:
the SQLite index (about 150 bytes per entry), the file facts memo and their write-ahead logs,
100 to 250 KB for a small store and up to about 4 MB more of log for a bound of 64 MB or more.
"""
from wavetrain.store._format import HEADER_BYTES, entry_bytes
from wavetrain.store._paths import default_root
from wavetrain.store.feature_store import FeatureStore, NullStore
from wavetrain.store.memory_cache import MemoryCache
from wavetrain.store.protocol import Store

__all__ = ["HEADER_BYTES", "FeatureStore", "MemoryCache", "NullStore", "Store", "default_root", "entry_bytes"]
