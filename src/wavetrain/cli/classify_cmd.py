"""``wavetrain classify``: label files or segments with a trained model."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import add_store_options, load_model_file, plan_run, report_skipped, report_store, run_options


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
    p.add_argument("paths", nargs="+", metavar="PATH", help="audio files, folders or a metadata.csv")
    p.add_argument("--json", action="store_true", help="write JSON lines (every value's score)")
    add_store_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.data import load_dataset
    from wavetrain.pipeline import predict, prediction_stream

    model = load_model_file(args.model_file)
    opts = run_options(args)
    ds = load_dataset(args.paths, skip_bad=args.skip_bad, progress=opts.progress)
    label = model.label_name_ or "label"
    plan_run(args, ds, None, opts, model=model)
    out = sys.stdout
    stream = prediction_stream(model, ds, opts)
    for p in predict(model, stream):
        if args.json:
            out.write(json.dumps(p.to_json(label)) + "\n")
        else:
            out.write(f"{p.file}[{p.start_ms}-{p.end_ms}]: {p.describe(label)}\n")
    report_skipped(list(ds.skipped) + list(stream.stats.skipped))
    report_store(opts.store)
    return 0
