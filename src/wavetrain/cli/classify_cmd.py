"""``wavetrain classify``: label files or segments with a trained model."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import (
    add_engine_options,
    add_name_labels_option,
    add_store_options,
    add_where_option,
    check_engine,
    check_model,
    counted,
    engine_type,
    guard_outputs,
    int_at_least,
    load_data,
    load_model_file,
    open_engine,
    plan_run,
    reads,
    report_skipped,
    report_store,
    run_options,
    writes,
)
from wavetrain.core.errors import UserError

DESCRIPTION = """\
Print one line per window: `file[start-end]: label=value confidence=0.93` (neural models: the
model's probability of the value) or `... loglik=-41.3 margin=5.2 z=-0.4` (Gaussian mixtures: the mean frame
log-likelihood, its lead over the next value, and how many training standard deviations it lies
from that value's training windows). Inputs at another sample rate are resampled to the model's.

Output modes: --json (a JSON line per window, every value's score), --csv (a csv row per window
on stdout: file, start_ms, end_ms, value, a score:<value> column per value), --ranked (every value
with its score, best first), --compare LABEL (each window marked right, wrong or ? against the
recording's metadata value of LABEL; the accuracy at the end, on stderr with --json/--csv),
--audacity DIR (one Audacity label track per input file, DIR/<name>.txt, adjacent windows with the
same value merged), -o FILE (every window to a .parquet, .csv or .jsonl file).

Live: `wavetrain classify -m model.wt -` reads stdin: raw PCM (--rate, --format, --channels) or a
wav stream (detected from its header; an unknown data size, as arecord, sox and ffmpeg write to a
pipe, reads to the end). Each window (--clip-ms, --clip-shift-ms) is answered as soon as its last
sample arrives: `-[0-1000]: label=value ... latency_ms=2.1`, flushed at once; only the samples the
next window needs are kept. The windows are those a file of the stream gets: a stream shorter than
one window, with a model trained on whole recordings, is one window (as the file); the last partial
window is padded by the model's rule (or kept as it is for a whole-recording model). An adapting
detector (adapt=N) adapts a copy of its own for the stream. NaN or infinite float
samples and a stream without samples are errors; a wav stream shorter than its header says is
classified with a warning. Example: `arecord -f S16_LE -r 16000 | wavetrain classify -m m.wt -`.

Answers, as edge monitors give them: --smooth N answers each window from the mean of the last N
windows' scores (of the same stream or recording; at the start, of those so far); --hold MS
reports a new answer only once the windows have given it for MS ms (from the start of the first
window giving it to the start of the current one: one window alone never passes a hold), the
previous answer standing meanwhile (before any answer has held: undecided, or a detector's normal
value). --unknown answers `unknown` for windows unlike the training: off (never), trained (the
rule the model file holds, if any), auto (that rule, else the family's own: a probability model's
top probability below half-way between chance and 1, a Gaussian mixture's |z| above 4) or a LEVEL
of the family's rule (a top probability, or training sd of z). Live input defaults to auto, files
to trained. With --smooth or --hold, the scores printed are the smoothed ones and --json adds
`raw` (the window's own value and scores), `smoothed` (windows averaged) and `pending` (an answer
not held long enough yet); text lines add raw=VALUE and pending=VALUE.
"""


def register(sub) -> None:
    import argparse

    p = sub.add_parser("classify", help="classify audio files (or a live stream on stdin) with a trained model",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    reads(p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt",
                         help="trained model file (from `wavetrain train`), or a graph from `wavetrain export` "
                              "(.onnx: run by onnxruntime)"))
    reads(p.add_argument("paths", nargs="*", metavar="PATH",
                         help="audio files, folders or a metadata.csv; `-` alone: a live stream on stdin"), "data")
    reads(p.add_argument("--data", nargs="+", metavar="PATH", default=[], help="the same as PATH"), "data")
    add_name_labels_option(p)
    add_where_option(p)
    p.add_argument("--json", action="store_true", help="write JSON lines (every value's score)")
    writes(p.add_argument("-o", "--output", metavar="FILE",
                          help="write the predictions to FILE (.parquet, .csv or .jsonl: one row per window, every "
                               "value's score) instead of printing them"))
    g = p.add_argument_group("output modes")
    g.add_argument("--csv", action="store_true",
                   help="print csv rows to stdout: file, start_ms, end_ms, value, score:<value> per value")
    g.add_argument("--ranked", action="store_true", help="every value with its score, best first, per window")
    g.add_argument("--compare", metavar="LABEL",
                   help="mark each window right/wrong against the recording's metadata value of LABEL (? when "
                        "it has none) and print the accuracy at the end")
    writes(g.add_argument("--audacity", metavar="DIR",
                          help="write one Audacity label track per input file, DIR/<name>.txt (adjacent windows "
                               "with the same value merged into one label)"), "folder")
    g = p.add_argument_group("live input (PATH `-`)")
    g.add_argument("--rate", type=int, metavar="HZ", help="raw PCM sample rate (default: the model's)")
    g.add_argument("--format", dest="sample_format", default="s16le",
                   choices=("s16le", "s24le", "s32le", "f32le", "f64le", "u8"),
                   help="raw PCM sample format (default s16le)")
    g.add_argument("--channels", type=int, default=1, metavar="N",
                   help="raw PCM channels, interleaved (default 1; averaged unless the model is per-axis)")
    g.add_argument("--clip-ms", type=int, metavar="MS",
                   help="window length (default: the model's clip_ms, or 1000 when it is 0)")
    g.add_argument("--clip-shift-ms", type=int, metavar="MS",
                   help="step between window starts (default: the model's with its clip, else back to back)")
    g = p.add_argument_group("answers (live input and files)")
    g.add_argument("--smooth", type=int_at_least(1), default=1, metavar="N",
                   help="answer each window from the mean scores of the last N windows (default 1: its own)")
    g.add_argument("--hold", type=int_at_least(0), default=0, metavar="MS",
                   help="report a new answer once it has persisted MS ms; until then the previous one stands "
                        "(default 0)")
    g.add_argument("--unknown", metavar="off|trained|auto|LEVEL",
                   help="answer `unknown` for windows unlike the training: never, by the model file's own rule, "
                        "by it or the family's (auto), or by the family's at LEVEL (a top probability, or sd of "
                        "z); default: auto for live input, trained for files")
    g = p.add_argument_group("events (long recordings: where each sound is, and what it is)")
    g.add_argument("--events", nargs="?", const="", metavar="SETTINGS",
                   help="answer events instead of windows: each sound found against the background (band "
                        "energies above an adaptive floor), from its start to its end, answered by the model; "
                        "SETTINGS: name=value pairs joined by commas (on_db, off_db, min_ms, gap_ms, max_ms, "
                        "pad_ms, floor_s; detector=model with background=VALUE: a model's windows decide)")
    add_store_options(p)
    add_engine_options(p)
    p.set_defaults(func=run)


def _answer_options(args, live: bool):
    from wavetrain.pipeline.smoothing import AnswerOptions, parse_unknown

    unknown = parse_unknown(args.unknown) if args.unknown is not None else "auto" if live else "trained"
    return AnswerOptions(smooth=args.smooth, hold_ms=args.hold, unknown=unknown)


def _event_options(args):
    """The event detector's settings of ``--events`` (None without it)."""
    from wavetrain.stream.events import EventOptions

    if args.events is None:
        return None
    if args.events and "=" not in args.events and args.events.strip().lower() not in ("1", "on", "true", "yes"):
        args.paths.insert(0, args.events)   # `--events file.wav`: the file is a recording, not settings
        args.events = ""
    if args.smooth != 1 or args.hold:
        raise UserError("classify --events: each event is answered from all of its samples; --smooth and --hold "
                        "are for windows: drop them")
    if args.clip_ms is not None or args.clip_shift_ms is not None:
        raise UserError("classify --events: events are cut by the detector, not into windows; drop --clip-ms and "
                        "--clip-shift-ms")
    if args.compare:
        raise UserError("classify --events: --compare marks windows against a recording's one value; to score "
                        "events against reference segments use `wavetrain evaluate -m MODEL --data REF --events`")
    return EventOptions.parse(args.events)


def _check_modes(args, live: bool) -> None:
    if args.csv and args.json:
        raise UserError("classify: --csv and --json are two formats of the same lines; choose one")
    if args.output and (args.csv or args.ranked):
        raise UserError("classify: -o writes every value's score to a file; --csv and --ranked print to stdout: "
                        "drop -o or them")
    if live:
        if args.compare:
            raise UserError("classify -: --compare needs the recordings' metadata; a live stream has none")
        if args.where or args.labels_from_name:
            option = "--where" if args.where else "--labels-from-name"
            raise UserError(f"classify -: {option} reads the recordings' labels or file names; a live stream has "
                            f"neither: drop {option}")
        if args.audacity:
            raise UserError("classify -: --audacity writes one label track per file; for a stream, use --csv and "
                            "convert it, or record to a file first")
        if args.output:
            raise UserError("classify -: a live stream prints its answers; redirect stdout (with --json or --csv) "
                            "instead of -o")
        if not engine_type(args).live:
            raise UserError(f"classify -: a live stream is classified as it arrives, in this process; --engine "
                            f"{args.engine} does not: drop it")
    elif args.events is None and (args.rate is not None or args.clip_ms is not None or args.clip_shift_ms is not None):
        raise UserError("classify: --rate, --clip-ms and --clip-shift-ms are for a live stream (PATH `-`); files "
                        "are cut with the model's clip settings")


def run(args) -> int:
    from wavetrain.core.outputs import check_output_file, check_output_folder
    from wavetrain.pipeline.jobs import event_predictions, window_predictions
    from wavetrain.pipeline.prediction import prediction_format
    from wavetrain.pipeline.smoothing import LiveAnswers

    check_engine(args)
    events = _event_options(args)
    paths = list(args.paths) + list(args.data)
    if not paths:
        raise UserError("classify: give the recordings to classify (PATH ... or --data PATH ...), or - for a live "
                        "stream on stdin")
    live = "-" in paths
    if live and len(paths) > 1:
        raise UserError("classify: - (a live stream on stdin) is classified alone; give it without other PATHs")
    _check_modes(args, live)
    if live:
        return _run_live(args, events)
    if args.output:
        prediction_format(args.output)
        check_output_file(args.output)
    if args.audacity:
        check_output_folder(args.audacity, option="--audacity")
    model = load_model_file(args.model_file)
    check_model(args, model, training=False)
    answers = LiveAnswers(model, _answer_options(args, live=False))
    opts = run_options(args)
    ds = load_data(args, opts, paths)
    guard_outputs(args, ds)
    label = model.label_name_ or "label"
    tracks = _Tracks(args.audacity, ds) if args.audacity else None
    with open_engine(args) as engine:
        plan_run(args, ds, None, opts, engine, model=model)
        if events is not None:
            found, skipped = event_predictions(model, ds, opts, events, unknown=answers.options.unknown,
                                               engine=engine)
            _write(args, model, label, _said_none(found, ds), tracks, what="event")
        else:
            windows, skipped = window_predictions(model, ds, opts, engine=engine)
            _write(args, model, label, answers(windows), tracks)
    report_skipped(list(ds.skipped) + list(skipped))
    report_store(opts.store)
    return 0


def _said_none(events, ds):
    """The events, then a line on stderr naming the recordings in which none was found."""
    found: set = set()
    for p in events:
        found.add(id(p.recording))
        yield p
    empty = [r.name for r in ds if id(r) not in found]
    if empty:
        more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        print(f"wavetrain: no events in {', '.join(empty[:5])}{more} (silence or steady background only)",
              file=sys.stderr)


def _write(args, model, label: str, windows, tracks, *, what: str = "prediction") -> None:
    """Every window's answer, as the options say: printed (text, --json, --csv, --ranked) or
    written to -o, checked against --compare, and gathered into --audacity label tracks."""
    from wavetrain.pipeline.prediction import write_predictions

    tally = _Tally(args.compare) if args.compare else None

    def seen(preds):
        for p in preds:
            if tracks is not None:
                tracks.add(p)
            yield p

    if args.output:
        def rows():
            for p in seen(windows):
                row = p.to_json(label)
                if tally is not None:
                    row.update(tally.mark(p))
                yield row

        n = write_predictions(args.output, rows(), list(model.labels_))
        print(f"wrote {counted(n, what)} to {args.output}", file=sys.stderr)
    else:
        printer = _Printer(args, label, list(model.labels_), tally)
        for p in seen(windows):
            printer.write(p, p.file)
    if tally is not None:
        print(tally.summary(), file=sys.stderr if (args.json or args.csv or args.output) else sys.stdout)
    if tracks is not None:
        n = tracks.write()
        print(f"wrote {counted(n, 'Audacity label track')} to {args.audacity}", file=sys.stderr)


def _fmt(x: float, kind: str) -> str:
    return f"{x:.3f}" if kind == "probability" else f"{x:.4g}" if kind == "anomaly" else f"{x:.1f}"


class _Printer:
    """Writes each window as a text line, a JSON line or a csv row (with its header first)."""

    def __init__(self, args, label: str, labels: list, tally: _Tally | None, *, flush: bool = False):
        self.json, self.csv, self.ranked = args.json, args.csv, args.ranked
        self.label, self.labels, self.tally, self.flush = label, labels, tally, flush
        self.out = sys.stdout
        self._csv = None
        if self.csv:
            import csv

            self._csv = csv.writer(self.out, lineterminator="\n")
            head = ["file", "start_ms", "end_ms", "value"] + [f"score:{v}" for v in labels]
            if tally is not None:
                head += ["expected", "correct"]
            if extra := getattr(args, "_live_columns", None):
                head += extra
            self._csv.writerow(head)

    def write(self, p, file: str | None, **extra) -> None:
        mark = self.tally.mark(p) if self.tally is not None else None
        ranked = sorted(zip(p.labels, (float(x) for x in p.scores)), key=lambda t: -t[1])
        if self._csv is not None:
            row = [file, p.start_ms, p.end_ms, p.label] + [round(float(x), 6) for x in p.scores]
            if mark is not None:
                row += [mark["expected"], {True: "right", False: "wrong", None: "?"}[mark["correct"]]]
            row += list(extra.values())
            self._csv.writerow(row)
        elif self.json:
            rec = p.to_json(self.label)
            rec["file"] = file
            if self.ranked:
                rec["ranked"] = [{"value": v, "score": round(x, 6)} for v, x in ranked]
            if mark is not None:
                rec.update(mark)
            rec.update(extra)
            self.out.write(json.dumps(rec) + "\n")
        else:
            if self.ranked:
                text = f"{self.label} ranked: " + ", ".join(f"{v} {_fmt(x, p.score_kind)}" for v, x in ranked)
            else:
                text = p.describe(self.label)
            if mark is not None:
                c = mark["correct"]
                text += " ?" if c is None else " right" if c else f" wrong (expected {mark['expected']})"
            text += "".join(f" {k}={v}" for k, v in extra.items())
            self.out.write(f"{file}[{p.start_ms}-{p.end_ms}]: {text}\n")
        if self.flush:
            self.out.flush()


class _Tally:
    """--compare LABEL: each window right, wrong or unknown against its recording's value."""

    def __init__(self, label: str):
        self.label = label
        self.right = self.wrong = self.unknown = 0

    def mark(self, p) -> dict:
        expected = None if p.recording is None else p.recording.labels.get(self.label)
        if expected is None:
            self.unknown += 1
            return {"expected": None, "correct": None}
        ok = p.label == expected
        if ok:
            self.right += 1
        else:
            self.wrong += 1
        return {"expected": expected, "correct": ok}

    def summary(self) -> str:
        n = self.right + self.wrong
        without = f"; {self.unknown} window{'s' if self.unknown != 1 else ''} without a {self.label} value" \
            if self.unknown else ""
        if not n:
            return f"accuracy: no window has a {self.label} value to compare with{without}"
        return f"accuracy {self.right / n:.3f} ({self.right} of {n} windows right{without})"


class _Tracks:
    """--audacity DIR: one label track per input file, adjacent windows with one value merged."""

    def __init__(self, folder: str, ds):
        from pathlib import Path

        self.folder = Path(folder)
        self.windows: dict = {}
        names: dict = {}
        for rec in ds:
            stem = rec.path.stem
            other = names.setdefault(stem, rec.path)
            if other != rec.path:
                raise UserError(f"--audacity {folder}: {other} and {rec.path} would both write {stem}.txt; "
                                "classify them in two runs (or rename one)")
            self.windows.setdefault(rec.path, [])

    def add(self, p) -> None:
        """A window's (or an event's) answer; its times are times in the audio file (a segment
        row's windows count from the file's start)."""
        self.windows.setdefault(p.recording.path, []).append((p.start_ms, p.end_ms, p.label))

    @staticmethod
    def labels(windows: list) -> list:
        """Windows -> labels: a window covers its span up to the next window's start (when they
        overlap), and adjacent labels with the same value are merged."""
        ws = sorted(windows)
        out: list = []
        for i, (s, e, v) in enumerate(ws):
            if i + 1 < len(ws) and ws[i + 1][0] < e:
                e = max(s, ws[i + 1][0])
            if out and out[-1][2] == v and out[-1][1] >= s:
                out[-1] = (out[-1][0], max(out[-1][1], e), v)
            else:
                out.append((s, e, v))
        return out

    def write(self) -> int:
        from wavetrain.core.outputs import staged_folder
        from wavetrain.data.audacity import write_labels

        with staged_folder(self.folder, option="--audacity") as stage:
            for path, windows in self.windows.items():
                rows = [(s / 1000.0, e / 1000.0, v) for s, e, v in self.labels(windows)]
                write_labels(stage / f"{path.stem}.txt", rows)
        return len(self.windows)


def _run_live(args, events=None) -> int:
    """``classify -m MODEL -``: classify stdin window by window (or event by event) as it arrives."""
    import time

    from wavetrain.data.live import PcmFormat, open_pcm_stream
    from wavetrain.pipeline.events import event_stream
    from wavetrain.pipeline.prediction import LiveWindow, classify_stream, live_geometry
    from wavetrain.pipeline.smoothing import LiveAnswers
    from wavetrain.stream.source import check_layout

    model = load_model_file(args.model_file)
    spec = model.feature_spec
    label = model.label_name_ or "label"
    rate = args.rate if args.rate is not None else int(spec.rate or model.feature_rate_ or 16000)
    raw = PcmFormat(rate, args.sample_format, args.channels)
    target = int(spec.rate or model.feature_rate_ or rate)
    check_layout(f"--rate {rate}", rate, 1, rate=target, channels=None)   # bad settings: before reading
    if events is None:
        live_geometry(model, rate, clip_ms=args.clip_ms, shift_ms=args.clip_shift_ms)
    answers = LiveAnswers(model, _answer_options(args, live=True))
    pcm = open_pcm_stream(sys.stdin.buffer, raw, where="stdin", mono=not spec.per_axis)
    if pcm.wav and args.rate is not None and pcm.format.rate != args.rate:
        print(f"wavetrain: stdin is a wav stream at {pcm.format.rate} Hz; its header wins over --rate {args.rate}",
              file=sys.stderr)
    if pcm.wav:
        check_layout(f"stdin (a wav stream at {pcm.format.rate} Hz)", pcm.format.rate, 1, rate=target, channels=None)
    args._live_columns = ["latency_ms"]
    printer = _Printer(args, label, list(model.labels_), None, flush=True)
    if events is not None:
        found = event_stream(model, pcm, pcm.format.rate, options=events, unknown=answers.options.unknown)
    else:
        found = (LiveWindow(answers.add(w.prediction), w.arrived) for w in
                 classify_stream(model, pcm, pcm.format.rate, clip_ms=args.clip_ms, shift_ms=args.clip_shift_ms))
    try:
        for w in found:
            latency = round(1000 * (time.perf_counter() - w.arrived), 2)
            printer.write(w.prediction, "-", latency_ms=latency)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
    return 0


def _quiet_stdout() -> None:
    """After the reader of stdout has gone: point stdout at /dev/null so that the flush at exit
    does not report a broken pipe."""
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass
