"""``wavetrain info`` (a data set or a model file) and ``wavetrain models`` (built-in specs)."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("info", help="describe a data set (labels, counts, durations) or a model file")
    p.add_argument("path", nargs="+", metavar="PATH", help="data set (metadata.csv, folder, files) or a .wt model")
    p.add_argument("--skip-bad", action="store_true", help="skip unreadable recordings")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_info)
    m = sub.add_parser("models", help="list the built-in model specs with every parameter, default and meaning")
    m.add_argument("name", nargs="?", help="show one model only")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=run_models)


def _fmt_s(s: float) -> str:
    h, rem = divmod(s, 3600)
    mi, sec = divmod(rem, 60)
    return f"{int(h)}:{int(mi):02d}:{sec:04.1f}" if h else f"{int(mi)}:{sec:04.1f}"


def _is_model_file(path: str) -> bool:
    import zipfile

    return path.endswith(".wt") or (zipfile.is_zipfile(path) if not path.endswith(".csv") else False)


def run_info(args) -> int:
    if len(args.path) == 1 and _is_model_file(args.path[0]):
        from wavetrain.models.modelfile import read_model_file

        meta, weights = read_model_file(args.path[0])
        if args.json:
            print(json.dumps({**meta, "weights": {k: list(v.shape) for k, v in weights.items()}}))
            return 0
        print(f"model      {meta['model']}   (file format {meta['format_version']}, created {meta.get('created')})")
        print(f"label      {meta.get('label_name')}: {', '.join(meta['labels'])}")
        print(f"features   {meta['params'].get('features')}   ({meta.get('feature_dim')} per frame)")
        for k, v in meta["params"].items():
            if k != "features":
                print(f"  {k} = {v}")
        n = sum(int(v.size) for v in weights.values())
        print(f"weights    {len(weights)} arrays, {n:,} values")
        if meta.get("training"):
            print("training   " + ", ".join(f"{k}={v}" for k, v in meta["training"].items()))
        print("versions   " + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()))
        return 0
    from wavetrain.data import load_dataset

    ds = load_dataset(args.path, skip_bad=args.skip_bad)
    s = ds.summary()
    s["skipped"] = [{"recording": r.name, "error": e} for r, e in ds.skipped]
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"{s['recordings']} recordings, {_fmt_s(s['seconds'])} of audio  ({ds.root})")
    for label, values in s["labels"].items():
        print(f"label {label}: {len(values)} values")
        w = max(len(v) for v in values)
        for v, e in sorted(values.items(), key=lambda kv: (-kv[1]["count"], kv[0])):
            print(f"  {v:<{w}}  {e['count']:6d} recordings  {_fmt_s(e['seconds']):>10}")
    if ds.skipped:
        print(f"skipped {len(ds.skipped)} bad recordings:")
        for r, e in ds.skipped:
            print(f"  {e}")
    return 0


def run_models(args) -> int:
    from wavetrain.errors import SpecError
    from wavetrain.models.registry import PRESETS, family, family_names

    names = [args.name] if args.name else family_names() + list(PRESETS)
    out = []
    for n in names:
        fam, preset, summary = PRESETS.get(n, (n, {}, None))
        try:
            cls = family(fam)
        except ModuleNotFoundError as e:
            raise SpecError(f"model {n!r} needs a package that is not installed ({e.name})") from None
        out.append({"name": n, "family": fam, "summary": summary or cls.summary, "parameters": [
            {"name": p.name, "default": preset.get(p.name, p.default), "allowed": p.allowed(), "doc": p.doc}
            for p in cls.param_table()]})
    if args.json:
        print(json.dumps(out))
        return 0
    for m in out:
        fam = f" (= {m['family']} with other defaults)" if m["family"] != m["name"] else ""
        print(f"{m['name']}{fam}: {m['summary']}")
        w = max(len(p["name"]) for p in m["parameters"])
        for p in m["parameters"]:
            print(f"  {p['name']:<{w}}  default {p['default']!r}  ({p['allowed']})\n  {'':<{w}}  {p['doc']}")
        print()
    print("Set parameters with --set key=value, or in a TOML model spec: model = \"gmm\" plus key = value lines.")
    return 0
