"""``wavetrain demo``: synthetic machine sounds -> cross-validate -> train -> classify; spoken words by speaker."""
from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("demo", help="generate synthetic machine sounds, then evaluate, train and classify",
                       description="Generates healthy / bearing-fault / loose-part machine recordings at several "
                                   "speeds and noise levels (DIR/machines), cross-validates a GMM grouped by "
                                   "machine, trains it and classifies a few files; then cross-validates a speech "
                                   "model by speaker on 240 spoken words shipped with wavetrain (DIR/words). Needs "
                                   "nothing but wavetrain.")
    from wavetrain.cli.common import writes

    writes(p.add_argument("-o", "--output", metavar="DIR",
                          help="where to write the data (DIR/machines, DIR/words) and the model, kept afterwards "
                               "(default: a temporary folder, removed at the end)"), "folder")
    p.add_argument("--overwrite", action="store_true",
                   help="write into DIR although it is not empty (the demo's files are replaced)")
    from wavetrain.models.registry import DEFAULT_MODEL

    p.add_argument("--model", default=DEFAULT_MODEL, metavar="SPEC",
                   help=f"model spec to use (default {DEFAULT_MODEL})")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.output is not None:
        return _run(args, args.output)
    with tempfile.TemporaryDirectory(prefix="wavetrain-demo-") as tmp:
        return _run(args, tmp)


def _run(args, folder: str) -> int:
    """The demo, writing into ``folder`` (a temporary one without ``-o``)."""
    from wavetrain.cli.common import counted, guard_outputs
    from wavetrain.core.outputs import OutputError, check_output_folder, make_folder
    from wavetrain.core.progress import progress_enabled
    from wavetrain.data import load_dataset
    from wavetrain.data.demo import WORDS, copy_demo_words, make_demo_dataset
    from wavetrain.evaluation.metrics import format_report
    from wavetrain.models.modelfile import load_model, save_model
    from wavetrain.models.registry import SPEECH_MODEL
    from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, prediction_stream, train_model
    from wavetrain.pipeline.prediction import predict
    from wavetrain.store import FeatureStore

    out = Path(folder)
    if args.output is not None:
        check_output_folder(folder)
        guard_outputs(args, inputs=[WORDS])     # (the words it copies)
        if out.is_dir() and any(out.iterdir()) and not args.overwrite:
            raise OutputError(f"-o {folder}: folder exists and is not empty; add --overwrite to write the demo into "
                              "it (its machines/, words/, cache/ and machine-state.wt are replaced)")
        out.mkdir(parents=True, exist_ok=True)
    for sub in ("machines", "words", "cache"):      # never a link planted there
        make_folder(out / sub, below=out)
    t0 = time.perf_counter()
    csv = make_demo_dataset(out / "machines")
    words_csv = copy_demo_words(out / "words")
    ds = load_dataset(csv)
    print(f"1. generated {counted(len(ds), 'recording')} ({sum(r.duration_s for r in ds):.0f} s of audio) of "
          f"healthy / bearing / loose machines in {out / 'machines'} ({time.perf_counter() - t0:.1f} s)")
    opts = RunOptions(store=FeatureStore(out / "cache"), progress=progress_enabled(None), group_by="machine")
    t1 = time.perf_counter()
    res = evaluate_kfold(ds, "state", args.model, None, opts, folds=4)
    print(f"2. 4-fold cross-validation of '{args.model}', folds grouped by machine "
          f"({time.perf_counter() - t1:.1f} s):")
    print("   " + format_report(res, show_cm=True).replace("\n", "\n   "))
    t2 = time.perf_counter()
    model, _ = train_model(ds, "state", args.model, None, opts)
    path = save_model(model, out / "machine-state.wt")
    print(f"3. trained on all {len(ds)} recordings in {time.perf_counter() - t2:.1f} s -> {path}")
    model = load_model(path)
    one_each = {r.labels["state"]: r.path for r in reversed(ds.recordings)}  # one recording per state
    sample = load_dataset(sorted(one_each.values()))
    print(f"4. wavetrain classify -m machine-state.wt <{len(one_each)} files>:")
    for p in predict(model, prediction_stream(model, sample, opts)):
        print(f"   {p.name}[{p.start_ms}-{p.end_ms}]: {p.describe('state')}")
    words = load_dataset(words_csv)
    t3 = time.perf_counter()
    res = evaluate_kfold(words, "word", SPEECH_MODEL, None, replace(opts, group_by="speaker"), folds=4)
    print(f"5. {len(words)} spoken words of {len(set(words.values('speaker')))} voices in {out / 'words'}: 4-fold "
          f"cross-validation of '{SPEECH_MODEL}' by speaker, so no voice is in both training and test "
          f"({time.perf_counter() - t3:.1f} s): accuracy {res['accuracy']:.3f}")
    if args.output is None:
        print(f"done in {time.perf_counter() - t0:.1f} s; the temporary folder is removed. To keep the data and the "
              "model: wavetrain demo -o DIR")
    else:
        print(f"done in {time.perf_counter() - t0:.1f} s. Try: wavetrain evaluate --data {out / 'words'} --label word "
              f"--model {SPEECH_MODEL} --folds 4 --group-by speaker --plot words-cm.png")
    sys.stdout.flush()
    return 0
