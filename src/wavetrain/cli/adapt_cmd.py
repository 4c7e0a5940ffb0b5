"""``wavetrain adapt``: teach a trained anomaly detector new normal recordings without retraining."""
from __future__ import annotations

import time

from wavetrain.cli.common import (
    add_engine_options,
    add_name_labels_option,
    add_store_options,
    check_engine,
    check_model,
    counted,
    guard_outputs,
    load_data,
    load_model_file,
    open_engine,
    reads,
    report_skipped,
    report_store,
    run_options,
    where_condition,
    writes,
)

DESCRIPTION = """\
A new unit of a product line, or a known unit in a new operating condition, from a few normal
recordings: the detector adds them to what it knows of normal sound (a nearest-neighbour
detector: their vectors join its summary) without being trained again, scores each new recording
against what it knows without it, and raises its threshold if those scores need it (one threshold
for the old units and the new one). The recordings must be normal, of the model's sample rate, and
told by the model's label if they carry it. Example:
wavetrain adapt -m pumps.wt --data new-pump/ -o pumps-new.wt
"""


def register(sub) -> None:
    import argparse

    p = sub.add_parser("adapt", help="teach a trained anomaly detector new normal recordings (a new unit from a few "
                                     "clips)", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    reads(p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt", help="a trained anomaly detector"))
    reads(p.add_argument("--data", required=True, nargs="+", metavar="PATH",
                         help="the new normal recordings: metadata.csv, a folder or audio files"), "data")
    add_name_labels_option(p)
    p.add_argument("--where", metavar="LABEL=VALUE[,VALUE]", action="append", default=[], type=where_condition,
                   help="keep only the recordings whose LABEL has one of these values (repeatable)")
    p.add_argument("--label", metavar="NAME",
                   help="the label that tells normal recordings (it must be the model's; default: the model's)")
    writes(p.add_argument("-o", "--output", required=True, metavar="MODEL.wt", help="the adapted model file to write"))
    add_store_options(p)
    add_engine_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.core.outputs import check_output_file
    from wavetrain.models.modelfile import read_model_file, save_model
    from wavetrain.pipeline.jobs import adapt_model

    check_engine(args)
    check_output_file(args.output)
    model = load_model_file(args.model_file)
    meta, _ = read_model_file(args.model_file)
    check_model(args, model, training=True)
    opts = run_options(args)
    ds = load_data(args, opts)
    guard_outputs(args, ds)
    with open_engine(args) as engine:
        t0 = time.perf_counter()
        info, prep = adapt_model(model, ds, opts, label=args.label, engine=engine)
        seconds = time.perf_counter() - t0
    steps = [*(meta.get("adapted") or []), {**info, "recordings": len(prep.ds), "seconds": round(seconds, 3)}]
    save_model(model, args.output, extra={"training": meta.get("training"), "adapted": steps})
    raised = "raised" if info["threshold"] > info["threshold_before"] else "kept"
    print(f"adapted {model.name} to {counted(len(prep.ds), 'recording')} ({counted(info['windows'], 'window')} "
          f"scored against the others); threshold {raised}: {info['threshold_before']:.4g} -> "
          f"{info['threshold']:.4g} (theirs at fpr {model.params['fpr']:g}: {info['threshold_new']:.4g}) in "
          f"{seconds:.1f} s -> {args.output}")
    report_skipped(list(ds.skipped) + list(prep.skipped))
    report_store(opts.store)
    return 0
