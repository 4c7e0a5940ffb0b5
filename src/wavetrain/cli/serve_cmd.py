"""``wavetrain serve``: a trained model behind HTTP, with a web page at ``/``."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from wavetrain.cli.common import int_at_least, load_model_file, parse_size
from wavetrain.core.extras import MissingExtraError, install_hint


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a trained model over HTTP (POST /v1/classify, a web page at /)",
                       description="Classify uploaded audio over HTTP: POST /v1/classify takes a multipart upload "
                                   "(field `file`), an audio/wav, audio/flac or audio/ogg body, or raw PCM "
                                   "(application/octet-stream with ?sample_rate=&channels=&format=s16le|f32le), "
                                   "and options top_k, clip_ms, clip_shift_ms, smooth, hold, unknown (defaults: "
                                   "--smooth, --hold, --unknown); it answers JSON predictions "
                                   "[{label, score}], best first, per-window segments and timings; with "
                                   "events=1 (or events=SETTINGS, as classify --events) the events of the audio "
                                   "instead, each answered as a whole. GET /v1/model "
                                   "describes the model, GET /healthz answers when the server is up, and / is a "
                                   "web page to upload or record audio. Bounds: bodies (--max-bytes), windows per "
                                   "request (--max-windows), open connections (--max-connections; the oldest idle one "
                                   "makes room), --timeout for request heads and pauses in bodies, bodies over 512 KiB "
                                   "read at once (--max-uploads, --uploads-per-client) and the time a body may "
                                   "take by its size (--max-upload-time), --work-timeout for the answer; "
                                   "a Host header other than localhost, 127.0.0.1, [::1], --host or --allow-host is "
                                   "answered 421, a request from another site's page (its Origin) 403. "
                                   "Needs the serve extra: make setup-serve, or pip install 'wavetrain[serve]'.")
    from wavetrain.cli.common import reads

    reads(p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt",
                         help="trained model file (from `wavetrain train`)"))
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument("--workers", type=int_at_least(1), default=1,
                   help="threads that decode and classify, one request each (default 1)")
    p.add_argument("--queue", type=int_at_least(0), default=8,
                   help="classify requests that may wait for a worker; more are answered 503 (default 8)")
    p.add_argument("--max-bytes", default="50M", metavar="SIZE",
                   help="largest request body, e.g. 50M (default); larger ones are answered 413")
    p.add_argument("--max-windows", type=int_at_least(1), default=10_000, metavar="N",
                   help="most windows one request may cut (clip settings x duration; default 10000); more: 422")
    p.add_argument("--max-connections", type=int_at_least(1), default=100, metavar="N",
                   help="open connections (default 100); a new one closes the oldest idle one")
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="S",
                   help="seconds a connection has to send a request head, and longest pause within a body "
                        "(default 10)")
    p.add_argument("--max-uploads", type=int_at_least(1), default=None, metavar="N",
                   help="bodies over 512 KiB read at once (default 16, at most a sixth of --max-connections); "
                        "more: 503. Smaller bodies take no slot: their connections make room for new ones")
    p.add_argument("--uploads-per-client", type=int_at_least(1), default=4, metavar="N",
                   help="bodies over 512 KiB read at once from one client address (default 4); more: 429")
    p.add_argument("--max-upload-time", type=_seconds, default=120.0, metavar="S",
                   help="longest a body may take after --timeout: one of SIZE bytes must average "
                        "max(16 KiB, SIZE/S) bytes/s, else 408 (default 120)")
    p.add_argument("--work-timeout", type=_seconds, default=60.0, metavar="S",
                   help="longest time from a body's arrival to its answer; past it the request is answered 504 "
                        "and its work stopped (default 60)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host header name to answer besides localhost, 127.0.0.1, [::1] and --host "
                        "(repeatable; `*`: any); others get 421")
    g = p.add_argument_group("answers (a request's smooth=, hold=, unknown= override them)")
    g.add_argument("--smooth", type=int_at_least(1), default=1, metavar="N",
                   help="answer each window of a request from the mean scores of the last N windows (default 1, at "
                        "most 1000)")
    g.add_argument("--hold", type=int_at_least(0), default=0, metavar="MS",
                   help="report a new answer within a request once it has persisted MS ms (default 0)")
    g.add_argument("--unknown", default="auto", metavar="off|trained|auto|LEVEL",
                   help="answer `unknown` for windows unlike the training: never, by the model file's rule, by it "
                        "or the family's (auto, default), or by the family's at LEVEL")
    p.set_defaults(func=run)


def _port(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port 0 to 65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0 to 65535, got {value}")
    return value


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _allowed_hosts(host: str, extra: list[str]) -> tuple[str, ...] | None:
    """The Host names answered: loopback names, the bound address and ``--allow-host``; any
    when bound to every interface without ``--allow-host`` (the server is then reached by
    names it cannot know), or with ``--allow-host '*'``."""
    from wavetrain.serve.app import LOOPBACK_HOSTS

    if "*" in extra or (host in ("0.0.0.0", "::", "") and not extra):
        return None
    return tuple(dict.fromkeys([*LOOPBACK_HOSTS, host, *extra]))


def run(args) -> int:
    try:
        import uvicorn  # noqa: F401  (the serve extra)

        from wavetrain.serve import ModelService, ServeConfig, create_app
        from wavetrain.serve.inference import file_sha256
        from wavetrain.serve.protocol import bind_socket, uvicorn_server
    except ImportError as e:
        raise MissingExtraError(f"wavetrain serve needs {e.name}: {install_hint('serve')}", extra="serve",
                                module=e.name) from None
    from wavetrain.cli.common import human_size

    uploads = args.max_uploads or max(1, min(16, args.max_connections // 6))
    config = ServeConfig(max_bytes=parse_size(args.max_bytes, "--max-bytes"), workers=args.workers,
                         queue=args.queue, max_windows=args.max_windows, max_connections=args.max_connections,
                         read_timeout_s=args.timeout, header_timeout_s=args.timeout, max_uploads=uploads,
                         max_uploads_per_client=args.uploads_per_client, max_upload_s=args.max_upload_time,
                         work_timeout_s=args.work_timeout, allowed_hosts=_allowed_hosts(args.host, args.allow_host))
    from wavetrain.pipeline.smoothing import AnswerOptions, describe_rule, parse_unknown, unknown_rule

    answers = AnswerOptions(smooth=args.smooth, hold_ms=args.hold, unknown=parse_unknown(args.unknown))
    model = load_model_file(args.model_file)
    service = ModelService(model, model_id=Path(args.model_file).name, sha256=file_sha256(args.model_file),
                           answers=answers)
    app = create_app(service, config)
    sock = bind_socket(args.host, args.port)
    port = sock.getsockname()[1]
    verbose = logging.getLogger().isEnabledFor(logging.DEBUG) or getattr(args, "verbose", False)
    peak = service.peak_bytes(max_bytes=config.max_bytes, max_samples=config.max_samples)
    total = config.workers * peak + config.queue * config.max_bytes
    host = f"[{args.host}]" if ":" in args.host else args.host
    hosts = "any Host header" if config.allowed_hosts is None else "Host " + ", ".join(config.allowed_hosts)
    print(f"serving {service.model_id} ({model.name}, {len(service.labels)} value(s) of "
          f"{model.label_name_ or 'label'}) on http://{host}:{port}/ — workers {config.workers}, "
          f"queue {config.queue}, max body {human_size(config.max_bytes)}: peak memory about {human_size(peak)} per "
          f"worker, {human_size(total)} with the queue full; {config.max_connections} connections, "
          f"{config.max_uploads} uploads, {args.timeout:g} s timeouts, {args.work_timeout:g} s to answer, {hosts}; "
          f"answers: smooth {answers.smooth}, hold {answers.hold_ms} ms, "
          f"unknown {describe_rule(unknown_rule(model, answers.unknown))}; Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        uvicorn_server(app, config, log_level="info" if verbose else "warning",
                       access_log=bool(verbose)).run(sockets=[sock])
    finally:
        sock.close()
    return 0
