"""``wavetrain features``: extract features of every recording into .npy files plus an index.

    wavetrain features --data PATH --spec SPEC -o DIR

writes ``DIR/NNNNNN_<name>.npy`` (float32, ``(frames, features)``) per recording or segment and
``DIR/index.csv`` with columns ``file, name, id, labels, frames, features, rate,
frame_shift_s, spec``.  Files are written atomically (temporary name, then rename).
"""
from __future__ import annotations

import csv
import os
import re
from pathlib import Path

from wavetrain.errors import ParameterError, UserError

INDEX_NAME = "index.csv"
COLUMNS = ("file", "name", "id", "labels", "frames", "features", "rate", "frame_shift_s", "spec")


def register(sub) -> None:
    """Add the ``features`` command to ``sub``."""
    p = sub.add_parser("features", help="extract features to one .npy per recording plus an "
                                        "index.csv")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="metadata.csv, folder of class folders, audio file(s)")
    p.add_argument("--spec", required=True, metavar="SPEC",
                   help="feature spec, e.g. 'logmel(bands=64)' or 'mfcc(coeffs=13) | delta'")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    p.add_argument("--device", default="cpu", help="cpu (default), cpu-torch or cuda")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable or too-short recordings and report how many")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="force a progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:80] or "recording"


def _save_npy(path: Path, array) -> None:
    import numpy as np

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, array)
    os.replace(tmp, path)


def run(args) -> int:
    """Extract and write; returns the exit code (0)."""
    from wavetrain.data import load_dataset
    from wavetrain.data.recording import format_labels
    from wavetrain.features import extract, parse_spec
    from wavetrain.progress import progress_bar

    spec = parse_spec(args.spec)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise ParameterError(f"-o {out}: exists and is not a folder; give a folder path")
    out.mkdir(parents=True, exist_ok=True)
    dataset = load_dataset(args.data, skip_bad=args.skip_bad)
    rows, skipped = [], 0
    recordings = list(dataset)
    for i, rec in enumerate(progress_bar(recordings, desc="features", unit="rec",
                                         enable=args.progress)):
        try:
            samples, rate = rec.load(mono=not spec.per_axis)
            feats = extract(samples, rate, spec, device=args.device)
        except UserError as e:
            if not args.skip_bad:
                raise type(e)(f"{rec.name}: {e}") from None
            skipped += 1
            continue
        fname = f"{i:06d}_{_safe(rec.name)}.npy"
        _save_npy(out / fname, feats)
        rows.append({"file": fname, "name": rec.name, "id": rec.id,
                     "labels": format_labels(rec.labels), "frames": feats.shape[0],
                     "features": feats.shape[1], "rate": spec.rate or rate,
                     "frame_shift_s": f"{spec.frame_shift_s(rate):.6g}", "spec": str(spec)})
    tmp = out / (INDEX_NAME + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, out / INDEX_NAME)
    skipped += len(getattr(dataset, "skipped", []) or [])
    msg = f"wrote {len(rows)} feature file(s) and {INDEX_NAME} to {out} (spec key {spec.key})"
    if skipped:
        msg += f"; skipped {skipped} bad recording(s)"
    print(msg)
    return 0
