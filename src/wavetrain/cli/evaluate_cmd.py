"""``wavetrain evaluate``: k-fold cross-validation, or a trained model on a labelled set."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import (add_model_options, add_store_options, model_overrides, report_store,
                                  run_options)
from wavetrain.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="cross-validate a model spec, or test a trained model",
                       description="k-fold cross-validation of a model spec (folds of whole recordings, "
                                   "or whole groups with --group-by), or evaluation of a trained model (-m).")
    p.add_argument("--data", required=True, nargs="+", metavar="PATH")
    p.add_argument("--label", required=True)
    p.add_argument("-m", "--model-file", metavar="MODEL", help="evaluate this trained model instead of k-fold")
    p.add_argument("--folds", type=int, default=5, help="number of folds (default 5)")
    p.add_argument("--group-by", metavar="LABEL", help="keep each value of this label in one fold (e.g. speaker)")
    p.add_argument("--seed", type=int, default=0, help="fold assignment seed (default 0)")
    p.add_argument("--cm", action="store_true", help="print the confusion matrix")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_model_options(p, required=False)
    add_store_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.data import load_dataset
    from wavetrain.evaluate.metrics import format_report
    from wavetrain.memory import apply_memory_limit
    from wavetrain.pipeline import evaluate_kfold, evaluate_model

    opts = run_options(args, group_by=args.group_by, seed=args.seed)
    ds = load_dataset(args.data, skip_bad=args.skip_bad, progress=opts.progress)
    if args.model_file:
        from wavetrain.models.modelfile import load_model

        model = load_model(args.model_file)
        if args.memory_limit:
            apply_memory_limit(args, ds, None, opts, model=model)
        res = evaluate_model(model, ds, args.label, opts)
        res["model"] = model.name
    else:
        overrides = model_overrides(args)
        apply_memory_limit(args, ds, overrides, opts)

        def on_fold(info):
            if not args.json:
                print(f"fold {info['fold']}/{args.folds}: accuracy {info['accuracy']:.4f}  macro-F1 "
                      f"{info['macro_f1']:.4f}  ({info['train_recordings']} train / {info['test_recordings']} "
                      f"test recordings, trained in {info['train_seconds']:.1f} s)", file=sys.stderr)

        res = evaluate_kfold(ds, args.label, args.model, overrides, opts, folds=args.folds, on_fold=on_fold)
        res["model"] = args.model
    res["skipped"] = len(ds.skipped)
    if args.json:
        print(json.dumps(res))
    else:
        if res.get("rare_values"):
            rare = ", ".join(f"{v} ({n})" for v, n in sorted(res["rare_values"].items()))
            print(f"note: values with fewer {'groups' if args.group_by else 'recordings'} than folds "
                  f"(not in every fold): {rare}")
        if res.get("unseen_values"):
            print(f"note: values the model never saw in training: {', '.join(res['unseen_values'])}")
        print(format_report(res, show_cm=args.cm))
    if res["skipped"]:
        print(f"skipped {res['skipped']} bad recordings", file=sys.stderr)
    if res["windows"] == 0:
        raise UserError("no windows were evaluated (all recordings shorter than one clip?)")
    report_store(opts.store)
    return 0
