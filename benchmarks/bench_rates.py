"""The default ``cnn`` against the default ``gmm`` on 8 kHz speech.

``spoken-words`` and ``spoken-words-noisy`` are resampled to 8 kHz files (each recording at its own
length), then each model is cross-validated with its defaults in a fresh process with one compute
thread: ``wavetrain evaluate --model M --data D8K --label word --folds 4 --json`` (folds of random
recordings: the same speakers in training and test).

    .venv/bin/python benchmarks/bench_rates.py [--quick]

``--quick`` (or ``WAVETRAIN_BENCH_QUICK=1``): 8 speakers, 2 folds, ``cnn`` with 2 epochs; results go to
$TMPDIR/wavetrain-bench/. Writes ``benchmarks/results/rates.json``. Skips a data set that is missing.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _util  # noqa: E402

SHARED = _util.ROOT.parent / "shared" / "data"
RATE = 8000
MODELS = [("gmm", []), ("cnn", [])]


def resampled(src: Path, dst: Path, speakers: set[str] | None) -> Path:
    """A copy of the data set ``src`` with every recording resampled to :data:`RATE` (only
    ``speakers``' recordings when given)."""
    from wavetrain.core.signal import resample
    from wavetrain.data.audio import read_audio, write_audio

    dst.mkdir(parents=True, exist_ok=True)
    rows = []
    for path, labels in _util.read_csv_plain(src / "metadata.csv"):
        if speakers is not None and labels.get("speaker") not in speakers:
            continue
        x, rate = read_audio(path)
        write_audio(dst / Path(path).name, resample(x, rate, RATE), RATE)
        rows.append(f"{Path(path).name},{';'.join(f'{k}={v}' for k, v in labels.items())}\n")
    (dst / "metadata.csv").write_text("".join(rows))
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=_util.RESULTS / "rates.json")
    args = ap.parse_args()
    quick = _util.quick_mode(args.quick)
    res: dict = {"benchmark": "rates", "quick": quick, "machine": _util.machine_info(), "rate": RATE, "runs": []}
    with tempfile.TemporaryDirectory(prefix="wt-bench-rates-") as tmp:
        for name in ("spoken-words", "spoken-words-noisy"):
            src = SHARED / name
            if not (src / "metadata.csv").exists():
                continue
            speakers = None
            if quick:
                speakers = set(sorted({lab["speaker"] for _, lab in _util.read_csv_plain(src / "metadata.csv")})[:8])
            data = resampled(src, Path(tmp) / f"{name}-8k", speakers)
            for model, extra in MODELS:
                more = ["--set", "epochs=2"] if quick and model == "cnn" else []
                e = _util.run_measured(_util.wavetrain_cmd() + [
                    "evaluate", "--model", model, *extra, *more, "--data", str(data), "--label", "word",
                    "--folds", "2" if quick else "4", "--json", "--no-progress", "--cache", str(Path(tmp) / "cache")])
                r = json.loads(e["stdout"])
                res["runs"].append({"data": f"{name} at {RATE} Hz", "model": model, "accuracy": r["accuracy"],
                                    "folds": [f["accuracy"] for f in r["folds"]], "wall_s": e["wall_s"],
                                    "peak_rss_mb": e["peak_rss_mb"]})
                folds = ", ".join(f"{f['accuracy']:.3f}" for f in r["folds"])
                print(f"{name} at {RATE} Hz  {model:4s} accuracy {r['accuracy']:.4f} (folds {folds})  "
                      f"{e['wall_s']:.0f} s", flush=True)
    res["loadavg_end"] = _util.loadavg()
    out = _util.quick_out(args.out, "rates") if quick else args.out
    _util.write_json(out, res)
    print(_util.markdown_table(["data", "model", "accuracy", "wall s"],
                               [[r["data"], r["model"], r["accuracy"], r["wall_s"]] for r in res["runs"]]))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
