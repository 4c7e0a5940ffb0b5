"""``wavetrain sound <tool>``: make data sets from data sets (partition, cut, splice, augment,
label, group, from-audacity, to-audacity); each writes a metadata.csv. The work is done in
:mod:`wavetrain.sound`, imported when a tool runs so that ``--help`` stays fast."""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from wavetrain.cli.common import (
    add_name_labels_option,
    add_store_options,
    counted,
    guard_outputs,
    int_at_least,
    reads,
    where_condition,
    writes,
)
from wavetrain.core.errors import UserError

T = TypeVar("T")
TOOLS = ("partition", "cut", "splice", "augment", "label", "group", "from-audacity", "to-audacity")


def register(sub) -> None:
    p = sub.add_parser("sound", help="make data sets from data sets: partition, cut, splice, augment, label, "
                                     "group, from-audacity, to-audacity",
                       description="Tools that write data sets (metadata.csv files). Outputs are never replaced "
                                   "without --overwrite.")
    tools = p.add_subparsers(dest="tool", metavar="TOOL")
    p.set_defaults(func=_no_tool)

    t = tools.add_parser("partition", help="stratified train/test (or N parts) split of whole groups",
                         description="Split a data set into train/test (--ratio) or N parts (--parts), with "
                                     "every value of --label in each part in its overall share (stratified), "
                                     "whole groups (--group-by, else audio files) on one side and identical "
                                     "audio never on two. Writes DIR/train and DIR/test (or DIR/part1...) "
                                     "metadata.csv files that reference the original audio by relative path.")
    _data(t, label=True)
    how = t.add_mutually_exclusive_group()
    how.add_argument("--parts", type=int_at_least(2), help="number of parts (default 2 when --ratio is not given)")
    how.add_argument("--ratio", type=float, help="share of each value in train (e.g. 0.8): writes train and test")
    t.add_argument("--group-by", metavar="LABEL", help="keep recordings with one value of this label (or tag) "
                                                       "together, e.g. speaker")
    t.add_argument("--balance", action="store_true", help="downsample each part to equal counts per value")
    t.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    _out(t, "DIR")
    t.set_defaults(func=_partition)

    t = tools.add_parser("cut", help="cut recordings into fixed-length clips (wav files + metadata.csv)",
                         description="Cut every recording into clips of --clip-ms (a last, shorter clip is "
                                     "dropped), written as wav files into DIR with a metadata.csv that carries "
                                     "the labels and the source file and offset as tags.")
    _data(t)
    t.add_argument("--clip-ms", type=int_at_least(1), required=True, help="clip length in ms")
    t.add_argument("--clip-shift-ms", type=int_at_least(1), help="step between clip starts (default: --clip-ms)")
    _out(t, "DIR")
    t.set_defaults(func=_cut)

    t = tools.add_parser("splice", help="concatenate recordings into one wav with segment rows",
                         description="Concatenate recordings (mono, resampled to one rate) with gaps of silence "
                                     "into OUT.wav; writes OUT.csv (metadata rows: one segment OUT.wav[start-end] "
                                     "per recording, a data set for --data) and an Audacity label track OUT.txt. "
                                     "Gaps and pads are a fixed number of ms or a LO:HI range each one is drawn "
                                     "from; --noise lays a background over the whole file. A missing folder of "
                                     "OUT is created.")
    _data(t)
    t.add_argument("--gap-ms", metavar="MS[:MS]", default="1000",
                   help="silence between recordings in whole ms, or a LO:HI range each gap is drawn from "
                        "(default 1000)")
    t.add_argument("--pad-ms", metavar="MS[:MS]", default="0",
                   help="silence before the first and after the last recording, fixed or drawn from LO:HI "
                        "(default 0)")
    t.add_argument("--gap-label", metavar="VALUE", help="give gaps (and pads) rows too: NAME=VALUE[;NAME=VALUE], "
                                                        "or a bare VALUE for every label name of the data set")
    t.add_argument("--noise", metavar="SNR_LO:SNR_HI",
                   help="background noise over the whole file at an SNR in dB drawn once (e.g. 5:20; "
                        "--noise=-5:5 for negative values), against the recordings' mean power")
    t.add_argument("--noise-color", metavar="C[,C...]",
                   help="colour of --noise: white, pink, brown, hum or babble; several joined by commas are "
                        "summed at equal power (default white)")
    t.add_argument("--shuffle", action="store_true", help="random order (default: data set order)")
    t.add_argument("--seed", type=int_at_least(0), default=0,
                   help="random seed of --shuffle, the gap and pad ranges and --noise (default 0)")
    t.add_argument("--rate", type=int_at_least(1), help="sample rate (default: the highest of the recordings)")
    _out(t, "OUT.wav")
    t.set_defaults(func=_splice)

    t = tools.add_parser("augment", help="augmented copies (noise, gain, frequency shift, speed, pitch, reverb, "
                                         "mix)",
                         description="Write --copies augmented copies of each recording; every given "
                                     "augmentation is applied to every copy with its parameter drawn from its "
                                     "LO:HI range (a single number: fixed), reproducibly from --seed. Labels are "
                                     "carried over; what was done is recorded as tags.")
    _data(t)
    t.add_argument("--noise", metavar="SNR_LO:SNR_HI", help="add noise at this SNR in dB (e.g. 5:20)")
    t.add_argument("--noise-color", choices=("white", "pink", "brown", "hum", "babble", "any"), default="white",
                   help="noise colour (default white; any: one per copy)")
    t.add_argument("--gain", metavar="DB_LO:DB_HI", help="scale by this gain in dB (e.g. -6:6)")
    t.add_argument("--shift-hz", metavar="HZ_LO:HZ_HI", help="shift every frequency by this many Hz "
                                                             "(single-sideband, e.g. -50:50)")
    t.add_argument("--speed", metavar="LO:HI", help="play faster/slower by this factor (e.g. 0.9:1.1)")
    t.add_argument("--pitch", metavar="SEMI_LO:SEMI_HI", help="shift the pitch by semitones keeping the duration "
                                                              "(e.g. -2:2)")
    t.add_argument("--reverb", metavar="RT60_LO:RT60_HI", help="synthetic room reverb with this RT60 in "
                                                               "seconds (e.g. 0.2:0.8)")
    reads(t.add_argument("--mix", metavar="DATA[:SNR_LO:SNR_HI]", help="mix with a random recording of another "
                                                                         "data set at this SNR in dB (default 10)"),
          "data")
    t.add_argument("--copies", type=int_at_least(1), default=1, help="copies per recording (default 1)")
    t.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    _out(t, "DIR")
    t.set_defaults(func=_augment)

    t = tools.add_parser("label", help="classify recordings and write the answers as segment rows",
                         description="Classify every window with a trained model and write a metadata.csv of "
                                     "segment rows file[start-end],LABEL=VALUE; adjacent windows with the same "
                                     "value are merged into one segment. Each recording's windows are answered "
                                     "as a live stream's: --smooth N (mean scores of the last N windows), --hold "
                                     "MS (a new answer once it has persisted MS ms; before the first, undecided) "
                                     "and --unknown (windows unlike the training are `unknown`; default auto: "
                                     "the model's rule, else its family's).")
    reads(t.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt", help="trained model file"))
    _data(t, store=False)
    t.add_argument("--min-confidence", type=float, metavar="P", help="drop windows whose probability is below P "
                                                                     "(models that answer probabilities)")
    t.add_argument("--clip-ms", type=int_at_least(1), help="window length in ms (default: the model's)")
    t.add_argument("--clip-shift-ms", type=int_at_least(1), help="step between windows in ms (default: the "
                                                                 "model's)")
    t.add_argument("--smooth", type=int_at_least(1), default=1, metavar="N",
                   help="answer each window from the mean scores of the last N windows of its recording (default 1)")
    t.add_argument("--hold", type=int_at_least(0), default=0, metavar="MS",
                   help="a new answer once it has persisted MS ms of the recording; the previous one meanwhile "
                        "(default 0)")
    t.add_argument("--unknown", default="auto", metavar="off|trained|auto|LEVEL",
                   help="answer `unknown` for windows unlike the training: never, by the model file's rule, by it "
                        "or the family's (auto, default), or by the family's at LEVEL (a top probability, or sd "
                        "of z)")
    t.add_argument("--events", nargs="?", const="", metavar="SETTINGS",
                   help="one row per event instead of per run of windows: each sound found against the "
                        "background, from its start to its end, answered by the model (SETTINGS as classify "
                        "--events: name=value pairs joined by commas); also writes an Audacity label track per "
                        "audio file beside the csv (OUT.txt, or OUT.<name>.txt for several files)")
    _out(t, "metadata.csv")
    add_store_options(t)
    t.set_defaults(func=_label)

    t = tools.add_parser("group", help="a folder per label value, each with a metadata.csv",
                         description="Write DIR/<value>/metadata.csv for every value of --label (paths relative "
                                     "to it), or copies of the audio with --copy.")
    _data(t, label=True)
    t.add_argument("--copy", action="store_true", help="copy the audio files into the folders")
    _out(t, "DIR")
    t.set_defaults(func=_group)

    t = tools.add_parser("from-audacity", help="an Audacity label track as metadata segment rows",
                         description="Read an Audacity label track (start, end, text in seconds) of one wav "
                                     "file and write a metadata.csv of its segments; a text of name=value pairs "
                                     "gives those labels, any other text is the value of --label.")
    reads(t.add_argument("labels_txt", metavar="LABELS.txt", help="Audacity label track (File > Export > Labels)"))
    reads(t.add_argument("--wav", required=True, metavar="FILE", help="the audio file the labels belong to"))
    t.add_argument("--label", metavar="NAME", help="label name for texts that are bare values, e.g. state")
    _out(t, "metadata.csv")
    t.set_defaults(func=_from_audacity)

    t = tools.add_parser("to-audacity", help="metadata rows as Audacity label tracks, one per audio file",
                         description="Write DIR/<audio stem>.txt for every audio file of the data set: one "
                                     "label per row (segment rows; a whole-file row spans the file).")
    _data(t)
    t.add_argument("--label", metavar="NAME", help="write this label's value (default: every label as "
                                                   "name=value;...)")
    _out(t, "DIR")
    t.set_defaults(func=_to_audacity)


def _data(p, *, label: bool = False, store: bool = True) -> None:
    reads(p.add_argument("--data", required=True, nargs="+", metavar="PATH",
                         help="metadata.csv, a folder with one, a folder of class sub-folders, or audio files"),
          "data")
    add_name_labels_option(p)
    p.add_argument("--where", metavar="LABEL=VALUE[,VALUE]", action="append", default=[], type=where_condition,
                   help="keep only the recordings whose LABEL has one of these values (repeatable)")
    if label:
        p.add_argument("--label", required=True, metavar="NAME", help="the label, e.g. word")
    if store:       # (label has these among the feature store options)
        p.add_argument("--skip-bad", action="store_true", help="skip unreadable recordings and report how many")
        p.add_argument("--progress", dest="progress", action="store_true", default=None, help="force progress bars")
        p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def _out(p, what: str) -> None:
    writes(p.add_argument("-o", "--output", required=True, metavar=what, help=f"output ({what})"),
           "folder" if what == "DIR" else "file")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")


def _no_tool(args) -> int:
    raise UserError(f"sound: give a tool: {', '.join(TOOLS)} (see `wavetrain sound --help`)")


def _load(args):
    from wavetrain.core.progress import progress_enabled
    from wavetrain.data import load_dataset
    from wavetrain.sound.common import require

    ds = load_dataset(args.data, skip_bad=args.skip_bad, progress=progress_enabled(args.progress), where=args.where,
                      labels_from_name=args.labels_from_name)
    _report_skipped(ds.skipped)
    return require(ds, "--data")


def _report_skipped(skipped) -> None:
    from wavetrain.cli.common import report_skipped

    report_skipped(list(skipped))


def _partition(args) -> int:
    from wavetrain.sound.partition import partition, remove_stale_parts, write_partition

    if args.ratio is not None and not 0 < args.ratio < 1:
        raise UserError(f"--ratio {args.ratio}: expected a fraction between 0 and 1 (e.g. 0.8)")
    _check_folder(args)
    ds = _load(args)
    parts = None if args.ratio is not None else (args.parts or 2)
    p = partition(ds, args.label, parts=parts, ratio=args.ratio, group_by=args.group_by, balance=args.balance,
                  seed=args.seed)
    guard_outputs(args, ds)
    out, _ = _write_folder(args, lambda stage: write_partition(p, stage))
    if args.overwrite:
        remove_stale_parts(out, p)
    print(p.summary() + f"; written to {out}")
    return 0


def _cut(args) -> int:
    from wavetrain.core.progress import progress_enabled
    from wavetrain.sound.cut import cut

    _check_folder(args)
    ds = _load(args)
    guard_outputs(args, ds)
    out, res = _write_folder(args, lambda stage: cut(ds, stage, args.clip_ms, args.clip_shift_ms,
                                                     progress=progress_enabled(args.progress)))
    short = f"; {res.too_short} shorter than {args.clip_ms} ms gave none" if res.too_short else ""
    print(f"cut: {counted(res.clips, 'clip')} of {args.clip_ms} ms from {counted(res.recordings, 'recording')}{short}; "
          f"written to {out / 'metadata.csv'}")
    return 0


def _check_folder(args) -> None:
    """Check the output folder before reading anything: writable, and empty unless --overwrite."""
    from wavetrain.core.outputs import OutputError, check_output_folder

    p = check_output_folder(args.output)
    if p.is_dir() and any(p.iterdir()) and not args.overwrite:
        raise OutputError(f"-o {args.output}: folder exists and is not empty; add --overwrite to write into it "
                          "(files of the same names are replaced)")


def _write_folder(args, write: Callable[[Path], T]) -> tuple[Path, T]:
    """Run ``write(folder)`` into a new folder beside ``-o`` and move what it wrote into place
    at the end (:func:`wavetrain.core.outputs.staged_folder`): an error or a full disk leaves no
    partial output, and a link planted at a sub-folder of ``-o`` is refused. Returns ``-o`` and
    what ``write`` returned."""
    from wavetrain.core.outputs import staged_folder

    out = Path(args.output)
    with staged_folder(out) as stage:
        result = write(stage)
    return out, result


def _splice(args) -> int:
    from wavetrain.core.progress import progress_enabled
    from wavetrain.data.metadata import parse_pairs
    from wavetrain.sound.common import check_labels, parse_range, prepare_files
    from wavetrain.sound.splice import NOISE_SNR_DB, check_rate, parse_colors, parse_ms, splice

    if args.rate is not None:
        check_rate(args.rate)
    gap_ms, pad_ms = parse_ms(args.gap_ms, "--gap-ms"), parse_ms(args.pad_ms, "--pad-ms")
    if args.noise_color is not None and args.noise is None:
        raise UserError(f"--noise-color {args.noise_color}: needs --noise SNR_LO:SNR_HI (the background's SNR in dB)")
    colors = parse_colors(args.noise_color or "white")
    snr = None if args.noise is None else parse_range(args.noise, "--noise", low=NOISE_SNR_DB[0],
                                                      high=NOISE_SNR_DB[1])
    wav = Path(args.output)
    if wav.suffix.lower() != ".wav":
        raise UserError(f"-o {args.output}: expected a file name ending in .wav")
    wav, csv, txt = prepare_files([wav, wav.with_suffix(".csv"), wav.with_suffix(".txt")],
                                  overwrite=args.overwrite, example="out.wav", make_folders=True)
    ds = _load(args)
    guard_outputs(args, ds, outputs=[(csv, "-o"), (txt, "-o")])
    gap = None
    if args.gap_label is not None:
        text = args.gap_label.strip()
        if not text:
            raise UserError("--gap-label: empty; expected VALUE or NAME=VALUE")
        gap = (parse_pairs(text, where="--gap-label") if "=" in text
               else {name: text for name in (ds.label_names() or ["label"])})
        check_labels(gap, "--gap-label")
    res = splice(ds, wav, csv, txt, gap_ms=gap_ms, pad_ms=pad_ms, gap_labels=gap, shuffle=args.shuffle,
                 seed=args.seed, rate=args.rate, noise_snr=snr, noise_colors=colors,
                 progress=progress_enabled(args.progress))
    background = "" if res.snr_db is None else f", {res.noise} noise at {res.snr_db:.2f} dB SNR"
    print(f"splice: {counted(len(ds), 'recording')}, {res.seconds:.1f} s at {res.rate} Hz{background}; wrote {wav}, "
          f"{csv} ({counted(len(res.rows), 'row')}) and {txt}")
    return 0


def _augment(args) -> int:
    from wavetrain.core.progress import progress_enabled
    from wavetrain.data import load_dataset
    from wavetrain.data.dataset import input_paths
    from wavetrain.sound.augment import Augmentations, augment
    from wavetrain.sound.common import parse_range

    aug = Augmentations(noise_color=args.noise_color)
    if args.noise is not None:
        aug.noise = parse_range(args.noise, "--noise", low=-30, high=120)
    if args.gain is not None:
        aug.gain = parse_range(args.gain, "--gain", low=-60, high=40)
    if args.shift_hz is not None:
        aug.shift_hz = parse_range(args.shift_hz, "--shift-hz", low=-20000, high=20000)
    if args.speed is not None:
        aug.speed = parse_range(args.speed, "--speed", low=0.25, high=4)
    if args.pitch is not None:
        aug.pitch = parse_range(args.pitch, "--pitch", low=-24, high=24)
    if args.reverb is not None:
        aug.reverb = parse_range(args.reverb, "--reverb", above=0, high=10)
    mix_path = None
    if args.mix is not None:
        mix_path, aug.mix_snr = _mix_option(args.mix)
    if not aug.any() and mix_path is None:
        raise UserError("augment: give at least one augmentation (--noise, --gain, --shift-hz, --speed, --pitch, "
                        "--reverb or --mix)")
    _check_folder(args)
    if mix_path is not None:
        aug.mix = load_dataset(mix_path)
    ds = _load(args)
    guard_outputs(args, ds, inputs=input_paths([mix_path], aug.mix) if mix_path is not None else ())
    out, n = _write_folder(args, lambda stage: augment(ds, stage, aug, copies=args.copies, seed=args.seed,
                                                       progress=progress_enabled(args.progress)))
    print(f"augment: {counted(n, 'copy', 'copies')} of {counted(len(ds), 'recording')}; written to "
          f"{out / 'metadata.csv'}")
    return 0


def _mix_option(text: str) -> tuple[str, tuple[float, float]]:
    """``DIR``, ``DIR:SNR`` or ``DIR:LO:HI`` (an existing path wins over a split)."""
    from wavetrain.sound.common import parse_range

    if Path(text).exists():
        return text, (10.0, 10.0)
    parts = text.split(":")
    for n in (2, 1):
        if len(parts) > n:
            path, snr = ":".join(parts[:-n]), ":".join(parts[-n:])
            try:
                [float(s) for s in parts[-n:]]
            except ValueError:
                continue
            if not path:
                break
            return path, parse_range(snr, "--mix SNR", low=-30, high=120)
    if Path(text.split(":")[0]).exists() or len(parts) > 1:
        raise UserError(f"--mix {text}: expected DATA[:SNR] or DATA:SNR_LO:SNR_HI (SNR in dB)")
    raise UserError(f"--mix {text}: no such file or folder; expected a data set to mix in")


def _label(args) -> int:
    from wavetrain.cli.common import load_model_file, plan_run, report_store, run_options
    from wavetrain.data import load_dataset
    from wavetrain.pipeline.engine import LocalEngine
    from wavetrain.pipeline.jobs import window_predictions
    from wavetrain.pipeline.prediction import with_windows
    from wavetrain.pipeline.smoothing import AnswerOptions, LiveAnswers, parse_unknown
    from wavetrain.sound.common import prepare_files, require
    from wavetrain.sound.label import check_confidence, merge_windows, segment_rows

    if args.events is not None:
        return _label_events(args)
    (csv,) = prepare_files([args.output], overwrite=args.overwrite, make_folders=True)   # (as partition's -o)
    model = load_model_file(args.model_file)
    check_confidence(model, args.min_confidence)
    answers = LiveAnswers(model, AnswerOptions(smooth=args.smooth, hold_ms=args.hold,
                                               unknown=parse_unknown(args.unknown)))
    model = with_windows(model, args.clip_ms, args.clip_shift_ms,      # the one windowing rule
                         options=("--clip-ms", "--clip-shift-ms"))
    opts = run_options(args)
    ds = require(load_dataset(args.data, skip_bad=args.skip_bad, progress=opts.progress, where=args.where,
                              labels_from_name=args.labels_from_name), "--data")
    guard_outputs(args, ds)
    label = model.label_name_ or "label"
    plan_run(args, ds, None, opts, LocalEngine(), model=model)
    preds, skipped = window_predictions(model, ds, opts)
    segments, dropped = merge_windows(answers(preds), args.min_confidence)
    rows = segment_rows(segments, label)
    if not rows:
        why = f" at --min-confidence {args.min_confidence}" if args.min_confidence is not None else ""
        raise UserError(f"label: no window kept{why} ({dropped} dropped); nothing written")
    from wavetrain.data.metadata import write_metadata

    write_metadata(csv, rows)
    drop = f"; {dropped} windows below --min-confidence {args.min_confidence} dropped" if dropped else ""
    print(f"label: {len(rows)} segments of {len(ds)} recordings{drop}; written to {csv}")
    _report_skipped(list(ds.skipped) + list(skipped))
    report_store(opts.store)
    return 0


def _label_events(args) -> int:
    """``sound label --events``: a segment row per event, and Audacity label tracks of them."""
    from wavetrain.cli.common import load_model_file, plan_run, report_store, run_options
    from wavetrain.data import load_dataset
    from wavetrain.data.audacity import write_labels
    from wavetrain.data.metadata import write_metadata
    from wavetrain.pipeline.engine import LocalEngine
    from wavetrain.pipeline.jobs import event_predictions
    from wavetrain.pipeline.smoothing import parse_unknown
    from wavetrain.sound.common import prepare_files, require
    from wavetrain.sound.label import check_confidence, event_rows, track_names
    from wavetrain.stream.events import EventOptions

    if args.smooth != 1 or args.hold or args.clip_ms is not None or args.clip_shift_ms is not None:
        raise UserError("label --events: each event is answered from all of its samples; --smooth, --hold, "
                        "--clip-ms and --clip-shift-ms are for windows: drop them")
    options = EventOptions.parse(args.events)
    model = load_model_file(args.model_file)
    check_confidence(model, args.min_confidence)
    unknown = parse_unknown(args.unknown)
    opts = run_options(args)
    ds = require(load_dataset(args.data, skip_bad=args.skip_bad, progress=opts.progress, where=args.where,
                              labels_from_name=args.labels_from_name), "--data")
    tracks = track_names(Path(args.output), ds)
    (csv, *txts) = prepare_files([Path(args.output)] + list(tracks.values()), overwrite=args.overwrite,
                                 make_folders=True)
    guard_outputs(args, ds, outputs=[(t, "-o") for t in txts])
    label = model.label_name_ or "label"
    plan_run(args, ds, None, opts, LocalEngine(), model=model)
    found, skipped = event_predictions(model, ds, opts, options, unknown=unknown)
    rows, dropped = event_rows(found, label, args.min_confidence)
    if not rows:
        why = f" above --min-confidence {args.min_confidence}" if args.min_confidence is not None else ""
        raise UserError(f"label --events: no events found{why} in {len(ds)} recordings (silence or steady "
                        f"background only{f'; {dropped} below it' if dropped else ''}); nothing written")
    write_metadata(csv, rows)
    for path, txt in tracks.items():
        write_labels(txt, [(r.segment_ms[0] / 1000.0, r.segment_ms[1] / 1000.0, r.labels[label])
                           for r in rows if r.path == path and r.segment_ms is not None])
    drop = f"; {dropped} below --min-confidence {args.min_confidence} dropped" if dropped else ""
    names = ", ".join(str(t) for t in tracks.values())
    print(f"label: {len(rows)} events in {len(ds)} recordings{drop}; written to {csv} and {names}")
    _report_skipped(list(ds.skipped) + list(skipped))
    report_store(opts.store)
    return 0


def _group(args) -> int:
    from wavetrain.sound.group import group, plan_groups

    _check_folder(args)
    ds = _load(args)
    ds.resolve_label(args.label)
    plan_groups(ds, args.label)
    guard_outputs(args, ds)
    out, (counts, missing) = _write_folder(args, lambda stage: group(ds, args.label, stage, copy=args.copy))
    more = f"; {missing} without a value of {args.label} left out" if missing else ""
    print(f"group: {len(counts)} folders ({sum(counts.values())} recordings){more}; written to {out}"
          + (" with copies of the audio" if args.copy else ""))
    return 0


def _from_audacity(args) -> int:
    from wavetrain.data.metadata import write_metadata
    from wavetrain.sound.audacity_io import from_audacity
    from wavetrain.sound.common import prepare_files

    (csv,) = prepare_files([args.output], overwrite=args.overwrite)
    res = from_audacity(Path(args.labels_txt), Path(args.wav), args.label)
    if not res.rows:
        raise UserError(f"{args.labels_txt}: no label with a text and a duration; nothing written")
    write_metadata(csv, res.rows)
    skipped = [f"{n} {what}" for n, what in ((res.skipped_points, "point labels"), (res.skipped_empty, "empty labels"))
               if n]
    print(f"from-audacity: {len(res.rows)} segments of {args.wav}"
          + (f" ({', '.join(skipped)} skipped)" if skipped else "") + f"; written to {csv}")
    return 0


def _to_audacity(args) -> int:
    from wavetrain.sound.audacity_io import to_audacity

    _check_folder(args)
    ds = _load(args)
    guard_outputs(args, ds)
    if args.label is not None and not any(r.labels.get(ds.resolve_label(args.label)) for r in ds):
        raise UserError(f"--label {args.label}: no row has a value for it")
    out, written = _write_folder(args, lambda stage: to_audacity(ds, stage, args.label))
    print(f"to-audacity: {counted(len(written), 'label track')} ({counted(sum(written.values()), 'label')}); "
          f"written to {out}", file=sys.stdout)
    return 0

