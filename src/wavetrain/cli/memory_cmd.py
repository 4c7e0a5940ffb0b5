"""``wavetrain memory``: predict a run's peak memory and the settings that fit a limit."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import add_data_options, add_engine_options, add_model_options, check_engine, int_at_least


def register(sub) -> None:
    p = sub.add_parser("memory", help="predict the peak memory of training a model on a data set",
                       description="Predicts peak resident memory by component from file headers and the model "
                                   "spec, and the settings chosen to fit --memory-limit. Reads no samples. "
                                   "Exits with 2 when the run cannot fit the limit (--json still prints the "
                                   "smallest plan found, with \"fits\": false).")
    add_data_options(p, label_required=False)
    add_model_options(p)
    p.add_argument("--memory-limit", metavar="SIZE", help="the limit to fit, e.g. 256M (default: none)")
    p.add_argument("--workers", type=int_at_least(1), default=None,
                   help="as for train (default: 2 when recordings last 2 s or more on average and there "
                        "are 2+ CPUs, else 1)")
    p.add_argument("--batch-windows", type=int_at_least(1), default=64, help="as for train (default 64)")
    p.add_argument("--no-cache", action="store_true",
                   help="plan a run without a feature store (passes may extract again while fitting)")
    p.add_argument("--cache-limit", metavar="SIZE",
                   help="the feature store's size bound of the planned run (as for train)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    add_engine_options(p, table=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.cli.common import cache_limit, check_model, model_overrides, parse_size
    from wavetrain.core.errors import MemoryLimitError
    from wavetrain.data import load_dataset
    from wavetrain.models.registry import build
    from wavetrain.pipeline.memory import plan

    check_engine(args)
    model = build(args.model, model_overrides(args))
    limit = parse_size(args.memory_limit, "--memory-limit") if args.memory_limit else None
    ds = load_dataset(args.data, where=args.where, labels_from_name=args.labels_from_name)
    if args.label:
        ds.resolve_label(args.label)
    model.label_name_ = args.label
    if args.engine == "spark":
        from wavetrain.spark.plan import plan_spark, plan_within
        from wavetrain.spark.session import SparkSettings

        check_model(args, model, training=True)
        settings = SparkSettings.from_args(args.master, args.spark_conf)
        sp = plan_spark(ds, model, settings) if limit is None else plan_within(ds, model, settings, limit)[0]
        print(json.dumps(sp.to_json()) if args.json else sp.format())
        return 0
    try:
        p = plan(ds, model, memory_limit=limit, workers=args.workers, batch_windows=args.batch_windows,
                 persistent_store=not args.no_cache, store_max_bytes=cache_limit(args))
    except MemoryLimitError as e:
        if args.json and e.plan is not None:
            print(json.dumps({**e.plan.to_json(), "fits": False, "error": str(e)}))
            sys.stdout.flush()
        raise
    print(json.dumps({**p.to_json(), "fits": True}) if args.json else p.format())
    return 0
