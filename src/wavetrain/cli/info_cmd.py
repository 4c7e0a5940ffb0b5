"""``wavetrain info`` (a data set or a model file) and ``wavetrain models`` (built-in specs)."""
from __future__ import annotations

import json
from typing import Any


def register(sub) -> None:
    p = sub.add_parser("info", help="describe a data set (labels, counts, durations) or a model file")
    from wavetrain.cli.common import reads

    reads(p.add_argument("path", nargs="+", metavar="PATH",
                         help="data set (metadata.csv, folder, files), a .wt model or an .onnx graph"), "data")
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable recordings")
    p.add_argument("--all", action="store_true",
                   help="list every value of every label (default: labels with many values are summarised)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_info)
    m = sub.add_parser("models", help="list the built-in model specs; with a NAME, its every parameter, default and "
                                      "meaning")
    m.add_argument("name", nargs="?", help="show this model's parameters and capability tags")
    m.add_argument("--json", action="store_true", help="print a JSON list")
    m.set_defaults(func=run_models)


def _fmt_s(s: float) -> str:
    h, rem = divmod(s, 3600)
    mi, sec = divmod(rem, 60)
    return f"{int(h)}:{int(mi):02d}:{sec:04.1f}" if h else f"{int(mi)}:{sec:04.1f}"


def _is_model_file(path: str) -> bool:
    import os
    import zipfile

    if path.endswith(".wt"):
        return True
    return not path.endswith(".csv") and os.path.isfile(path) and zipfile.is_zipfile(path)


def run_info(args) -> int:
    import os

    from wavetrain.core.inputs import check_input_file

    for path in args.path:     # a named pipe or a device is never opened (reading one blocks)
        if os.path.lexists(path):
            check_input_file(path, "data set, model file or graph", folder_ok=True)
    if len(args.path) == 1 and args.path[0].lower().endswith(".onnx"):
        return _onnx_info(args.path[0], args.json)
    if len(args.path) == 1 and _is_model_file(args.path[0]):
        from wavetrain.models.modelfile import describe_model

        meta, weights = describe_model(args.path[0])   # what classify accepts; else its one-line error
        if args.json:
            print(json.dumps({**meta, "weights": {k: list(v.shape) for k, v in weights.items()}}))
            return 0
        print(f"model      {_titled(meta.get('preset'), meta['model'])}   (file format {meta['format_version']}, "
              f"created {meta.get('created')})")
        print(f"label      {meta.get('label_name')}: {', '.join(meta['labels'])}")
        print(f"features   {meta['params'].get('features')}   ({meta.get('feature_dim')} per frame)")
        if meta.get("feature_rate"):
            layout = f", {meta['channels']} channels per axis" if meta.get("channels") else ""
            print(f"input      {meta['feature_rate']} Hz{layout} (other rates are resampled to it)")
        for k, v in meta["params"].items():
            if k != "features":
                print(f"  {k} = {v if v != '' else '(none)'}")
        n = sum(int(v.size) for v in weights.values())
        print(f"weights    {len(weights)} arrays, {n:,} values")
        if meta.get("training"):
            print("training   " + ", ".join(f"{k}={v}" for k, v in meta["training"].items()))
        if "group_shifts" in weights:                # (a detector scoring by group: normalize_by)
            keys = json.loads(weights["group_values"].tobytes().decode())
            print(f"groups     shifts by {meta['params'].get('normalize_by')}: " + ", ".join(
                f"{'/'.join(k)} {v:+.4g}" for k, v in zip(keys, weights["group_shifts"].tolist(), strict=True)))
        for step in meta.get("adapted") or []:      # (wavetrain adapt: new normal recordings learnt)
            print("adapted    " + ", ".join(f"{k}={v}" for k, v in step.items()))
        print("versions   " + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()))
        return 0
    from wavetrain.core.progress import progress_enabled
    from wavetrain.data import load_dataset
    from wavetrain.data.splits import duplicate_groups

    ds = load_dataset(args.path, skip_bad=args.skip_bad, progress=progress_enabled(None))
    s = ds.summary()
    s["skipped"] = [{"recording": r.name, "error": e} for r, e in ds.skipped]
    dups = duplicate_groups(ds)
    s["duplicates"] = [[str(ds[i].path) + (f"[{ds[i].segment_ms[0]}-{ds[i].segment_ms[1]}]"
                                           if ds[i].segment_ms else "") for i in g] for g in dups]
    if args.json:
        print(json.dumps(s))
        return 0
    from wavetrain.cli.common import counted

    rates = s["rates"]
    at = (f" at {next(iter(rates))} Hz" if len(rates) == 1 else
          " at " + ", ".join(f"{r} Hz ({n})" for r, n in rates.items()) if rates else "")
    print(f"{counted(s['recordings'], 'recording')}, {_fmt_s(s['seconds'])} of audio{at}  ({ds.root})")
    for label, values in s["labels"].items():
        on = s["labelled"][label]
        some = "" if on == s["recordings"] else f", on {on} of the {s['recordings']} recordings"
        print(f"label {label}: {len(values)} values{some}")
        for line in _value_lines(values, show_all=args.all):
            print("  " + line)
    if dups:
        n = sum(len(g) for g in dups)
        conflicting = sum(len({tuple(sorted(ds[i].labels.items())) for i in g}) > 1 for g in dups)
        print(f"duplicates: {n} recordings hold the same audio as another ({len(dups)} groups"
              + (f", {conflicting} of them with different labels" if conflicting else "")
              + "); k-fold evaluation keeps each group in one fold:")
        for g in dups[:DUPLICATES_SHOWN]:
            print("  " + " = ".join(ds[i].name for i in g))
        if len(dups) > DUPLICATES_SHOWN:
            print(f"  ... and {len(dups) - DUPLICATES_SHOWN} more groups (--json lists all)")
    if ds.skipped:
        print(f"skipped {len(ds.skipped)} bad recordings:")
        for _rec, e in ds.skipped:
            print(f"  {e}")
    return 0


#: Labels with more values than this are summarised (all with --all).
VALUES_SHOWN = 12
DUPLICATES_SHOWN = 5


def _number(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def _value_lines(values: dict, *, show_all: bool) -> list[str]:
    """One line per value (count, duration), most frequent first; a label with many values shows
    its range when they are all numbers (speed=0.93, 1.07, ...), else the most frequent ones."""
    order = sorted(values.items(), key=lambda kv: (-kv[1]["count"], kv[0]))
    if len(order) > VALUES_SHOWN and not show_all:
        nums = [x for x in map(_number, values) if x is not None]
        if len(nums) == len(values):
            counts = sorted(e["count"] for e in values.values())
            return [f"numbers from {min(nums):g} to {max(nums):g}; {counts[0]}-{counts[-1]} recordings each "
                    "(--all lists them)"]
        shown = order[:VALUES_SHOWN - 2]
        rest = order[VALUES_SHOWN - 2:]
        w = max(len(v) for v, _ in shown)
        return ([f"{v:<{w}}  {e['count']:6d} recordings  {_fmt_s(e['seconds']):>10}" for v, e in shown]
                + [f"... and {len(rest)} more values with {sum(e['count'] for _, e in rest)} recordings "
                   "(--all lists them)"])
    w = max(len(v) for v, _ in order)
    return [f"{v:<{w}}  {e['count']:6d} recordings  {_fmt_s(e['seconds']):>10}" for v, e in order]


def _titled(preset: str | None, family: str) -> str:
    """A model's name as the user trained it: ``gmm-speech (gmm)`` for a preset, else the family."""
    return f"{preset} ({family})" if preset else family


def _onnx_info(path: str, as_json: bool) -> int:
    """``info model.onnx``: the metadata of a graph from ``wavetrain export``."""
    import os

    from wavetrain.models.modelfile import load_model

    meta = dict(load_model(path).meta_ or {})
    if as_json:
        print(json.dumps(meta))
        return 0
    print(f"graph      {_titled(meta.get('preset'), meta['family'])} exported by wavetrain "
          f"{meta.get('wavetrain_version', '?')} "
          f"({os.path.getsize(path) / 1e6:.2f} MB; from a .wt of sha256 {meta.get('model_sha256', '?')[:16]}...)")
    print(f"label      {meta.get('label_name')}: {', '.join(json.loads(meta['labels']))}")
    print(f"features   {meta['features']}")
    print(f"input      audio: float32 (n,) mono at {meta['rate']} Hz, at least {meta['min_samples']} samples")
    window = "whole recordings" if meta["clip_ms"] == "0" else (
        f"{meta['clip_ms']} ms windows ({meta['window_samples']} samples, every {meta['hop_samples']}; "
        f"pad {meta['pad']})")
    print(f"windows    {window}")
    print(f"outputs    scores ({meta['score_kind']}), best, {', '.join(json.loads(meta['outputs'])) or '-'}")
    for key in ("threshold", "unknown"):
        if key in meta:
            print(f"{key:<10} {meta[key]}")
    return 0


def run_models(args) -> int:
    from wavetrain.core.errors import SpecError
    from wavetrain.models.registry import DEFAULT_MODEL, PRESETS, family, family_names

    names = [args.name] if args.name else family_names() + list(PRESETS)
    out: list[dict[str, Any]] = []
    for n in names:
        fam, preset, summary = PRESETS.get(n, (n, {}, None))
        try:
            cls = family(fam)
        except ModuleNotFoundError as e:
            raise SpecError(f"model {n!r} needs a package that is not installed ({e.name})") from None
        out.append({"name": n, "family": fam, "summary": summary or cls.summary, "tags": cls.tags(), "parameters": [
            {"name": p.name, "default": preset.get(p.name, p.default), "allowed": p.allowed(), "doc": p.doc}
            for p in cls.param_table()]})
    if args.json:
        print(json.dumps(out))
        return 0
    if not args.name:                             # a short list first; `models NAME` for the details
        w = max(len(m["name"]) for m in out)
        for m in out:
            print(f"{m['name']:<{w}}  {m['summary']}")
        print("\n`wavetrain models NAME` lists a model's parameters (default, allowed values, meaning) and "
              "what it can do.")
        return 0
    for m in out:
        fam = f" (= {m['family']} with other defaults)" if m["family"] != m["name"] else ""
        print(f"{m['name']}{fam}: {m['summary']}")
        print(f"  {_tag_line(m['tags'])}")
        w = max(len(p["name"]) for p in m["parameters"])
        for p in m["parameters"]:
            print(f"  {p['name']:<{w}}  default {p['default']!r}  ({p['allowed']})\n  {'':<{w}}  {p['doc']}")
        print()
    print(f"Set parameters with --set key=value, or in a TOML model spec: model = \"{DEFAULT_MODEL}\" plus "
          "key = value lines.")
    return 0


def _tag_line(tags: dict[str, Any]) -> str:
    """The capability tags of a family in words, e.g. ``learns by sgd; detector: no; ...``."""
    words = {"detector": "anomaly detector", "supports_distributed": "distributed ranks",
             "supports_device_groups": "device groups", "supports_checkpoints": "checkpoints",
             "mixes_batches": "mixup", "embeds": "embeds windows", "adapts_to_new": "adapts to new recordings"}
    return f"learns by {tags['learns_by']}; " + "; ".join(f"{w}: {'yes' if tags[k] else 'no'}"
                                                          for k, w in words.items())
