"""Options shared by several commands, and turning them into run settings."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from wavetrain.core.devices import TRAIN_DEVICES
from wavetrain.core.errors import ParameterError
from wavetrain.store.protocol import Store

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


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 recording``, ``2 recordings`` (``plural``: when not ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def human_size(n: float, fmt: str = ".1f") -> str:
    """``77004`` -> ``'75.2 KiB'`` (binary units; ``fmt`` formats all but whole bytes)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:{fmt}} {unit}"
        n /= 1024
    return f"{n:{fmt}} TiB"  # pragma: no cover


def report_store(store: Store) -> None:
    """After a run: say so when the store could not keep the features (entries evicted, grams
    that do not fit the bound, writes the disk refused): later passes and runs then extract them
    again."""
    import sys

    evicted, skipped, refused = store.evicted, store.not_stored, store.write_errors
    if refused:
        print(f"feature store: the disk refused {refused} writes (full, read-only or failing); those "
              f"features were not stored and are extracted again on later runs: free space in "
              f"{store.root} or pass another --cache", file=sys.stderr)
    if not (evicted or skipped):
        return
    limit = human_size(store.max_bytes or 0, ".3g")
    what = [f"evicted {evicted} least-recently-used entries"] if evicted else []
    if skipped:
        what.append(f"did not store {skipped} grams that do not fit the limit")
    print(f"feature store: {' and '.join(what)} to stay under {limit}; features that do not fit "
          "are extracted again on later passes and runs: raise --cache-limit (or set "
          f"{CACHE_LIMIT_ENV})", file=sys.stderr)


def parse_size(text: str, option: str | None = None) -> int:
    """``'256M'`` -> bytes. Units K, M, G (powers of 1024); a bare number is bytes. ``option``
    (e.g. ``'--memory-limit'``) is named in the error."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", str(text))
    if not m:
        where = f"{option}: " if option else ""
        raise ParameterError(f"{where}size {text!r}: expected a number with an optional unit K, M or G "
                             "(e.g. 256M)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m[2].lower()]
    return int(float(m[1]) * mult)


def int_at_least(low: int):
    """An argparse ``type``: an integer >= ``low`` (a bad value is argparse's one-line error)."""
    def convert(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value
    convert.__name__ = f"integer >= {low}"
    return convert


#: What a path option names, set on its argparse action by :func:`reads` / :func:`writes` and read by
#: :func:`guard_outputs`: a file or folder read, a data set read (its metadata, folders and audio), a
#: model spec (a .toml file or a built-in name), a file or folder written. Every option that names a
#: path has one (tests/test_writers_safety.py checks it, and runs each writer against its inputs).
PATH_ROLES = ("reads-file", "reads-folder", "reads-data", "writes-file", "writes-folder")


def reads(action: argparse.Action, kind: str = "file") -> argparse.Action:
    """Declare that ``action``'s option names what the command reads: a ``file``, a ``folder``,
    a ``data`` set or a model ``spec`` (a file when one exists by that name, else a built-in name)."""
    role = {"file": "reads-file", "folder": "reads-folder", "data": "reads-data", "spec": "reads-file"}[kind]
    setattr(action, "path_role", role)  # noqa: B010 (an attribute argparse does not declare)
    return action


def writes(action: argparse.Action, kind: str = "file", *, may_be: str | None = None) -> argparse.Action:
    """Declare that ``action``'s option names a ``file`` or ``folder`` the command writes;
    ``may_be``: the dest of an input option it may equal (a checkpoint folder resumed from)."""
    setattr(action, "path_role", f"writes-{kind}")  # noqa: B010
    setattr(action, "may_be", may_be)  # noqa: B010
    return action


def path_options(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, str]]:
    """The actions of ``parser`` declared by :func:`reads` / :func:`writes`, with their roles."""
    return [(a, role) for a in parser._actions if (role := getattr(a, "path_role", None))]


def _given(value) -> list[str]:
    """An option's value as a list of paths (none, one, or nargs' list); ``-`` (stdin) and
    URIs (``hdfs://``, ``s3://``: not local paths) are left out."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [str(v) for v in values if v not in (None, "", "-") and "://" not in str(v)]


def guard_outputs(args, ds=None, *, inputs=(), outputs=()) -> None:
    """Refuse, before the first write, every output of the command that is, contains or lies
    inside one of its inputs (:func:`wavetrain.core.outputs.refuse_inputs`): the outputs and
    inputs are the options declared by :func:`writes` and :func:`reads` on the command's parser,
    a data set option standing for its metadata, folders and every audio file of ``ds``;
    ``inputs``: what no option names (another data set's paths); ``outputs``: files written
    beside an option's (as ``(path, option)``). :func:`wavetrain.cli.main.main` calls it for
    every command before the command opens anything; a command that reads a data set calls it
    again with ``ds`` (its recordings may lie anywhere) before its first write.

    Raises
    ------
    OutputError
        In one line naming the option, the output and the input.
    """
    from wavetrain.core.outputs import refuse_inputs
    from wavetrain.data.dataset import input_paths

    parser = getattr(args, "_parser", None)
    if parser is None:
        raise RuntimeError("guard_outputs: the arguments were not parsed by wavetrain's parser")
    written: list[tuple[str, str, bool, str | None]] = [(str(p), option, True, None) for p, option in outputs]
    read: dict[str, list] = {"": list(inputs)}
    for action, role in path_options(parser):
        values = _given(getattr(args, action.dest, None))
        if not values:
            continue
        option = action.option_strings[0] if action.option_strings else str(action.metavar or action.dest)
        if role.startswith("writes-"):
            written.extend((v, option, role == "writes-file", getattr(action, "may_be", None)) for v in values)
        elif role == "reads-data":
            read[action.dest] = input_paths(values)
        elif role == "reads-file":      # (a folder or a missing file is the command's own error to report)
            read[action.dest] = [v for v in values if Path(v).is_file()]
        else:
            read[action.dest] = values
    if ds is not None:
        read["_dataset"] = input_paths((), ds)
    for path, option, file, may_be in written:
        refuse_inputs({path: option}, (i for dest, paths in read.items() if dest != may_be for i in paths),
                      files=file)


def add_data_options(p: argparse.ArgumentParser, *, label_required: bool = True, normal: bool = False) -> None:
    """``--data``, ``--labels-from-name``, ``--where`` and ``--label`` of train, evaluate, memory and
    plot roc (and ``--normal``)."""
    reads(p.add_argument("--data", required=True, nargs="+", metavar="PATH",
                         help="metadata.csv, a folder with one, a folder of class sub-folders, or audio files"),
          "data")
    add_name_labels_option(p)
    add_where_option(p)
    p.add_argument("--label", required=label_required, metavar="NAME",
                   help="the label to learn, e.g. word (for a folder of class sub-folders: any name)"
                        + ("; anomaly detectors: the label that tells normal recordings (optional: without it "
                           "every recording is normal)" if normal else ""))
    if normal:
        p.add_argument("--normal", metavar="VALUE",
                       help="anomaly detectors: the value of --label that marks normal recordings (default: "
                            "normal, or the only value)")


def add_name_labels_option(p) -> None:
    """``--labels-from-name PATTERN``: labels from each audio file's name (checked as it is parsed)."""
    p.add_argument("--labels-from-name", metavar="PATTERN", type=name_pattern,
                   help="labels from each audio file's name without its extension, e.g. '{digit}_{speaker}_{take}' "
                        "for 0_george_3.wav: each {field} the shortest run of characters that lets the rest match, "
                        "{_} a part ignored; joined with the metadata's labels (a different value is refused); a "
                        "name that does not match is refused, or skipped with --skip-bad")


def add_where_option(p) -> None:
    """``--where LABEL=VALUE[,VALUE]`` (repeatable)."""
    p.add_argument("--where", metavar="LABEL=VALUE[,VALUE]", action="append", default=[], type=where_condition,
                   help="keep only the recordings whose LABEL has one of these values (repeatable: all must "
                        "hold), e.g. --where machine=fan --where split=train")


def name_pattern(text: str) -> str:
    """An argparse ``type``: a file-name pattern (:class:`~wavetrain.data.name_labels.NamePattern`),
    checked and kept as text."""
    from wavetrain.data.name_labels import NamePattern

    try:
        NamePattern(text)
    except ParameterError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def where_condition(text: str) -> tuple[str, tuple[str, ...]]:
    """An argparse ``type``: ``LABEL=VALUE[,VALUE...]`` as ``(label, values)``."""
    label, sep, values = str(text).partition("=")
    vals = tuple(v.strip() for v in values.split(",") if v.strip())
    if not sep or not label.strip() or not vals:
        raise argparse.ArgumentTypeError(f"expected LABEL=VALUE[,VALUE...], got {text!r}")
    return label.strip(), vals


def load_data(args, opts=None, paths=None):
    """The data set of ``--data`` (or ``paths``) with the labels of ``--labels-from-name``,
    narrowed by ``--where`` (``--skip-bad``; ``opts``: the run's progress bars)."""
    from wavetrain.data import load_dataset

    return load_dataset(args.data if paths is None else paths, skip_bad=getattr(args, "skip_bad", False),
                        progress=bool(opts is not None and opts.progress), where=getattr(args, "where", ()),
                        labels_from_name=getattr(args, "labels_from_name", None))


def add_cache_option(p) -> None:
    writes(p.add_argument("--cache", metavar="DIR", type=non_empty("--cache", "a folder (or omit --cache for the "
                                                                   "default)"),
                          help="feature store folder (default: $WAVETRAIN_CACHE or ~/.cache/wavetrain)"), "folder")


def non_empty(option: str, what: str):
    """An argparse ``type``: a string that is not empty or blank."""
    def convert(text: str) -> str:
        if not str(text).strip():
            raise argparse.ArgumentTypeError(f"empty value; expected {what}")
        return text
    convert.__name__ = option
    return convert


def add_store_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("feature store and resources")
    add_cache_option(g)
    g.add_argument("--no-cache", action="store_true", help="do not read or write the feature store")
    g.add_argument("--cache-limit", metavar="SIZE",
                   help="bound of everything the store keeps on disk, least-recently-used entries evicted "
                        f"beyond it (e.g. 2G; 'none' = no limit; default ${CACHE_LIMIT_ENV} or "
                        f"{DEFAULT_CACHE_LIMIT})")
    g.add_argument("--store-dtype", choices=("float32", "float16"), default="float32",
                   help="precision of stored features (default float32)")
    g.add_argument("--workers", type=int_at_least(1), default=None,
                   help="threads loading/extracting ahead of training (default: 2 when recordings last "
                        "2 s or more on average and there are 2+ CPUs, else 1)")
    g.add_argument("--batch-windows", type=int_at_least(1), default=64, help="windows per batch (default 64)")
    g.add_argument("--memory-limit", metavar="SIZE", help="fit the run into SIZE of resident memory (e.g. 256M)")
    g.add_argument("--memory-cache", metavar="SIZE", default="64M",
                   help="in-memory feature cache in front of the store (default 64M; fixed, not grown with data)")
    g.add_argument("--skip-bad", action="store_true", help="skip unreadable recordings and report how many")
    g.add_argument("--device", default="cpu", choices=TRAIN_DEVICES, help="compute device (default cpu)")
    g.add_argument("--progress", dest="progress", action="store_true", default=None, help="force progress bars")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def add_model_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("model")
    from wavetrain.models.registry import DEFAULT_MODEL

    reads(g.add_argument("--model", metavar="SPEC", required=required, default=None if required else DEFAULT_MODEL,
                         help="built-in model name (see `wavetrain models`) or a .toml model spec"
                              + ("" if required else f" (default {DEFAULT_MODEL})")), "spec")
    g.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="override a model parameter (repeatable), e.g. --set components=16")
    g.add_argument("--features", metavar="SPEC", help="feature spec, e.g. 'mfcc(coeffs=20)' (same as --set "
                                                      "features=...; extractors: `wavetrain features --help`)")
    g.add_argument("--clip-ms", type=int_at_least(0), help="window length in ms (0 = whole recording)")
    g.add_argument("--clip-shift-ms", type=int_at_least(0), help="step between windows in ms (0 = back to back)")
    g.add_argument("--pad", choices=("none", "zero", "duplicate"), help="how a short last window is completed")


def parse_set(items: list[str] | None) -> dict[str, str]:
    """``--set`` values: ``['components=16', 'features=mfcc(coeffs=20)']`` -> dict (values stay strings)."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ParameterError(f"--set {it!r}: expected key=value (e.g. --set components=16)")
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def model_overrides(args) -> dict:
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


def run_options(args, **extra):
    from wavetrain.core.progress import progress_enabled
    from wavetrain.pipeline.jobs import RunOptions

    if args.device == "cuda":  # fail before any work, not at the first recording
        from wavetrain.core.devices import select_device

        select_device("cuda")
    return RunOptions(store=make_store(args), batch_windows=args.batch_windows, workers=args.workers,
                      cache_bytes=parse_size(args.memory_cache, "--memory-cache"), prefetch=None,
                      skip_bad=args.skip_bad,
                      progress=progress_enabled(args.progress), device=args.device, **extra)


def plan_run(args, ds, overrides, opts, engine, model=None):
    """Plan the run's memory (``train``, ``evaluate``, ``classify``) on ``engine``: with
    ``--memory-limit``, change the run's settings to fit it or refuse at once. With a trained ``model`` (``classify``,
    ``evaluate -m``) the run is planned as if training it on ``ds``: an upper bound of what
    prediction needs. ``$WAVETRAIN_SHOW_PLAN`` prints the plan on stderr."""
    import os
    import sys

    from wavetrain.models.registry import build

    limit = parse_size(args.memory_limit, "--memory-limit") if getattr(args, "memory_limit", None) else None
    if model is None:
        model = build(args.model, overrides)
    if model.labels_ is None:
        model.label_name_ = args.label
    p = engine.plan(ds, model, opts, memory_limit=limit)
    if p is None:
        return None
    if os.environ.get("WAVETRAIN_SHOW_PLAN"):
        print(p.format(), file=sys.stderr)
    return p


#: Bad recordings named one by one after a run (the rest are counted).
SKIPPED_SHOWN = 5


def report_skipped(skipped: list) -> None:
    """After a run with --skip-bad: how many recordings were skipped, and the first few with why."""
    import sys

    if not skipped:
        return
    print(f"skipped {len(skipped)} bad recording{'s' if len(skipped) != 1 else ''}:", file=sys.stderr)
    for _rec, reason in skipped[:SKIPPED_SHOWN]:
        print(f"  {reason}", file=sys.stderr)
    if len(skipped) > SKIPPED_SHOWN:
        print(f"  ... and {len(skipped) - SKIPPED_SHOWN} more", file=sys.stderr)


def load_model_file(path: str):
    """``-m MODEL``: a trained model file; a built-in model name given by mistake gets a hint."""
    from pathlib import Path

    from wavetrain.core.errors import ModelFileError
    from wavetrain.models.modelfile import load_model
    from wavetrain.models.registry import family_names, preset_names

    if not Path(path).exists() and path in family_names() + preset_names():
        raise ModelFileError(f"-m {path}: no such model file; {path!r} is a model name: -m takes a trained "
                             f"model file (.wt, from `wavetrain train`), --model takes a model name")
    return load_model(path)


ENGINES = ("local", "spark")


def add_engine_options(p: argparse.ArgumentParser, *, retries: bool = False, table: bool = True) -> None:
    """``--engine`` and the Spark engine's settings."""
    g = p.add_argument_group("engine")
    g.add_argument("--engine", choices=ENGINES, default="local",
                   help="local (default: this process) or spark (a Spark cluster, or local[*] Spark)")
    g.add_argument("--master", metavar="URL",
                   help="Spark master: local[*] (default, or $WAVETRAIN_SPARK_MASTER), local[N], spark://HOST:PORT, "
                        "yarn, k8s://...")
    g.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                   help="a Spark setting (repeatable), e.g. --spark-conf spark.executor.memory=2g")
    if table:
        writes(g.add_argument("--table", metavar="DIR",
                              help="the shared feature table (a folder or hdfs:// / s3:// URI every executor reaches; "
                                   "default on this machine: <cache folder>/spark-table)"), "folder")
    if retries:
        g.add_argument("--max-retries", type=int_at_least(0), default=5,
                       help="neural training on Spark: failed runs retried from the last checkpoint (default 5)")
        g.add_argument("--processes", type=int_at_least(1), default=None,
                       help="neural training on Spark: data-parallel ranks (default: the cluster's cores)")


def check_engine(args) -> None:
    """Refuse Spark settings given to the local engine (they would be ignored silently)."""
    if args.engine == "spark":
        return
    given = [opt for opt, name in (("--master", "master"), ("--spark-conf", "spark_conf"), ("--table", "table"),
                                   ("--processes", "processes")) if getattr(args, name, None)]
    if given:
        raise ParameterError(f"{given[0]} applies to --engine spark; add --engine spark or drop {given[0]}")


def engine_type(args):
    """The engine class ``--engine`` names (nothing started)."""
    if args.engine == "spark":
        from wavetrain.spark.engine import SparkEngine

        return SparkEngine
    from wavetrain.pipeline.engine import LocalEngine

    return LocalEngine


def check_model(args, model, *, training: bool) -> None:
    """Refuse, before any work, a model the engine cannot train (``training``) or score (its
    :meth:`~wavetrain.pipeline.engine.Engine.refusal`, from the model's tags), an unfitted model's
    ``augment`` that training would refuse, and run settings that would be ignored
    (``--processes`` for a model that does not train as distributed ranks, ``--normal`` for a
    classifier)."""
    from wavetrain.pipeline.jobs import training_augmenter

    reason = engine_type(args).refusal(model, training=training)
    if reason:
        raise ParameterError(reason)
    if model.labels_ is None:
        training_augmenter(model)
    ranks = [m for m in [model, *model.members()] if m.supports_distributed]
    if getattr(args, "processes", None) and not ranks:
        raise ParameterError(f"--processes sets the ranks of distributed training; {model.name} learns by "
                             f"{model.learns_by}, not as distributed ranks: drop --processes")
    if getattr(args, "normal", None) is not None and not model.detector:
        raise ParameterError(f"--normal applies to anomaly detectors; {model.name} learns every value of "
                             f"{args.label!r}")


def check_data(args, ds) -> None:
    """Refuse, before any work, what the data set alone shows: ``--label`` and ``--group-by`` not
    labels of ``ds``."""
    if getattr(args, "group_by", None):
        for g in args.group_by.split(","):
            ds.resolve_label(g.strip())
    if getattr(args, "label", None):
        ds.resolve_label(args.label)


def open_engine(args, table: str | None = None):
    """A context manager giving the engine of the command line: this process, or a
    :class:`~wavetrain.spark.engine.SparkEngine` (a Spark session for ``--master``/``--spark-conf``,
    started when the job first needs it; the feature table ``table`` or ``--table``)."""
    from contextlib import contextmanager, nullcontext

    if args.engine != "spark":
        from wavetrain.pipeline.engine import LocalEngine

        return nullcontext(LocalEngine())
    from wavetrain.core.errors import UserError
    from wavetrain.spark.engine import SparkEngine
    from wavetrain.spark.session import SparkSettings, check_pyspark
    from wavetrain.spark.shards import configured_cache_bytes
    from wavetrain.spark.table import FeatureTable, check_location

    check_pyspark()         # the spark extra: one line, before its table or session is opened
    settings = SparkSettings.from_args(args.master, args.spark_conf)
    configured_cache_bytes(settings.resolved_conf())     # a bad size: one line before the JVM, not in every task
    root = table or getattr(args, "table", None)
    if not root:
        if not settings.is_local:
            raise UserError(f"--table: a cluster ({settings.master}) needs a feature table every executor can reach: "
                            "give a shared folder or an hdfs:// or s3:// URI")
        from wavetrain.store._paths import default_root

        root = str((Path(args.cache) if getattr(args, "cache", None) else default_root()) / "spark-table")
    check_location(root, option="-o" if table else "--table")     # before the JVM starts

    @contextmanager
    def run():
        table = FeatureTable(root)
        try:
            with SparkEngine(None, table, settings=settings, max_retries=getattr(args, "max_retries", 5),
                             processes=getattr(args, "processes", None)) as engine:
                yield engine
        except BaseException:       # Ctrl-C or a failure: this run's tasks cut short leave temporary files
            table.sweep(mine=True)
            raise

    return run()
