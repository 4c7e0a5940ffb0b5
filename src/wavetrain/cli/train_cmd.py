"""``wavetrain train``: fit a model on a labelled data set and save it."""
from __future__ import annotations

import os
import sys
import time

from wavetrain.cli.common import (
    add_data_options,
    add_engine_options,
    add_model_options,
    add_store_options,
    check_data,
    check_engine,
    check_model,
    counted,
    engine_type,
    guard_outputs,
    load_data,
    model_overrides,
    open_engine,
    plan_run,
    reads,
    report_skipped,
    report_store,
    run_options,
    writes,
)
from wavetrain.models.registry import preset_names


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model and save it to a file",
                       description="Train a model on a labelled data set and write it to a model file.")
    add_data_options(p, label_required=False, normal=True)
    writes(p.add_argument("-o", "--output", required=True, metavar="MODEL", help="model file to write (e.g. model.wt)"))
    p.add_argument("--group-by", metavar="LABEL", help="hold out whole groups for validation (neural models)")
    writes(p.add_argument("--checkpoint", metavar="DIR", help="write checkpoints here (neural models)"), "folder",
           may_be="resume")
    reads(p.add_argument("--resume", metavar="DIR", help="continue from the last checkpoint in DIR (neural models)"),
          "folder")
    p.add_argument("--devices", metavar="LIST",
                   help="devices sharing every training step, e.g. cpu,cuda:0 or cuda:0,cuda:1 (cpu,cpu: two CPU "
                        "replicas; auto: every usable device); --device is one. Neural models split each batch; "
                        "Gaussian mixtures hand each EM pass's blocks of frames to whichever device is free "
                        "(--balance and --sync do not apply)")
    p.add_argument("--balance", default="throughput", metavar="RULE",
                   help="how a device group splits each batch: throughput (default: by measured speed), "
                        "gradient (the finite-difference rule) or fixed:F1,F2,...")
    p.add_argument("--sync", default="allreduce", metavar="MODE",
                   help="how a device group combines its replicas: allreduce (default: gradients added every "
                        "step) or average:H (weights averaged every H steps after H warm-up steps)")
    add_model_options(p, required=False)
    add_store_options(p)
    add_engine_options(p, retries=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.core.errors import ParameterError
    from wavetrain.core.outputs import check_output_file, check_output_folder
    from wavetrain.models.modelfile import save_model
    from wavetrain.models.registry import build, families_with
    from wavetrain.pipeline.jobs import train_model

    check_engine(args)
    # every path the run writes is checked before any work: a wrong one must not cost a training
    check_output_file(args.output)
    if args.checkpoint:
        check_output_folder(args.checkpoint, option="--checkpoint")
    devices = _device_group(args)
    opts = run_options(args, checkpoint=args.checkpoint, resume=args.resume, group_by=args.group_by,
                       devices=devices, balance=args.balance, sync=args.sync)
    model = build(args.model, model_overrides(args))  # an invalid spec or parameter fails before the data is read
    check_model(args, model, training=True)
    network = _network_path(args.output) if getattr(model, "id_labels", ()) else None
    if network:
        check_output_file(network)
    if len(devices) > 1 and not model.supports_device_groups:
        raise ParameterError(f"--devices: {model.name} trains on one device; device groups train "
                             f"{', '.join(families_with(supports_device_groups=True))}")
    ds = load_data(args, opts)
    guard_outputs(args, ds)
    check_data(args, ds)
    with open_engine(args) as engine:
        plan_run(args, ds, None, opts, engine, model=model)
        t0 = time.perf_counter()
        model, prep = train_model(ds, args.label, model, None, opts, normal=args.normal, engine=engine,
                                  network=network)
        seconds = time.perf_counter() - t0
        where = engine.where()
    features, line = prep.training_summary(model)
    stages = {k: v for k, v in model.train_info_.items() if k.endswith("_seconds") and isinstance(v, (int, float))}
    extra = {"training": {**stages, "recordings": len(prep.ds),
                          "seconds_of_audio": round(sum(r.duration_s for r in prep.ds), 3),
                          "train_seconds": round(seconds, 3), **features, "engine": engine.name,
                          **_device_summary(model)}}
    save_model(model, args.output, extra=extra)
    print(_trained(model, args, len(prep.ds), seconds, where))
    print(line, file=sys.stderr)
    report_skipped(list(ds.skipped) + list(prep.skipped))
    report_store(opts.store)
    return 0


def _device_group(args) -> tuple:
    """``--devices`` checked (names, and that each device exists) and the ``--balance`` rule."""
    from wavetrain.core.errors import ParameterError

    if not args.devices:
        return ()
    if not engine_type(args).device_groups:
        raise ParameterError(f"--devices: a device group shares each step in this process; --engine {args.engine} "
                             "does not train on one (on Spark, --processes sets the data-parallel ranks)")
    from wavetrain.core.devices import parse_devices, select_device
    from wavetrain.train.device_group import make_balancer, parse_sync

    devices = parse_devices(args.devices)
    for d in devices:
        select_device(d)
    make_balancer(args.balance, len(devices))
    parse_sync(args.sync)
    return devices


def _device_summary(model) -> dict[str, str]:
    """The model file's ``training`` entry of a device group: each device's work and time, one
    string (the file keeps plain values): a Gaussian mixture's blocks of frames and seconds, or a neural model's
    mean share of each batch and compute seconds per step. Empty for one device."""
    info = model.train_info_
    names = [d for d in str(info.get("device") or "").split(",") if d]
    if len(names) < 2:
        return {}
    if isinstance(info.get("device_blocks"), list):
        parts = [f"{n} {b} blocks {s:.3f} s" for n, b, s in zip(names, info["device_blocks"], info["device_seconds"])]
    else:
        rows = [h for h in model.history_ if isinstance(h.get("device_shares"), list)
                and isinstance(h.get("device_seconds"), list)]
        if not rows:
            return {"devices": ",".join(names)}
        share = [sum(h["device_shares"][k] for h in rows) / len(rows) for k in range(len(names))]
        secs = [sum(h["device_seconds"][k] for h in rows) / len(rows) for k in range(len(names))]
        parts = [f"{n} {100 * f:.0f}% of each batch {1000 * t:.1f} ms/step" for n, f, t in zip(names, share, secs)]
    return {"devices": "; ".join(parts)}


def _network_path(output: str) -> str:
    """Where a detector with ``id_labels`` writes its network: beside the model, ``M.net.wt``."""
    stem, ext = os.path.splitext(output)
    return f"{stem}.net{ext or '.wt'}"


def _id_network(model) -> str:
    """What the trained line says of a detector's id network (nothing without one)."""
    net = model.train_info_.get("id_network")
    return f"; on the embeddings of a {net['family']} of {net['values']} {net['label']} values ({net['path']})" \
        if net else ""


def _trained(model, args, recordings: int, seconds: float, where: str = "") -> str:
    """The line that says what was trained (the preset's name for a preset), on what, in how long,
    and where it was written."""
    name = args.model if args.model in preset_names() else model.name
    if model.detector:
        normal = f" ({args.label}={model.fitted_labels[0]})" if args.label else ""
        return (f"trained {name} on {counted(recordings, 'normal recording')}{normal} in {seconds:.1f} s{where}; "
                f"threshold {model.train_info_['threshold']:.4g} for {model.params['fpr']:.0%} false alarms on "
                f"{model.train_info_['threshold_on']}{_id_network(model)} -> {args.output}")
    return (f"trained {name} on {counted(recordings, 'recording')}, {counted(len(model.fitted_labels), 'value')} of "
            f"{args.label!r} ({', '.join(model.fitted_labels)}) in {seconds:.1f} s{where} -> {args.output}")
