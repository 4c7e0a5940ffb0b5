"""``wavetrain serve``: a trained model behind HTTP, with a web page at ``/``."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from wavetrain.cli.common import int_at_least, load_model_file, parse_size
from wavetrain.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a trained model over HTTP (POST /v1/classify, a web page at /)",
                       description="Classify uploaded audio over HTTP: POST /v1/classify takes a multipart upload "
                                   "(field `file`), an audio/wav, audio/flac or audio/ogg body, or raw PCM "
                                   "(application/octet-stream with ?sample_rate=&channels=&format=s16le|f32le), "
                                   "and options top_k, clip_ms, clip_shift_ms; it answers JSON predictions "
                                   "[{label, score}], best first, per-window segments and timings. GET /v1/model "
                                   "describes the model, GET /healthz answers when the server is up, and / is a "
                                   "web page to upload or record audio. Needs the serve extra: "
                                   "pip install 'wavetrain[serve]'.")
    p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt",
                   help="trained model file (from `wavetrain train`)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int_at_least(0), default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument("--workers", type=int_at_least(1), default=1,
                   help="threads that decode and classify, one request each (default 1)")
    p.add_argument("--queue", type=int_at_least(0), default=8,
                   help="classify requests that may wait for a worker; more are answered 503 (default 8)")
    p.add_argument("--max-bytes", default="50M", metavar="SIZE",
                   help="largest request body, e.g. 50M (default); larger ones are answered 413")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        import uvicorn

        from wavetrain.serve import ModelService, ServeConfig, create_app
        from wavetrain.serve.inference import file_sha256
    except ImportError as e:
        raise UserError(f"wavetrain serve needs {e.name}: pip install 'wavetrain[serve]'") from None

    config = ServeConfig(max_bytes=parse_size(args.max_bytes, "--max-bytes"), workers=args.workers,
                         queue=args.queue)
    model = load_model_file(args.model_file)
    service = ModelService(model, model_id=Path(args.model_file).name, sha256=file_sha256(args.model_file))
    app = create_app(service, config)
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG) or getattr(args, "verbose", False)
    print(f"serving {service.model_id} ({model.name}, {len(service.labels)} value(s) of "
          f"{model.label_name_ or 'label'}) on http://{args.host}:{args.port}/ — workers {config.workers}, "
          f"queue {config.queue}, max body {config.max_bytes} bytes; Ctrl-C stops", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if verbose else "warning",
                access_log=bool(verbose), timeout_keep_alive=5,
                limit_concurrency=2 * (config.workers + config.queue) + 32)
    return 0
