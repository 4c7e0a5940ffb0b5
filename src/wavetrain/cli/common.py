"""Options shared by several commands, and turning them into run settings."""
from __future__ import annotations

import argparse
import re

from wavetrain.errors import ParameterError


#: Size bound of the feature store when neither --cache-limit nor $WAVETRAIN_CACHE_LIMIT is given.
DEFAULT_CACHE_LIMIT = "20G"
CACHE_LIMIT_ENV = "WAVETRAIN_CACHE_LIMIT"


def cache_limit(args) -> int | None:
    """Bytes the feature store may hold: --cache-limit, else $WAVETRAIN_CACHE_LIMIT, else
    :data:`DEFAULT_CACHE_LIMIT`; ``none`` means unbounded."""
    import os

    given = getattr(args, "cache_limit", None)
    text, where = (given, "--cache-limit") if given else (os.environ.get(CACHE_LIMIT_ENV), CACHE_LIMIT_ENV)
    if not text:
        text, where = DEFAULT_CACHE_LIMIT, "default"
    if str(text).strip().lower() in ("none", "unlimited"):
        return None
    try:
        return parse_size(text)
    except ParameterError as e:
        raise ParameterError(f"{where}: {e} or 'none'") from None


def human_size(n: float, fmt: str = ".1f") -> str:
    """``77004`` -> ``'75.2 KiB'`` (binary units; ``fmt`` formats all but whole bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:{fmt}} {unit}"
        n /= 1024
    return f"{n:{fmt}} TiB"  # pragma: no cover


def report_store(store) -> None:
    """After a run: say so when the store could not keep the features (entries evicted, or
    grams larger than the whole bound): later passes and runs then extract them again."""
    import sys

    evicted, skipped = getattr(store, "evicted", 0), getattr(store, "not_stored", 0)
    if not (evicted or skipped):
        return
    limit = human_size(store.max_bytes, ".3g")
    what = [f"evicted {evicted} least-recently-used entries"] if evicted else []
    if skipped:
        what.append(f"did not store {skipped} grams larger than the whole limit")
    print(f"feature store: {' and '.join(what)} to stay under {limit}; features that do not fit "
          "are extracted again on later passes and runs: raise --cache-limit (or set "
          f"{CACHE_LIMIT_ENV})", file=sys.stderr)


def parse_size(text: str) -> int:
    """``'256M'`` -> bytes. Units K, M, G (powers of 1024); a bare number is bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", str(text))
    if not m:
        raise ParameterError(f"size {text!r}: expected a number with an optional unit K, M or G (e.g. 256M)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m[2].lower()]
    return int(float(m[1]) * mult)


def add_store_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("feature store and resources")
    g.add_argument("--cache", metavar="DIR", help="feature store folder (default: $WAVETRAIN_CACHE or ~/.cache/wavetrain)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the feature store")
    g.add_argument("--cache-limit", metavar="SIZE",
                   help="evict least-recently-used store entries beyond SIZE (e.g. 2G; 'none' = no "
                        f"limit; default ${CACHE_LIMIT_ENV} or {DEFAULT_CACHE_LIMIT})")
    g.add_argument("--store-dtype", choices=("float32", "float16"), default="float32",
                   help="precision of stored features (default float32)")
    g.add_argument("--workers", type=int, default=None,
                   help="threads loading/extracting ahead of training (default: 2 when recordings last "
                        "2 s or more on average and there are 2+ CPUs, else 1)")
    g.add_argument("--batch-windows", type=int, default=64, help="windows per batch (default 64)")
    g.add_argument("--memory-limit", metavar="SIZE", help="fit the run into SIZE of resident memory (e.g. 256M)")
    g.add_argument("--memory-cache", metavar="SIZE", default="64M",
                   help="in-memory feature cache in front of the store (default 64M; fixed, not grown with data)")
    g.add_argument("--skip-bad", action="store_true", help="skip unreadable recordings and report how many")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="compute device (default cpu)")
    g.add_argument("--progress", dest="progress", action="store_true", default=None, help="force progress bars")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def add_model_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", metavar="SPEC", required=required, default=None if required else "gmm",
                   help="built-in model name (see `wavetrain models`) or a .toml model spec")
    g.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="override a model parameter (repeatable), e.g. --set components=16")
    g.add_argument("--features", metavar="SPEC", help="feature spec, e.g. 'mfcc(coeffs=20)' (same as --set features=...)")
    g.add_argument("--clip-ms", type=int, help="window length in ms (0 = whole recording)")
    g.add_argument("--clip-shift-ms", type=int, help="step between windows in ms (0 = back to back)")
    g.add_argument("--pad", choices=("none", "zero", "duplicate"), help="how a short last window is completed")


def model_overrides(args) -> dict:
    from wavetrain.models.registry import parse_set

    ov = parse_set(args.set)
    for name in ("features", "clip_ms", "clip_shift_ms", "pad"):
        v = getattr(args, name, None)
        if v is not None:
            ov[name] = v
    return ov


def make_store(args):
    from wavetrain.store import FeatureStore, NullStore

    if getattr(args, "no_cache", False):
        return NullStore()
    from wavetrain.data import use_file_facts
    from wavetrain.store._paths import FILE_FACTS_NAME

    store = FeatureStore(args.cache, max_bytes=cache_limit(args), dtype=getattr(args, "store_dtype", "float32"))
    use_file_facts(store.root / FILE_FACTS_NAME)  # a warm run neither re-hashes nor re-opens files
    return store


def check_settings(args) -> None:
    """--workers (unset: automatic) and --batch-windows must be integers >= 1."""
    if (args.workers is not None and args.workers < 1) or args.batch_windows < 1:
        raise ParameterError("--workers and --batch-windows: expected integers >= 1")


def run_options(args, **extra):
    from wavetrain.pipeline import RunOptions
    from wavetrain.progress import progress_enabled

    check_settings(args)
    if args.device == "cuda":  # fail before any work, not at the first recording
        from wavetrain.train.devices import select_device

        select_device("cuda")
    return RunOptions(store=make_store(args), batch_windows=args.batch_windows, workers=args.workers,
                      cache_bytes=parse_size(args.memory_cache),
                      prefetch=None if args.workers is None else max(2, 2 * args.workers),
                      skip_bad=args.skip_bad,
                      progress=progress_enabled(args.progress), device=args.device, **extra)
