"""``wavetrain cache info|clear``: inspect or empty the feature store."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wavetrain.cli.common import add_cache_option
from wavetrain.core.errors import CacheError


def register(sub) -> None:
    """Add the ``cache`` command (with ``info`` and ``clear``) to ``sub``."""
    p = sub.add_parser("cache", help="show or clear the feature store (entries, size, hit rate)")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    info = csub.add_parser("info", help="entries, size and hit rate of the feature store")
    add_cache_option(info)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    clear = csub.add_parser("clear", help="remove every entry of the feature store")
    add_cache_option(clear)
    p.set_defaults(func=run)


def _open_store(cache: str | None):
    """The store at ``cache`` (or the default), or None when the default one does not exist yet."""
    from wavetrain.store import FeatureStore, default_root
    from wavetrain.store._paths import INDEX_NAME, TAG_NAME

    root = Path(cache).expanduser() if cache is not None else default_root()
    if not root.exists():
        if cache is not None:
            raise CacheError(f"feature cache {root} does not exist; pass the folder given to "
                             f"--cache when training, or omit --cache for the default")
        return root, None
    if not root.is_dir():
        raise CacheError(f"feature cache {root} is not a folder; pass the folder given to --cache "
                         f"when training")
    if not ((root / INDEX_NAME).exists() or (root / TAG_NAME).exists()):
        raise CacheError(f"{root} is not a wavetrain feature cache (no {INDEX_NAME}); pass the "
                         f"folder given to --cache when training")
    return root, FeatureStore(root)


def run(args) -> int:
    """Run ``wavetrain cache info`` or ``wavetrain cache clear``; returns the exit code."""
    from wavetrain.cli.common import human_size
    from wavetrain.data import file_facts
    from wavetrain.store._paths import FILE_FACTS_NAME

    root, store = _open_store(getattr(args, "cache", None))
    if args.cache_command == "clear":
        removed = store.clear() if store is not None else 0
        file_facts.forget(root / FILE_FACTS_NAME)
        print(f"removed {removed} entries from {root}")
        return 0
    info: dict[str, Any] = store.info() if store is not None else {
        "entries": 0, "bytes": 0, "hits": 0, "misses": 0, "hit_rate": 0.0, "root": str(root),
        "max_bytes": None}
    info["files_remembered"] = file_facts.count(root / FILE_FACTS_NAME)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"cache     {info['root']}")
    print(f"entries   {info['entries']:,}")
    print(f"size      {human_size(info['bytes'])}")
    print(f"hits      {info['hits']:,}   misses {info['misses']:,}   "
          f"hit rate {100 * info['hit_rate']:.1f}%")
    print(f"files     {info['files_remembered']:,} remembered (content hash, audio header)")
    return 0
