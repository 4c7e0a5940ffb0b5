"""``wavetrain export``: a trained model as one ONNX graph that runs wherever onnxruntime runs."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Write a trained model as one ONNX graph, feature front-end included: mono float32 samples at the
model's rate in (input `audio`, shape (n,): one clip, the whole recording for a model trained on
whole recordings), the model's scores out (output `scores`, the model's score kind; `best`, the
index of the value answered; details such as `z`, `nearest` or `agreement`). Labels, rate, window,
score kind, thresholds, the feature spec and the .wt file's sha256 are the graph's metadata.

Run it with onnxruntime alone (examples/onnx_classify.py), or check it with the commands you know:
`wavetrain classify -m model.onnx FILES` and `wavetrain serve -m model.onnx` answer through
onnxruntime, with the windows of a live stream.

--check PATH... classifies the recordings (plain audio files, folders or a metadata.csv) with the
.wt model and with the graph, before the graph is written, and reports how far the scores differ,
how often the answers agree and, where the recordings have the model's label, both accuracies (with
--quantize int8: the accuracy change of quantisation). A recording that cannot be read or decoded
stops the export with nothing written (--skip-bad: it is left out and named).
"""


def register(sub) -> None:
    p = sub.add_parser("export", help="write a trained model as one ONNX graph (features included)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    from wavetrain.cli.common import reads, writes

    reads(p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt", help="trained model file"))
    writes(p.add_argument("-o", "--output", required=True, metavar="MODEL.onnx", help="graph to write (.onnx)"))
    p.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset (17 to 20; default 17)")
    p.add_argument("--quantize", choices=("int8",), help="dynamic int8 quantisation of a network's weights")
    reads(p.add_argument("--check", nargs="+", metavar="PATH", default=[],
                         help="recordings (files, folders or a metadata.csv) to compare the graph with the model on"),
          "data")
    p.add_argument("--skip-bad", action="store_true", help="with --check: skip unreadable recordings")
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.cli.common import guard_outputs, load_model_file, report_skipped
    from wavetrain.core.graph import DEFAULT_OPSET
    from wavetrain.core.outputs import check_output_file
    from wavetrain.pipeline.export import export_model, need_export_packages

    need_export_packages()
    out = check_output_file(args.output, suffixes=(".onnx",), example="model.onnx")
    model = load_model_file(args.model_file)
    ds = None
    if args.check:              # every path and header now, every recording decoded before the graph is written
        from wavetrain.data import load_dataset

        ds = load_dataset(args.check, skip_bad=args.skip_bad)
        guard_outputs(args, ds)
    report = export_model(model, args.model_file, out, opset=args.opset or DEFAULT_OPSET, quantize=args.quantize,
                          check=ds, skip_bad=args.skip_bad)
    size = f"{report.bytes / 1e6:.2f} MB"
    if report.float_bytes is not None:
        size += f", {args.quantize} ({report.float_bytes / 1e6:.2f} MB as float)"
    print(f"wrote {out} ({model.name}, {len(model.fitted_labels)} value(s), {size}; outputs "
          f"{', '.join(report.outputs)})", file=sys.stderr)
    if report.agreement is not None:
        print(report.agreement.line(), file=sys.stderr)
        report_skipped(report.skipped)
    elif args.quantize:
        print(f"give --check PATH... (recordings with the model's label) to measure the accuracy change of "
              f"{args.quantize}", file=sys.stderr)
    return 0
