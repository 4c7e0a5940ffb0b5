"""``wavetrain memory``: predict a run's peak memory and the settings that fit a limit."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("memory", help="predict the peak memory of training a model on a data set",
                       description="Predicts peak resident memory by component from file headers and the model "
                                   "spec, and the settings chosen to fit --memory-limit. Reads no samples.")
    p.add_argument("--data", required=True, nargs="+", metavar="PATH")
    p.add_argument("--label", help="label to learn (for the number of label values)")
    p.add_argument("--model", required=True, metavar="SPEC")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])
    p.add_argument("--memory-limit", metavar="SIZE")
    p.add_argument("--workers", type=int, default=None,
                   help="as for train (default: 2 when recordings last 2 s or more on average and there "
                        "are 2+ CPUs, else 1)")
    p.add_argument("--batch-windows", type=int, default=64)
    p.add_argument("--no-cache", action="store_true",
                   help="plan a run without a feature store (passes may extract again while fitting)")
    p.add_argument("--cache-limit", metavar="SIZE",
                   help="the feature store's size bound of the planned run (as for train)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.cli.common import cache_limit, check_settings, parse_size
    from wavetrain.data import load_dataset
    from wavetrain.memory import plan
    from wavetrain.models.registry import build, parse_set

    check_settings(args)
    ds = load_dataset(args.data)
    model = build(args.model, parse_set(args.set))
    model.label_name_ = args.label
    limit = parse_size(args.memory_limit) if args.memory_limit else None
    p = plan(ds, model, memory_limit=limit, workers=args.workers, batch_windows=args.batch_windows,
             persistent_store=not args.no_cache, store_max_bytes=cache_limit(args))
    print(json.dumps(p.to_json()) if args.json else p.format())
    return 0
