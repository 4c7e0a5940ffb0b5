"""``wavetrain features``: extract features of every recording into .npy files plus an index,
or (``--engine spark``) into the shared Parquet feature table.

    wavetrain features --data PATH --spec SPEC -o DIR

writes ``DIR/NNNNNN_<name>.npy`` (float32, ``(frames, features)``) per recording or segment and
``DIR/index.csv`` with columns ``file, name, id, labels, frames, features, rate,
frame_shift_s, spec``.  Files are written atomically (temporary name, then rename).
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from wavetrain.cli.common import (
    add_engine_options,
    add_name_labels_option,
    check_engine,
    guard_outputs,
    open_engine,
    reads,
    writes,
)
from wavetrain.core.devices import FEATURE_DEVICES
from wavetrain.core.errors import UserError
from wavetrain.core.extras import require
from wavetrain.core.outputs import check_output_folder, staged_folder, write_atomic

INDEX_NAME = "index.csv"
COLUMNS = ("file", "name", "id", "labels", "frames", "features", "rate", "frame_shift_s", "spec")


def register(sub) -> None:
    """Add the ``features`` command to ``sub``."""
    import argparse

    p = sub.add_parser("features", help="extract features to one .npy per recording plus an index.csv",
                       description="Extract the features of every recording into DIR/NNNNNN_<name>.npy (float32, "
                                   "frames x features) plus DIR/index.csv. A feature spec is an extractor, "
                                   "optionally followed by processors: 'mfcc(coeffs=13) | delta(order=2)'.",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    reads(p.add_argument("--data", required=True, nargs="+", metavar="PATH",
                         help="metadata.csv, folder of class folders, audio file(s)"), "data")
    add_name_labels_option(p)
    p.add_argument("--features", "--spec", dest="spec", required=True, metavar="SPEC",
                   help="feature spec, e.g. 'logmel(bands=64)' or 'mfcc(coeffs=13) | delta' (extractors, "
                        "processors and their parameters are listed below)")
    writes(p.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder (created if missing)"),
           "folder")
    p.add_argument("--device", default="cpu", choices=FEATURE_DEVICES,
                   help="cpu (default), cpu-torch or cuda")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable or too-short recordings and report how many")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="force a progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_engine_options(p, table=False)
    p.set_defaults(func=run)
    lazy_epilog(p, spec_reference)


def lazy_epilog(parser, make) -> None:
    """Compute ``parser``'s epilog only when its help is shown (it imports the feature modules)."""
    plain = parser.format_help

    def format_help() -> str:
        parser.epilog = make()
        return plain()

    parser.format_help = format_help


def spec_reference() -> str:
    """Every extractor and processor with its parameters, defaults and meaning (help text)."""
    import textwrap

    from wavetrain.core.params import format_value
    from wavetrain.features import describe_specs

    lines = []
    for kind in ("extractor", "processor"):
        lines.append(f"{kind}s:")
        for stage in describe_specs():
            if stage["kind"] != kind:
                continue
            lines.append(f"  {stage['name']}: {stage['doc']}")
            for prm in stage["params"]:
                head = f"    {prm['name']}={format_value(prm['default'])}  "
                lines.append(textwrap.fill(prm["doc"], width=100, initial_indent=head,
                                           subsequent_indent=" " * 8))
        lines.append("")
    return "\n".join(lines)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:80] or "recording"


def _save_npy(path: Path, array) -> None:
    import numpy as np

    write_atomic(path, lambda f: np.save(f, array), what="features", sync=False)


def _extract_all(dataset, spec, folder: Path, args) -> tuple[list[dict], int]:
    """Write each recording's features into ``folder``; returns the index rows and the count
    of recordings skipped as bad."""
    from wavetrain.core.progress import progress_bar
    from wavetrain.data.recording import format_labels
    from wavetrain.features import extract

    rows, skipped = [], 0
    for i, rec in enumerate(progress_bar(list(dataset), desc="features", unit="rec", enable=args.progress)):
        try:
            samples, rate = rec.load(mono=not spec.per_axis)
            feats = extract(samples, rate, spec, device=args.device)
        except UserError as e:
            if not args.skip_bad:
                raise type(e)(str(e) if str(rec.path) in str(e) else f"{rec.path}: {e}") from None
            skipped += 1
            continue
        fname = f"{i:06d}_{_safe(rec.name)}.npy"
        _save_npy(folder / fname, feats)
        rows.append({"file": fname, "name": rec.name, "id": rec.id,
                     "labels": format_labels(rec.labels), "frames": feats.shape[0],
                     "features": feats.shape[1], "rate": spec.rate or rate,
                     "frame_shift_s": f"{spec.frame_shift_s(rate):.6g}", "spec": str(spec)})
    return rows, skipped


def run(args) -> int:
    """Extract and write; returns the exit code (0)."""
    from wavetrain import models  # noqa: F401  (registers the model-file reader of embedding features)
    from wavetrain.data import load_dataset
    from wavetrain.features import parse_spec

    check_engine(args)
    spec = parse_spec(args.spec)
    if args.engine == "spark":
        return _run_spark(args, spec)
    if args.device != "cpu":    # before any recording is read (and never taken for a bad one by --skip-bad)
        require("torch", f"--device {args.device}")
    out = check_output_folder(args.output)
    dataset = load_dataset(args.data, skip_bad=args.skip_bad, labels_from_name=args.labels_from_name)
    guard_outputs(args, dataset)
    # files go to a staging folder first: a run that fails half-way leaves nothing behind
    with staged_folder(out) as stage:
        rows, skipped = _extract_all(dataset, spec, stage, args)
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(stage / INDEX_NAME, lambda f: f.write(text.getvalue().encode("utf-8")), what="index")
    skipped += len(dataset.skipped)
    msg = f"wrote {len(rows)} feature file(s) and {INDEX_NAME} to {out} (spec key {spec.key})"
    if skipped:
        msg += f"; skipped {skipped} bad recording(s)"
    print(msg)
    return 0


def _run_spark(args, spec) -> int:
    """``features --engine spark``: the grams into the Parquet feature table ``-o`` (a folder or
    URI every executor reaches), extracting only the recordings it lacks."""
    from wavetrain.cli.common import report_skipped
    from wavetrain.core.progress import progress_enabled
    from wavetrain.data import load_dataset
    from wavetrain.pipeline.jobs import RunOptions
    from wavetrain.spark.engine import extract_features

    if "://" not in args.output:
        check_output_folder(args.output)
    dataset = load_dataset(args.data, skip_bad=args.skip_bad, labels_from_name=args.labels_from_name)
    guard_outputs(args, dataset)
    with open_engine(args, table=args.output) as engine:
        prep = extract_features(engine, dataset, str(spec), RunOptions(skip_bad=args.skip_bad,
                                                                        progress=progress_enabled(args.progress)))
    print(f"feature table {args.output}: extracted {prep.extracted} recording(s), {len(prep.ds) - prep.extracted} "
          f"already there (spec key {spec.key})")
    report_skipped(list(dataset.skipped) + prep.skipped)
    return 0
