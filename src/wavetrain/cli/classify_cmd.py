"""``wavetrain classify``: label files or segments with a trained model."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import (
    add_engine_options,
    add_store_options,
    check_engine,
    load_model_file,
    plan_run,
    report_skipped,
    report_store,
    run_options,
    spark_job,
)
from wavetrain.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("classify", help="classify audio files with a trained model",
                       description="Print one line per window: `file[start-end ms]: label=value confidence=0.93` "
                                   "(neural models: the model's probability of the value) or `... loglik=-41.3 "
                                   "margin=5.2 z=-0.4` (gmm: the mean frame log-likelihood, its lead over the next "
                                   "value, and how many training standard deviations it lies from that value's "
                                   "training windows). Inputs at another sample rate are resampled to the "
                                   "model's.")
    p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt",
                   help="trained model file (from `wavetrain train`)")
    p.add_argument("paths", nargs="*", metavar="PATH", help="audio files, folders or a metadata.csv")
    p.add_argument("--data", nargs="+", metavar="PATH", default=[], help="the same as PATH")
    p.add_argument("--json", action="store_true", help="write JSON lines (every value's score)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the predictions to FILE (.parquet, .csv or .jsonl: one row per window, every "
                        "value's score) instead of printing them")
    add_store_options(p)
    add_engine_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.data import load_dataset
    from wavetrain.outputs import check_output_file
    from wavetrain.pipeline import predict, prediction_stream
    from wavetrain.prediction import prediction_format, write_predictions

    check_engine(args)
    paths = list(args.paths) + list(args.data)
    if not paths:
        raise UserError("classify: give the recordings to classify (PATH ... or --data PATH ...)")
    if args.engine == "spark" and not args.output:
        raise UserError("classify --engine spark writes a predictions file: add -o predictions.parquet (or "
                        ".csv, .jsonl)")
    if args.output:
        prediction_format(args.output)
        check_output_file(args.output)
    model = load_model_file(args.model_file)
    opts = run_options(args)
    ds = load_dataset(paths, skip_bad=args.skip_bad, progress=opts.progress)
    label = model.label_name_ or "label"
    if args.engine == "spark":
        from wavetrain.spark.engine import classify

        with spark_job(args) as job:
            n, skipped = classify(job, model, ds, args.output)
        print(f"wrote {n} predictions of {len(ds) - len(skipped)} recordings to {args.output}", file=sys.stderr)
        report_skipped(skipped)
        return 0
    plan_run(args, ds, None, opts, model=model)
    stream = prediction_stream(model, ds, opts)
    if args.output:
        n = write_predictions(args.output, (p.to_json(label) for p in predict(model, stream)), list(model.labels_))
        print(f"wrote {n} predictions to {args.output}", file=sys.stderr)
    else:
        out = sys.stdout
        for p in predict(model, stream):
            if args.json:
                out.write(json.dumps(p.to_json(label)) + "\n")
            else:
                out.write(f"{p.file}[{p.start_ms}-{p.end_ms}]: {p.describe(label)}\n")
    report_skipped(list(ds.skipped) + list(stream.stats.skipped))
    report_store(opts.store)
    return 0
