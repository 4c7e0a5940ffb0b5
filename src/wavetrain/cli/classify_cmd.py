"""``wavetrain classify``: label files or segments with a trained model."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import add_store_options, report_store, run_options


def register(sub) -> None:
    p = sub.add_parser("classify", help="classify audio files with a trained model",
                       description="Print `file[start-end ms]: label=value confidence=0.93` per window.")
    p.add_argument("-m", "--model-file", required=True, metavar="MODEL")
    p.add_argument("paths", nargs="+", metavar="PATH", help="audio files, folders or a metadata.csv")
    p.add_argument("--json", action="store_true", help="write JSON lines")
    add_store_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.data import load_dataset
    from wavetrain.memory import apply_memory_limit
    from wavetrain.models.modelfile import load_model
    from wavetrain.pipeline import predict, prediction_stream

    model = load_model(args.model_file)
    opts = run_options(args)
    ds = load_dataset(args.paths, skip_bad=args.skip_bad, progress=opts.progress)
    label = model.label_name_ or "label"
    if args.memory_limit:
        apply_memory_limit(args, ds, None, opts, model=model)
    out = sys.stdout
    stream = prediction_stream(model, ds, opts)
    for p in predict(model, stream):
        where = f"{p.recording.path}[{p.start_ms}-{p.end_ms}]"
        if args.json:
            out.write(json.dumps({"file": str(p.recording.path), "start_ms": p.start_ms, "end_ms": p.end_ms,
                                  "label": label, "value": p.label, "confidence": round(p.confidence, 6),
                                  "scores": {v: round(float(x), 6) for v, x in zip(model.labels_, p.proba)}}) + "\n")
        else:
            out.write(f"{where}: {label}={p.label} confidence={p.confidence:.2f}\n")
    skipped = len(ds.skipped) + len(stream.stats.skipped)
    if skipped:
        print(f"skipped {skipped} bad recordings", file=sys.stderr)
    report_store(opts.store)
    return 0
